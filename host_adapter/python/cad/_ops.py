"""cad.varlen_attn: varlen core attention over THD tensors as a torch custom op with autograd.

Two torch.library custom ops, cad::varlen_fwd and cad::varlen_bwd, each with a fake (meta) implementation so
that torch.compile traces through them; register_autograd joins them into one differentiable op. A plan
crosses as its integer id; the forward's saved state (the CAD servers' copy of Q/K/V/O/LSE) as a one-element
int64 key tensor that the backward hands back and releases.

Memory: a token's tensors are kept once. Where the servers kept a forward's Q/K/V/O/LSE (cad.init's
keep_forward_tensors), the autograd context saves no copy of q, k, v, o: it saves stand-ins of the same shape,
dtype and device that own no memory (a zero-stride expansion of one element), which activation checkpointing's
check of recomputed tensors accepts, and the backward hands the plugin its gradient buffers in their place
(CAD reads none of q/k/v/o when given saved state: plugins/cad/README.md). Otherwise the context saves them,
as local attention does, and the backward re-sends them.
"""
import ctypes as C
import itertools
import math
import operator
import weakref
from typing import Optional

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import _abi, _documents, _plan, _runtime
from ._errors import CadError
from ._tensors import Described, current_stream

_keys = itertools.count(1)
# key -> (host, saved handle or None, plan): what a CAD forward leaves for its backward. The key tensor is
# saved by autograd, so the plan lives until the backward ran (or the graph was dropped), also when a compiled
# graph holds the plan only as its id.
_saved = {}
# -> the active cad.CallOrder or None (set by _call_order): a pipeline tick whose ranks make different plans' calls
call_order = lambda: None  # noqa: E731
# plan id -> [(key in _saved, key tensor)]: the servers' state this rank kept when it made another rank's forward
# calls (cad.CallOrder), one per layer, until it makes that plan's backward calls, which run the layers in reverse
# order: the last kept goes first (see _call_order)
_served = {}


def _release_saved(key):
    entry = _saved.pop(key, None)
    if entry is not None and entry[1]:
        entry[0].release_saved(entry[1])


# cu_seqlens tensor -> (its version, tokens, segment table, count): every layer of a step passes the same
# tensor; its table is built once (_documents reads the tensor back once).
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
    cu = _documents.offsets(cu_seqlens, "cad.varlen_attn", tokens)
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
    return plan.host


def _call_plan(plan_id, q, k):
    if plan_id < 0:
        return None
    plan = _plan.lookup(plan_id)
    plan.wait()  # a plan made ahead: usually made long before its first layer
    plan.check_usable(q.device)
    if plan.handle is None:
        plan.make(q.shape[1], k.shape[1], q.shape[2], q.dtype, q.device)
    return plan


def _before_own_call(direction, plan_id):
    """Within a cad.CallOrder: make the other ranks' calls that come before this one -- before waiting for this
    call's own plan: a peer can be inside one of those calls, holding its stack while its planning thread waits
    to make this plan with ours."""
    order = call_order() if plan_id >= 0 else None
    if order is not None:
        order.before_own_call(direction, _plan.lookup(plan_id))
    return order


@torch.library.custom_op("cad::varlen_fwd", mutates_args=())
def _varlen_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: Optional[torch.Tensor], plan_id: int,
                causal: bool, softmax_scale: float, keep: bool, window_left: int,
                window_right: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tokens, num_heads = q.shape[0], q.shape[1]
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((num_heads, tokens), dtype=torch.float32, device=q.device)
    key = torch.zeros(1, dtype=torch.int64)
    order = _before_own_call("forward", plan_id)
    plan = _call_plan(plan_id, q, k)
    args = _abi.ForwardArgs()
    args.struct_size = C.sizeof(args)
    host = _describe_batch(args, plan, cu_seqlens, tokens)(q.device)
    tensors = [Described(t) for t in (q, k, v, o, lse)]
    args.q, args.k, args.v, args.o, args.lse = (t.ptr for t in tensors)
    args.softmax_scale = softmax_scale
    args.causal = 1 if causal else 0
    args.window_flags = _abi.WINDOW_GIVEN  # window_left/right are read (-1 = no limit)
    args.window_left, args.window_right = window_left, window_right
    args.stream = current_stream(q.device)
    slot = C.c_void_p()
    # keep: the caller needs a backward. Whether the servers keep this forward's tensors for it is the stack's
    # policy (cad.init), decided here at run time, where a recomputation inside a backward is visible.
    in_backward = _serving_in_backward[0]
    if in_backward is None:
        in_backward = torch._C._current_graph_task_id() != -1
    if plan is not None and keep and _runtime.keeps_forward(in_backward):
        args.saved = C.pointer(slot)
    with _runtime.timed(q.device):
        host.forward(args)
    if plan is not None:
        k_id = next(_keys)
        _saved[k_id] = (host, slot.value, plan)
        key[0] = k_id
        host.owns(weakref.finalize(key, _release_saved, k_id))  # also for a forward whose backward never comes
        plan._record_stats()
    if order is not None:
        order.after_own_call()
    return o, lse, key


@_varlen_fwd.register_fake
def _(q, k, v, cu_seqlens, plan_id, causal, softmax_scale, keep, window_left, window_right):
    return (q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32),
            torch.empty(1, dtype=torch.int64, device="cpu"))


@torch.library.custom_op("cad::varlen_bwd", mutates_args=())
def _varlen_bwd(d_o: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                lse: torch.Tensor, cu_seqlens: Optional[torch.Tensor], plan_id: int, saved_key: torch.Tensor,
                causal: bool, softmax_scale: float, window_left: int,
                window_right: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    d_q = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    d_k = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    d_v = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    order = _before_own_call("backward", plan_id)
    plan = _call_plan(plan_id, q, k)
    args = _abi.BackwardArgs()
    args.struct_size = C.sizeof(args)
    host = _describe_batch(args, plan, cu_seqlens, q.shape[0])(q.device)
    kept = _stand_in(q)
    if kept:  # the servers kept q/k/v/o: the plugin reads none of them, only their shapes
        q, k, v, o = d_q, d_k, d_v, d_o
    tensors = [Described(t) for t in (q, k, v, o, lse, d_o, d_q, d_k, d_v)]
    args.q, args.k, args.v, args.o, args.lse, args.d_o, args.d_q, args.d_k, args.d_v = (t.ptr for t in tensors)
    args.softmax_scale = softmax_scale
    args.causal = 1 if causal else 0
    args.window_flags = _abi.WINDOW_GIVEN  # window_left/right are read (-1 = no limit)
    args.window_left, args.window_right = window_left, window_right
    args.stream = current_stream(q.device)
    key = int(saved_key[0])
    entry = _saved.get(key)
    args.saved = entry[1] if entry is not None else None
    if args.saved is None and kept:
        raise CadError(f"cad.varlen_attn backward: the servers' kept state of this forward (plan #{plan.id}) is gone "
                       f"and the autograd context holds no copy of q/k/v/o to re-send; was the forward's output "
                       f"kept past a cad.init() or cad.shutdown()?", "INVALID_ARGUMENT")
    try:
        with _runtime.timed(q.device):
            host.backward(args)
    finally:
        _release_saved(key)
    if order is not None:
        order.after_own_call()
    return d_q, d_k, d_v


# ---- calls made for other ranks (cad.CallOrder): zero tokens of this rank's, this rank serving -------------------
_serving_in_backward = [None]  # a served forward: whether its owner's call runs inside a backward (None: look)


def serve_forward(q, kv, plan, causal, softmax_scale, window, in_backward):
    """Make `plan`'s forward call over no token of this rank's; keep the servers' state as the owner's call
    would (keep_forward_tensors, in_backward: the owner's is a recomputation), for this plan's backward call."""
    _serving_in_backward[0] = bool(in_backward)
    try:
        _, _, key = _varlen_fwd(q, kv, kv, plan.cu_seqlens, plan.id, causal, softmax_scale, True, *window)
    finally:
        _serving_in_backward[0] = None
    k_id = int(key[0])
    if _saved.get(k_id, (None, None))[1]:
        _served.setdefault(plan.id, []).append((k_id, key))  # (held here: the key's finalizer would release it)
    else:
        _release_saved(k_id)


def serve_backward(q, kv, plan, causal, softmax_scale, window):
    """Make `plan`'s backward call over no token of this rank's, with the servers' state its forward kept."""
    kept = _served.get(plan.id)
    k_id, key = kept.pop() if kept else (0, torch.zeros(1, dtype=torch.int64))
    lse = torch.empty((q.shape[1], 0), dtype=torch.float32, device=q.device)
    _varlen_bwd(q, q, kv, kv, q, lse, plan.cu_seqlens, plan.id, key, causal, softmax_scale, *window)


def release_served(plan_id=None):
    """Give back the state kept for other ranks' backwards (of one plan, or all of them)."""
    for pid in ([plan_id] if plan_id is not None else list(_served)):
        for k_id, _ in _served.pop(pid, []):
            _release_saved(k_id)


@_varlen_bwd.register_fake
def _(d_o, q, k, v, o, lse, cu_seqlens, plan_id, saved_key, causal, softmax_scale, window_left, window_right):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _stand_in(t):
    """A tensor that owns no memory for its shape (see the module doc): a zero-stride expansion."""
    return t.dim() > 0 and t.numel() > 1 and all(s == 0 for s in t.stride())


def _kept_on_servers(key):
    """Whether the forward that returned `key` left its tensors on the servers (eager only: under torch.compile
    the context is set up while tracing, with no plugin call behind it, and saves the tensors)."""
    try:
        from torch._subclasses.fake_tensor import is_fake
        if is_fake(key):
            return False
        entry = _saved.get(int(key[0]))
    except Exception:  # noqa: BLE001 -- a tensor that cannot be read here: save the real tensors
        return False
    return entry is not None and bool(entry[1])


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens, plan_id, causal, softmax_scale, keep, window_left, window_right = inputs
    o, lse, key = output
    if _kept_on_servers(key):
        q, k, v, o = (t.new_empty(()).expand(t.shape) for t in (q, k, v, o))
    ctx.save_for_backward(q, k, v, o, lse, key)
    ctx.cu_seqlens = cu_seqlens
    # Under torch.compile plan_id may be symbolic (a new plan per micro-batch does not recompile); the plan is
    # then kept alive through the saved key (see _saved). In eager mode the context holds the plan itself: under
    # activation checkpointing the first forward's key is dropped with its saved tensors, and the backward and
    # the recomputed forward must still find the plan that forward used.
    ctx.plan = _plan._plans.get(plan_id) if isinstance(plan_id, int) else None
    ctx.plan_id, ctx.causal, ctx.softmax_scale = plan_id, causal, softmax_scale
    ctx.window = (window_left, window_right)
    ctx.mark_non_differentiable(lse, key)


def _backward(ctx, d_o, d_lse, d_key):
    q, k, v, o, lse, key = ctx.saved_tensors
    d_q, d_k, d_v = _varlen_bwd(d_o.contiguous(), q, k, v, o, lse, ctx.cu_seqlens, ctx.plan_id, key, ctx.causal,
                                ctx.softmax_scale, *ctx.window)
    return d_q, d_k, d_v, None, None, None, None, None, None, None


torch.library.register_autograd("cad::varlen_fwd", _backward, setup_context=_setup_context)


def window_of(window_size, causal, what="cad.varlen_attn"):
    """window_size as PyTorch's (left, right), -1 = no limit, checked here so the error names the argument.
    Returns what the ABI takes: causal windows with right = -1 (a causal query sees nothing after itself)."""
    try:  # operator.index: ints (and int-like tensors' items), never a float silently truncated
        left, right = (operator.index(x) for x in window_size)
    except (TypeError, ValueError):
        raise CadError(f"{what}: window_size must be a pair (left, right) of ints, got {window_size!r}",
                       "INVALID_ARGUMENT") from None
    for name, value in (("window_size[0] (left)", left), ("window_size[1] (right)", right)):
        if value < -1:
            raise CadError(f"{what}: {name} must be -1 (no limit) or >= 0, got {value}", "INVALID_ARGUMENT")
    if causal and right > 0:
        raise CadError(f"{what}: window_size[1] (right) is {right}, but causal=True sees no key after the "
                       f"query: use -1 or 0, or causal=False", "INVALID_ARGUMENT")
    if causal:
        right = -1
    return left, right


def varlen_attn(q, k, v, cu_seqlens, *, plan=None, causal=True, window_size=(-1, -1), softmax_scale=None,
                return_lse=False):
    """Varlen core attention over packed documents (THD), differentiable.

    q [T, Hq, D], k and v [T, Hkv, D] (Hq % Hkv == 0), row-major contiguous, fp32 (CPU) or bf16 (CPU, CUDA);
    cu_seqlens int32 [num_docs + 1] of this rank's documents (flash_attn's convention). plan=None: plain local
    attention on the device's backend. plan=cad.plan(cu_seqlens): CAD, balanced across the group's ranks (the
    same cu_seqlens tensor; every rank calls). window_size=(left, right), PyTorch's meaning: a query at position
    i of its document sees keys [i - left, i + right] of that document (none after i when causal), -1 = no
    limit; causal is (-1, 0). With a plan the window must be the plan's (cad.plan(..., window_size=...));
    CAD computes causal windows only. Returns O [T, Hq, D], and LSE [Hq, T] fp32 (natural log, not
    differentiated) when return_lse. Errors raise CadError with the plugin's message (on every rank for CAD).
    """
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)) or q.dim() != 3 or k.dim() != 3:
        raise CadError("cad.varlen_attn: q must be [T, Hq, D] and k, v [T, Hkv, D] tensors")
    for name, t in (("k", k), ("v", v)) + ((("cu_seqlens", cu_seqlens),) if cu_seqlens is not None else ()):
        if t.device != q.device and not (name == "cu_seqlens" and t.device.type == "cpu"):
            raise CadError(f"cad.varlen_attn: {name} is on {t.device}, q on {q.device}: the tensors must be on one "
                           f"device (cu_seqlens may also be on the CPU)", "INVALID_ARGUMENT")
    if q.device.type == "meta":
        raise CadError("cad.varlen_attn: q, k, v are on the meta device (no data to attend over)", "INVALID_ARGUMENT")
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if plan is not None and not isinstance(plan, _plan.Plan):
        raise CadError(f"cad.varlen_attn: plan must be a cad.Plan from cad.plan(...), got {type(plan).__name__}")
    window_left, window_right = window_of(window_size, bool(causal))
    keep = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    o, lse, _ = _varlen_fwd(q, k, v, cu_seqlens, plan.id if plan is not None else -1, bool(causal), scale, keep,
                            window_left, window_right)
    return (o, lse) if return_lse else o
