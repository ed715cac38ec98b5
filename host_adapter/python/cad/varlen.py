"""cad.varlen: PyTorch's varlen attention signature on CAD.

    from torch.nn.attention.varlen import varlen_attn      # PyTorch
    from cad.varlen import varlen_attn                      # CAD: the same call, plus plan=

    o = varlen_attn(q, k, v, cu_seq, cu_seq, max_len, max_len, window_size=(-1, 0))            # local
    o = varlen_attn(q, k, v, cu_seq, cu_seq, max_len, max_len, window_size=(-1, 0), plan=plan)  # CAD

`varlen_attn` takes the arguments of `torch.nn.attention.varlen.varlen_attn` (torch 2.11's
`query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux, scale, window_size` and the keywords torch
2.15 added: `enable_gqa, seqused_k, block_table, num_splits`) and `plan`, and runs `cad.varlen_attn` (the
cad::varlen_fwd/varlen_bwd custom ops: autograd, torch.compile, activation checkpointing as there). What each
argument means here:

- window_size: (-1, 0) causal, (-1, -1) full attention (the default without a plan, as in PyTorch); a finite one
  is a sliding window, query i seeing keys [i - left, i + right] of its document (-1 = no limit): (left, 0) is a
  causal window (cad.varlen_attn(causal=True, window_size=(left, 0))), any other right a non-causal one. With a
  plan the mask is the plan's (cad.plan(cu, window_size=(left, 0))): leave window_size out, or give the plan's
  (another is refused naming both); CAD plans take causal windows only.
- cu_seq_q, cu_seq_k: self-attention over packed documents, so they must hold the same offsets (the same
  tensor, or equal values: checked once per tensor, not per layer). cu_seq_k=None is refused.
- max_q, max_k: accepted and checked loosely: ints, and in eager mode not below the longest document (PyTorch's
  kernels size their grids by them and compute wrong results with a smaller value; CAD needs neither). Not
  checked under torch.compile (the values are not read while tracing).
- GQA: key/value may have fewer heads than query (Hq % Hkv == 0) and are never expanded. enable_gqa is
  accepted for torch 2.15's callers and does not gate it (torch 2.11 has no such flag and accepts GQA).
- return_aux: an AuxRequest (this module's, which is torch's where torch has one); with lse=True the call
  returns (output, lse), lse [Hq, Tq] fp32, natural log, not differentiated -- as PyTorch's.
- scale: None is 1/sqrt(D); otherwise it must be > 0 (CadError naming scale).
- seqused_k, block_table (a KV cache, inference only in PyTorch too) are refused unless None; num_splits is a
  kernel hint, accepted and ignored.
- plan: None runs plain local varlen attention on the device's backend; a cad.Plan from cad.plan(cu_seq_q)
  (every rank, once per micro-batch) runs CAD across the group. The plan's mask is used: window_size, if given,
  must be the plan's.
  A plan made by cad.plan_pieces (documents cut across ranks) describes the tokens itself: cu_seq_q then only
  has to equal cu_seq_k.
"""
import operator
from typing import NamedTuple, Optional

import torch

from . import _context, _documents
from ._errors import CadError
from ._ops import varlen_attn as _cad_varlen_attn
from ._plans import Plan

try:  # torch >= 2.10: callers may hand torch's own AuxRequest; take it, so both spell the same class
    from torch.nn.attention.varlen import AuxRequest
    from torch.nn.attention import varlen as _torch_varlen
except ImportError:  # an older torch: the same named tuple
    _torch_varlen = None

    class AuxRequest(NamedTuple):
        """Which auxiliary outputs varlen_attn returns (as torch.nn.attention.varlen.AuxRequest)."""
        lse: bool = False

__all__ = ["AuxRequest", "varlen_attn", "torch_varlen_attn"]

_WHAT = "cad.varlen.varlen_attn"


class _TorchDefault(tuple):
    """window_size's default: PyTorch's (-1, -1) (equal to it, so the signature is torch's), told apart from a
    window the caller gave: with a plan, the default means the plan's mask."""


_DEFAULT_WINDOW = _TorchDefault((-1, -1))

def torch_varlen_attn():
    """PyTorch's own varlen_attn, or None where the installed torch has none (before 2.10)."""
    return getattr(_torch_varlen, "varlen_attn", None)


def _read(cu, name, plan):
    """cu's offsets, read back once per tensor (every layer passes the same) through the context that runs the
    call: the plan's, or the default one (which runs plan=None calls)."""
    context = plan.context if plan is not None else _context.default()
    return context.documents.offsets(cu, f"{_WHAT} ({name})")


def _window(window_size):
    try:
        window = tuple(operator.index(w) for w in window_size)  # ints only: a float is refused, not truncated
    except (TypeError, ValueError):
        window = None
    if window is None or len(window) != 2:
        raise CadError(f"{_WHAT}: window_size must be a pair (left, right), got {window_size!r}", "INVALID_ARGUMENT")
    # PyTorch's meaning: right == 0 is causal (nothing after the query), any other right is not; cad.varlen_attn
    # checks the limits themselves (and names window_size).
    return window[1] == 0, window


def _check_max(name, value, longest):
    try:
        value = operator.index(value)
    except TypeError:
        raise CadError(f"{_WHAT}: {name} must be an int (the longest document's length), got "
                       f"{type(value).__name__}", "INVALID_ARGUMENT") from None
    if longest is not None and value < longest:
        raise CadError(f"{_WHAT}: {name}={value} is below the longest document ({longest} tokens)", "INVALID_ARGUMENT")


def _check_documents(cu_seq_q, cu_seq_k, max_q, max_k, plan):
    """cu_seq_q == cu_seq_k and max_q/max_k not below the longest document (eager only)."""
    for name, cu in (("cu_seq_q", cu_seq_q), ("cu_seq_k", cu_seq_k)):
        if not isinstance(cu, torch.Tensor):
            raise CadError(f"{_WHAT}: {name} must be a 1-D int32 tensor [num_docs + 1], got "
                           f"{'None' if cu is None else type(cu).__name__} (CAD runs self-attention over packed "
                           f"documents: cu_seq_k = cu_seq_q)", "INVALID_ARGUMENT")
    if torch.compiler.is_compiling():  # no values while tracing; cad.varlen_attn checks cu_seq_q when it runs
        return
    q = _read(cu_seq_q, "cu_seq_q", plan)  # checked by its values, read back once (see _documents)
    lengths = [b - a for a, b in zip(q, q[1:])]
    if cu_seq_k is not cu_seq_q:
        q, k = _read(cu_seq_q, "cu_seq_q", plan), _read(cu_seq_k, "cu_seq_k", plan)
        if q != k:
            raise CadError(f"{_WHAT}: cu_seq_q {_documents.shown(q)} and cu_seq_k {_documents.shown(k)} differ; CAD "
                           f"runs self-attention over packed documents (cu_seq_k must equal cu_seq_q)",
                           "INVALID_ARGUMENT")
    longest = max(lengths, default=0)
    _check_max("max_q", max_q, longest)
    _check_max("max_k", max_k, longest)


def varlen_attn(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: Optional[torch.Tensor],
    max_q: int,
    max_k: int,
    *,
    return_aux: Optional[AuxRequest] = None,
    scale: Optional[float] = None,
    window_size: tuple[int, int] = _DEFAULT_WINDOW,
    enable_gqa: bool = False,
    seqused_k: Optional[torch.Tensor] = None,
    block_table: Optional[torch.Tensor] = None,
    num_splits: Optional[int] = None,
    plan: Optional[Plan] = None,
):
    """torch.nn.attention.varlen.varlen_attn's call on CAD (see the module doc for each argument).

    query [Tq, Hq, D], key and value [Tk, Hkv, D] (Hq % Hkv == 0), cu_seq_q = cu_seq_k int32 [N + 1].
    Returns output [Tq, Hq, D], or (output, lse [Hq, Tq] fp32) when return_aux.lse. Raises CadError.
    """
    if window_size is _DEFAULT_WINDOW and isinstance(plan, Plan):  # not given: the plan's mask
        window_size = plan.window_size
    causal, window = _window(window_size)
    for name, given in (("seqused_k", seqused_k), ("block_table", block_table)):
        if given is not None:
            raise CadError(f"{_WHAT}: {name} (a paged KV cache, inference only) is not supported; pass None",
                           "UNIMPLEMENTED")
    if scale is not None and not scale > 0:  # also refuses NaN
        raise CadError(f"{_WHAT}: scale must be greater than 0, got {scale}", "INVALID_ARGUMENT")
    if plan is not None and not isinstance(plan, Plan):
        raise CadError(f"{_WHAT}: plan must be a cad.Plan from cad.plan(...), got {type(plan).__name__}",
                       "INVALID_ARGUMENT")
    if plan is not None and plan.causal != causal:
        raise CadError(f"{_WHAT}: window_size={tuple(window_size)} is {'causal' if causal else 'full'} attention, "
                       f"but plan #{plan.id} was made with causal={plan.causal} (window_size={plan.window_size}); "
                       f"leave window_size out to take the plan's, or make the plan with cad.plan(..., "
                       f"causal={causal})", "INVALID_ARGUMENT")
    _check_documents(cu_seq_q, cu_seq_k, max_q, max_k, plan)
    # A plan from cad.plan_pieces carries the token layout itself (documents cut across ranks).
    cu_seqlens = None if plan is not None and plan.cu_seqlens is None else cu_seq_q
    want_lse = return_aux is not None and bool(return_aux.lse)
    out = _cad_varlen_attn(query, key, value, cu_seqlens, plan=plan, causal=causal, window_size=window,
                           softmax_scale=None if scale is None else float(scale), return_lse=want_lse)
    return out
