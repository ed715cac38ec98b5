"""cad.varlen_attn: varlen core attention over THD tensors as a torch custom op with autograd.

Two torch.library custom ops, cad::varlen_fwd and cad::varlen_bwd, each with a fake (meta) implementation so
that torch.compile traces through them; register_autograd joins them into one differentiable op. A plan
crosses as its integer id; the forward's saved state (the CAD servers' copy of Q/K/V/O/LSE) as a one-element
int64 key tensor that the backward hands back and releases.
"""
import ctypes as C
import itertools
import math
import weakref
from typing import Optional

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import _abi, _plan, _runtime
from ._errors import CadError
from ._tensors import Described, current_stream

_keys = itertools.count(1)
# key -> (host, saved handle or None, plan): what a CAD forward leaves for its backward. The key tensor is
# saved by autograd, so the plan lives until the backward ran (or the graph was dropped), also when a compiled
# graph holds the plan only as its id.
_saved = {}


def _release_saved(key):
    entry = _saved.pop(key, None)
    if entry is not None and entry[1]:
        entry[0].release_saved(entry[1])


# cu_seqlens tensor -> (its version, tokens, segment table, count): every layer of a step passes the same
# tensor, and reading it back from the GPU each time would synchronise the host once per layer.
_segment_tables = WeakIdKeyDictionary()  # by identity: tensors do not compare with ==


def _segments(cu_seqlens, tokens):
    """The local backend's segment table: one causal/full segment per document. Checked here, since the local
    path has no peers to agree with."""
    if cu_seqlens is None:
        raise CadError("cad.varlen_attn: cu_seqlens is required without a plan")
    cached = _segment_tables.get(cu_seqlens)
    if cached is not None and cached[0] == cu_seqlens._version and cached[1] == tokens:
        return cached[2], cached[3]
    table, n = _segment_table(cu_seqlens, tokens)
    _segment_tables[cu_seqlens] = (cu_seqlens._version, tokens, table, n)
    return table, n


def _segment_table(cu_seqlens, tokens):
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise CadError(f"cad.varlen_attn: cu_seqlens must be a 1-D int32 tensor [num_docs + 1], got "
                       f"{cu_seqlens.dtype} of shape {tuple(cu_seqlens.shape)}")
    cu = cu_seqlens.to("cpu", torch.int64).tolist()
    if not cu or cu[0] != 0 or cu[-1] != tokens or any(b < a for a, b in zip(cu, cu[1:])):
        raise CadError(f"cad.varlen_attn: cu_seqlens must rise from 0 to T = {tokens} (q's rows), got "
                       f"{cu[:4]}{'...' if len(cu) > 4 else ''} ending at {cu[-1] if cu else None}")
    n = len(cu) - 1
    table = (_abi.Segment * max(n, 1))()
    for i in range(n):
        table[i] = _abi.Segment(cu[i], cu[i + 1] - cu[i], cu[i], cu[i + 1] - cu[i])
    return table, n


def _describe_batch(args, plan, cu_seqlens, tokens):
    """Fill the batch description of forward/backward args: a plan (CAD) or a segment table (local)."""
    if plan is None:
        args.segments, args.num_segments = _segments(cu_seqlens, tokens)
        return _runtime.local_backend
    pieces, n = plan.pieces_for(cu_seqlens, _plan._rank())
    args.pieces, args.num_pieces, args.plan = pieces, n, plan.handle
    return _runtime.runtime


def _call_plan(plan_id, q, k):
    if plan_id < 0:
        return None
    plan = _plan.lookup(plan_id)
    if plan.handle is None:
        plan.make(q.shape[1], k.shape[1], q.shape[2], q.dtype, q.device)
    return plan


@torch.library.custom_op("cad::varlen_fwd", mutates_args=())
def _varlen_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: Optional[torch.Tensor], plan_id: int,
                causal: bool, softmax_scale: float, keep: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tokens, num_heads = q.shape[0], q.shape[1]
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((num_heads, tokens), dtype=torch.float32, device=q.device)
    key = torch.zeros(1, dtype=torch.int64)
    plan = _call_plan(plan_id, q, k)
    args = _abi.ForwardArgs()
    args.struct_size = C.sizeof(args)
    host = _describe_batch(args, plan, cu_seqlens, tokens)(q.device)
    tensors = [Described(t) for t in (q, k, v, o, lse)]
    args.q, args.k, args.v, args.o, args.lse = (t.ptr for t in tensors)
    args.softmax_scale = softmax_scale
    args.causal = 1 if causal else 0
    args.stream = current_stream(q.device)
    slot = C.c_void_p()
    if plan is not None and keep:
        args.saved = C.pointer(slot)
    with _runtime.timed(q.device):
        host.forward(args)
    if plan is not None:
        k_id = next(_keys)
        _saved[k_id] = (host, slot.value, plan)
        key[0] = k_id
        host.owns(weakref.finalize(key, _release_saved, k_id))  # also for a forward whose backward never comes
        plan._record_stats()
    return o, lse, key


@_varlen_fwd.register_fake
def _(q, k, v, cu_seqlens, plan_id, causal, softmax_scale, keep):
    return (q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32),
            torch.empty(1, dtype=torch.int64, device="cpu"))


@torch.library.custom_op("cad::varlen_bwd", mutates_args=())
def _varlen_bwd(d_o: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                lse: torch.Tensor, cu_seqlens: Optional[torch.Tensor], plan_id: int, saved_key: torch.Tensor,
                causal: bool, softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    d_q = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    d_k = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    d_v = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    plan = _call_plan(plan_id, q, k)
    args = _abi.BackwardArgs()
    args.struct_size = C.sizeof(args)
    host = _describe_batch(args, plan, cu_seqlens, q.shape[0])(q.device)
    tensors = [Described(t) for t in (q, k, v, o, lse, d_o, d_q, d_k, d_v)]
    args.q, args.k, args.v, args.o, args.lse, args.d_o, args.d_q, args.d_k, args.d_v = (t.ptr for t in tensors)
    args.softmax_scale = softmax_scale
    args.causal = 1 if causal else 0
    args.stream = current_stream(q.device)
    key = int(saved_key[0])
    entry = _saved.get(key)
    args.saved = entry[1] if entry is not None else None
    try:
        with _runtime.timed(q.device):
            host.backward(args)
    finally:
        _release_saved(key)
    return d_q, d_k, d_v


@_varlen_bwd.register_fake
def _(d_o, q, k, v, o, lse, cu_seqlens, plan_id, saved_key, causal, softmax_scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens, plan_id, causal, softmax_scale, keep = inputs
    o, lse, key = output
    ctx.save_for_backward(q, k, v, o, lse, key)
    ctx.cu_seqlens = cu_seqlens
    # Under torch.compile plan_id may be symbolic (a new plan per micro-batch does not recompile); the plan is
    # kept alive through the saved key (see _saved).
    ctx.plan_id, ctx.causal, ctx.softmax_scale = plan_id, causal, softmax_scale
    ctx.mark_non_differentiable(lse, key)


def _backward(ctx, d_o, d_lse, d_key):
    q, k, v, o, lse, key = ctx.saved_tensors
    d_q, d_k, d_v = _varlen_bwd(d_o.contiguous(), q, k, v, o, lse, ctx.cu_seqlens, ctx.plan_id, key, ctx.causal,
                                ctx.softmax_scale)
    return d_q, d_k, d_v, None, None, None, None, None


torch.library.register_autograd("cad::varlen_fwd", _backward, setup_context=_setup_context)


def varlen_attn(q, k, v, cu_seqlens, *, plan=None, causal=True, softmax_scale=None, return_lse=False):
    """Varlen core attention over packed documents (THD), differentiable.

    q [T, Hq, D], k and v [T, Hkv, D] (Hq % Hkv == 0), row-major contiguous, fp32 (CPU) or bf16 (CPU, CUDA);
    cu_seqlens int32 [num_docs + 1] of this rank's documents (flash_attn's convention). plan=None: plain local
    attention on the device's backend. plan=cad.plan(cu_seqlens): CAD, balanced across the group's ranks (the
    same cu_seqlens tensor; every rank calls). Returns O [T, Hq, D], and LSE [Hq, T] fp32 (natural log, not
    differentiated) when return_lse. Errors raise CadError with the plugin's message (on every rank for CAD).
    """
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)) or q.dim() != 3 or k.dim() != 3:
        raise CadError("cad.varlen_attn: q must be [T, Hq, D] and k, v [T, Hkv, D] tensors")
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if plan is not None and not isinstance(plan, _plan.Plan):
        raise CadError(f"cad.varlen_attn: plan must be a cad.Plan from cad.plan(...), got {type(plan).__name__}")
    keep = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    o, lse, _ = _varlen_fwd(q, k, v, cu_seqlens, plan.id if plan is not None else -1, bool(causal), scale, keep)
    return (o, lse) if return_lse else o
