"""cad.varlen_attn: varlen core attention over THD tensors as a torch custom op with autograd.

Two torch.library custom ops, cad::varlen_fwd and cad::varlen_bwd, each with a fake (meta) implementation so
that torch.compile traces through them; register_autograd joins them into one differentiable op. A plan
crosses as two integers, its context's id and its own; the forward's saved state (the CAD servers' copy of
Q/K/V/O/LSE) as a one-element int64 key tensor that the backward hands back and releases. Nothing else reaches
the ops: no module state, no side channel (whether a served forward counts as inside a backward is an argument).

Memory: a token's tensors are kept once. Where the servers kept a forward's Q/K/V/O/LSE (cad.init's
keep_forward_tensors), the autograd context saves no copy of q, k, v, o: it saves stand-ins of the same shape,
dtype and device that own no memory (a zero-stride expansion of one element), which activation checkpointing's
check of recomputed tensors accepts, and the backward hands the plugin its gradient buffers in their place
(CAD reads none of q/k/v/o when given saved state: plugins/cad/README.md). Otherwise the context saves them,
as local attention does, and the backward re-sends them.
"""
import ctypes as C
import math
import weakref
from typing import Optional

import torch

from . import _abi, _checks, _context
from ._errors import CadError
from ._plans import Plan
from ._tensors import Described, current_stream
from ._timing import timed

NO_PLAN = -1  # plan_id / context_id of a local call (plan=None)
LOOK = -1     # in_backward: look at autograd (a call of this rank's own); 0 / 1: given (a served call)

def _segments(context, cu_seqlens, tokens):
    """The local backend's segment table: one causal/full segment per document. Checked here, since the local
    path has no peers to agree with. Every layer of a step passes the same tensor: its table is kept in the
    context's per-tensor cache, cu_seqlens -> (its offsets, tokens, segment table, count), and built again when
    its values change (context.documents compares them: see _documents)."""
    if cu_seqlens is None:
        raise CadError("cad.varlen_attn: cu_seqlens is required without a plan")
    cu = context.documents.offsets(cu_seqlens, "cad.varlen_attn", tokens)
    cached = context.segment_tables.get(cu_seqlens)
    if cached is not None and cached[0] is cu and cached[1] == tokens:
        return cached[2], cached[3]
    n = len(cu) - 1
    table = (_abi.Segment * max(n, 1))()
    for i in range(n):
        table[i] = _abi.Segment(cu[i], cu[i + 1] - cu[i], cu[i], cu[i + 1] - cu[i])
    context.segment_tables[cu_seqlens] = (cu, tokens, table, n)
    return table, n


def _context_of(context_id):
    return _context.default() if context_id == NO_PLAN else _context.lookup(context_id)


def _call_plan(context, plan_id, q, k, v):
    if plan_id == NO_PLAN:
        return None
    plan = context.plan_by_id(plan_id)
    plan.wait()  # a plan made ahead: usually made long before its first layer
    plan.check_usable(q.device)
    # The heads, head dim and dtype the plan fixed are checked here, before ctypes, where no peer waits for the call
    # (Plan.check_tensors); everything else, and all of it in a group of several ranks, by the plugin, whose refusal
    # every rank agrees on.
    plan.check_tensors(q, k, v)
    if plan.handle is None:  # a plan made without shapes: made by its first call (not ahead)
        plan.make(q.shape[1], k.shape[1], q.shape[2], q.dtype, q.device)
    return plan


def _describe_batch(args, context, plan, cu_seqlens, tokens, device):
    """Fill the batch description of forward/backward args: a plan (CAD) or a segment table (local). Returns
    the stack that runs the call."""
    if plan is None:
        args.segments, args.num_segments = _segments(context, cu_seqlens, tokens)
        return context.local_backend(device)
    pieces, n = plan.pieces_for(cu_seqlens, context.rank)
    if pieces is plan.piece_table:
        pieces, n = None, 0  # the plan's own documents: it fixed them, so the call passes none (plugins/cad/README.md)
    args.pieces, args.num_pieces, args.plan = pieces, n, plan.handle
    return plan.host(device)


def _before_own_call(context, direction, plan_id, serving):
    """Within a cad.CallOrder: make the other ranks' calls that come before this one -- before waiting for this
    call's own plan: a peer can be inside one of those calls, holding its stack while its planning thread waits
    to make this plan with ours. A served call (the order's own) is not one of this rank's."""
    order = context.call_order if plan_id != NO_PLAN and not serving else None
    if order is not None:
        order.before_own_call(direction, context.plan_by_id(plan_id))
    return order


@torch.library.custom_op("cad::varlen_fwd", mutates_args=())
def _varlen_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: Optional[torch.Tensor],
                context_id: int, plan_id: int, causal: bool, softmax_scale: float, keep: bool, window_left: int,
                window_right: int, in_backward: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tokens, num_heads = q.shape[0], q.shape[1]
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((num_heads, tokens), dtype=torch.float32, device=q.device)
    key = torch.zeros(1, dtype=torch.int64)
    context = _context_of(context_id)
    order = _before_own_call(context, "forward", plan_id, in_backward != LOOK)
    plan = _call_plan(context, plan_id, q, k, v)
    args = _abi.ForwardArgs()
    args.struct_size = C.sizeof(args)
    host = _describe_batch(args, context, plan, cu_seqlens, tokens, q.device)
    tensors = [Described(t) for t in (q, k, v, o, lse)]
    args.q, args.k, args.v, args.o, args.lse = (t.ptr for t in tensors)
    args.softmax_scale = softmax_scale
    args.causal = 1 if causal else 0
    args.window_flags = _abi.WINDOW_GIVEN  # window_left/right are read (-1 = no limit)
    args.window_left, args.window_right = window_left, window_right
    args.stream = current_stream(q.device)
    slot = C.c_void_p()
    # keep: the caller needs a backward. Whether the servers keep this forward's tensors for it is the context's
    # policy (keep_forward_tensors), decided here at run time, where a recomputation inside a backward is visible.
    inside = torch._C._current_graph_task_id() != -1 if in_backward == LOOK else bool(in_backward)
    if plan is not None and keep and context.keeps_forward(inside):
        args.saved = C.pointer(slot)
    with timed(context.timer, q.device):
        host.forward(args)
    if plan is not None:
        k_id = context.keep_saved(host, slot.value, plan)
        key[0] = k_id
        host.owns(weakref.finalize(key, context.release_saved, k_id))  # also for a forward whose backward never comes
        plan._record_stats()
    if order is not None:
        order.after_own_call()
    return o, lse, key


@_varlen_fwd.register_fake
def _(q, k, v, cu_seqlens, context_id, plan_id, causal, softmax_scale, keep, window_left, window_right, in_backward):
    return (q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32),
            torch.empty(1, dtype=torch.int64, device="cpu"))


@torch.library.custom_op("cad::varlen_bwd", mutates_args=())
def _varlen_bwd(d_o: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                lse: torch.Tensor, cu_seqlens: Optional[torch.Tensor], context_id: int, plan_id: int,
                saved_key: torch.Tensor, causal: bool, softmax_scale: float, window_left: int, window_right: int,
                serving: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    d_q = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    d_k = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    d_v = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    context = _context_of(context_id)
    order = _before_own_call(context, "backward", plan_id, serving)
    kept = _stand_in(q)
    plan = _call_plan(context, plan_id, d_q if kept else q, d_k if kept else k, d_v if kept else v)
    args = _abi.BackwardArgs()
    args.struct_size = C.sizeof(args)
    host = _describe_batch(args, context, plan, cu_seqlens, q.shape[0], q.device)
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
    entry = context.saved(key) if plan is not None else None
    args.saved = entry[1] if entry is not None else None
    if args.saved is None and kept:
        raise CadError(f"cad.varlen_attn backward: the servers' kept state of this forward (plan #{plan.id}) is gone "
                       f"and the autograd context holds no copy of q/k/v/o to re-send; was the forward's output "
                       f"kept past a cad.init() or cad.shutdown()?", "INVALID_ARGUMENT")
    try:
        with timed(context.timer, q.device):
            host.backward(args)
    finally:
        if plan is not None:
            context.release_saved(key)
    if order is not None:
        order.after_own_call()
    return d_q, d_k, d_v


@_varlen_bwd.register_fake
def _(d_o, q, k, v, o, lse, cu_seqlens, context_id, plan_id, saved_key, causal, softmax_scale, window_left,
      window_right, serving):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# ---- calls made for other ranks (cad.CallOrder): zero tokens of this rank's, this rank serving -------------------
def serve_forward(q, kv, plan, softmax_scale, in_backward):
    """Make `plan`'s forward call over no token of this rank's; keep the servers' state as the owner's call
    would (keep_forward_tensors, in_backward: the owner's is a recomputation), for this plan's backward call."""
    context = plan.context
    _, _, key = _varlen_fwd(q, kv, kv, plan.cu_seqlens, context.id, plan.id, plan.causal, softmax_scale, True,
                            plan.window_left, plan.window_right, int(bool(in_backward)))
    k_id = int(key[0])
    entry = context.saved(k_id)
    if entry is not None and entry[1]:
        context.keep_served(plan.id, k_id, key)  # (held here: the key's finalizer would release it)
    else:
        context.release_saved(k_id)


def serve_backward(q, kv, plan, softmax_scale):
    """Make `plan`'s backward call over no token of this rank's, with the servers' state its forward kept."""
    context = plan.context
    kept = context.take_served(plan.id)
    _, key = kept if kept else (0, torch.zeros(1, dtype=torch.int64))
    lse = torch.empty((q.shape[1], 0), dtype=torch.float32, device=q.device)
    _varlen_bwd(q, q, kv, kv, q, lse, plan.cu_seqlens, context.id, plan.id, key, plan.causal, softmax_scale,
                plan.window_left, plan.window_right, True)


def _stand_in(t):
    """A tensor that owns no memory for its shape (see the module doc): a zero-stride expansion."""
    return t.dim() > 0 and t.numel() > 1 and all(s == 0 for s in t.stride())


def _kept_on_servers(context_id, key):
    """Whether the forward that returned `key` left its tensors on the servers (eager only: under torch.compile
    the context is set up while tracing, with no plugin call behind it, and saves the tensors)."""
    try:
        from torch._subclasses.fake_tensor import is_fake
        if is_fake(key) or not isinstance(context_id, int) or context_id == NO_PLAN:
            return False
        entry = _context.lookup(context_id).saved(int(key[0]))
    except Exception:  # noqa: BLE001 -- a tensor that cannot be read here: save the real tensors
        return False
    return entry is not None and bool(entry[1])


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens, context_id, plan_id, causal, softmax_scale, keep, window_left, window_right, _ = inputs
    o, lse, key = output
    if _kept_on_servers(context_id, key):
        q, k, v, o = (t.new_empty(()).expand(t.shape) for t in (q, k, v, o))
    ctx.save_for_backward(q, k, v, o, lse, key)
    ctx.cu_seqlens = cu_seqlens
    # Under torch.compile plan_id may be symbolic (a new plan per micro-batch does not recompile); the plan is
    # then kept alive through the saved key (the context's saved entry). In eager mode the autograd context holds
    # the plan itself: under activation checkpointing the first forward's key is dropped with its saved tensors,
    # and the backward and the recomputed forward must still find the plan that forward used.
    ctx.plan = None
    if isinstance(plan_id, int) and isinstance(context_id, int) and plan_id != NO_PLAN:
        ctx.plan = _context.lookup(context_id).find_plan(plan_id)
    ctx.ids = (context_id, plan_id)
    ctx.causal, ctx.softmax_scale = causal, softmax_scale
    ctx.window = (window_left, window_right)
    ctx.mark_non_differentiable(lse, key)


def _backward(ctx, d_o, d_lse, d_key):
    q, k, v, o, lse, key = ctx.saved_tensors
    d_q, d_k, d_v = _varlen_bwd(d_o.contiguous(), q, k, v, o, lse, ctx.cu_seqlens, *ctx.ids, key, ctx.causal,
                                ctx.softmax_scale, *ctx.window, False)
    return d_q, d_k, d_v, None, None, None, None, None, None, None, None, None


torch.library.register_autograd("cad::varlen_fwd", _backward, setup_context=_setup_context)


def _mask(plan, causal, window_size):
    """The call's (causal, ABI window): the plan's, where a plan is given (a causal or window_size passed as well
    must be the plan's: a conflict is refused naming both); the arguments' otherwise (defaults: causal, no
    window)."""
    if plan is None:
        causal = True if causal is None else bool(causal)
        return causal, _checks.window_of((-1, -1) if window_size is None else window_size, causal)
    if causal is not None and bool(causal) != plan.causal:
        raise CadError(f"cad.varlen_attn: causal={bool(causal)} conflicts with plan #{plan.id}'s causal={plan.causal} "
                       f"(the plan fixes the mask: leave causal out, or make the plan with causal={bool(causal)})",
                       "INVALID_ARGUMENT")
    window = (plan.window_left, plan.window_right)
    if window_size is not None:
        given = _checks.window_of(window_size, plan.causal)
        if given != window:
            raise CadError(f"cad.varlen_attn: window_size={tuple(window_size)} conflicts with plan #{plan.id}'s "
                           f"window_size={plan.window_size} (window_left={plan.window_left}; the plan fixes the "
                           f"mask: leave window_size out, or make a plan with cad.plan(..., window_size=...))",
                           "INVALID_ARGUMENT")
    return plan.causal, window


def varlen_attn(q, k, v, cu_seqlens, *, plan=None, causal=None, window_size=None, softmax_scale=None,
                return_lse=False):
    """Varlen core attention over packed documents (THD), differentiable.

    q [T, Hq, D], k and v [T, Hkv, D] (Hq % Hkv == 0), row-major contiguous, fp32 (CPU) or bf16 (CPU, CUDA);
    cu_seqlens int32 [num_docs + 1] of this rank's documents (flash_attn's convention).

    plan=None: plain local attention on the device's backend, with causal (default True) and window_size
    ((left, right), PyTorch's meaning: a query at position i of its document sees keys [i - left, i + right] of
    that document, none after i when causal, -1 = no limit; default (-1, -1)).
    plan=cad.plan(cu_seqlens, ...): CAD, balanced across the plan's group (every rank calls). The mask comes from
    the plan: causal and window_size may be left out (a value given must be the plan's, else CadError naming
    both), and q, k, v must match the plan's shapes and dtype when it has them. cu_seqlens may be the plan's
    tensor, another holding the same documents, or None (the plan's own). Returns O [T, Hq, D], and LSE [Hq, T]
    fp32 (natural log, not differentiated) when return_lse. Errors raise CadError with the plugin's message (on
    every rank for CAD).
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
    if plan is not None and not isinstance(plan, Plan):
        raise CadError(f"cad.varlen_attn: plan must be a cad.Plan from cad.plan(...), got {type(plan).__name__}")
    causal, (window_left, window_right) = _mask(plan, causal, window_size)
    keep = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    ids = (plan.context.id, plan.id) if plan is not None else (NO_PLAN, NO_PLAN)
    o, lse, _ = _varlen_fwd(q, k, v, cu_seqlens, *ids, causal, scale, keep, window_left, window_right, LOOK)
    return (o, lse) if return_lse else o
