"""cad.Plan: one micro-batch's CAD plan, made once (collectively) and used by every layer's forward and backward.

A plan is the whole description of a micro-batch's attention: its documents (or pieces), its mask (causal and
window), its shapes (heads, key/value heads, head dim) and dtype, and the context (group) and lane it runs on.
Calls pass the plan and the tensors; what the plan fixed is taken from it. This module knows no context type: a
plan is given its context (cad.Context) and reaches it through that object only.
"""
import ctypes as C
import threading
import time
import weakref

import torch

from . import _abi, _checks, _documents
from ._errors import CadError
from ._tensors import current_stream, device_of, dtype_of


def pieces_from_cu_seqlens(documents, cu_seqlens, rank, what="cad.plan"):
    """This rank's documents as pieces: one whole document per cu_seqlens interval (empty ones dropped), read
    through `documents` (the context's _documents.ReadBack). Document ids are unique across ranks without
    communication: rank << 32 | index."""
    cu = documents.offsets(cu_seqlens, what)
    return [(rank << 32 | i, cu[i + 1] - cu[i], 0, cu[i + 1] - cu[i]) for i in range(len(cu) - 1) if cu[i + 1] > cu[i]]


def piece_array(pieces):
    array = (_abi.Piece * max(len(pieces), 1))()
    for i, p in enumerate(pieces):
        array[i] = _abi.Piece(*p)
    return array


class Plan:
    """What CAD needs to run one micro-batch again and again: made by `cad.plan(...)` / `Context.plan(...)`.

    What it fixed: `pieces` (and `cu_seqlens`, the documents' tensor it was made from), `causal` and
    `window_size`, `shape` (num_heads, num_kv_heads, head_dim, dtype, device) once known, `context` and `lane`.
    A varlen_attn call with the plan takes causal and window from it, and its tensors must match its shapes.

    The plugin's plan is made when the plan is given its shapes (at cad.plan, or on the planning thread with
    ahead=True); a plan made without them is made by its first call (collective: every rank makes it at the same
    layer). `stats` gives the imbalance (max/mean server cost), bytes and per-server cost, as soon as the plugin's
    plan is made. Release with `release()` or let it be collected.

    Made ahead (ahead=True): `wait()` (or the first call that uses it) waits for it and raises what went wrong.

    Lifetime: a plan belongs to one micro-batch. Every forward that used it keeps it alive until its backward
    ran, so a recomputed forward (activation checkpointing) finds the same plan and makes none. It dies with
    the CAD stack it was made on: after its context is reconfigured or closed (cad.init, cad.shutdown) it is
    refused, never handed to the new stack. It is made for the documents `cu_seqlens` held when it was planned:
    a call whose cu_seqlens holds other documents is refused (the values are compared, however the tensor was
    refilled; make a new plan for new documents).
    """

    def __init__(self, context, pieces, cu_seqlens=None, causal=True, device=None, window=(-1, -1), lane=None):
        self.context = context
        self.lane = context.lane(0 if lane is None else lane)
        self.pieces = [tuple(p) for p in pieces]
        self.tokens = sum(p[3] for p in self.pieces)
        self.cu_seqlens = cu_seqlens
        self._documents = context.documents.offsets(cu_seqlens, "cad.plan") if cu_seqlens is not None else None
        self.released = False
        self.causal = bool(causal)
        self.window_left, self.window_right = (int(w) for w in window)  # the ABI's (-1 = no limit)
        self.device = None if device is None else torch.device(device)
        self.id = context._register(self)
        self.handle = None
        self.shape = None
        self._stats = None
        self.make_ms = None
        self.make_started_at = None  # time.perf_counter() when the collective make began
        self._host = None
        self._array = piece_array(self.pieces)
        self._call_pieces = {}  # another tensor's offsets (a tuple) -> (array, count)
        self._ready = None      # threading.Event while made ahead (set when made or failed)
        self._error = None      # what went wrong making it ahead
        self.tag = None
        self.wait_ms = 0.0      # how long callers waited for a plan made ahead (0: it was ready)
        self._finalizer = None

    # ---- what the plan fixed ------------------------------------------------------------------------------------
    @property
    def window_size(self):
        """The plan's window as varlen_attn's window_size (PyTorch's (left, right), -1 = no limit)."""
        return (self.window_left, 0 if self.causal else self.window_right)

    @property
    def num_heads(self):
        return None if self.shape is None else self.shape[0]

    @property
    def num_kv_heads(self):
        return None if self.shape is None else self.shape[1]

    @property
    def head_dim(self):
        return None if self.shape is None else self.shape[2]

    @property
    def dtype(self):
        return None if self.shape is None else self.shape[3]

    # ---- the plugin's plan ------------------------------------------------------------------------------------
    def _args(self, shape, stream):
        args = _abi.PlanArgs()
        args.struct_size = C.sizeof(args)
        args.pieces = self._array
        args.num_pieces = len(self.pieces)
        args.num_q_rows = args.num_kv_rows = self.tokens
        args.num_q_heads, args.num_kv_heads, args.head_dim = shape[0], shape[1], shape[2]
        args.dtype = dtype_of(shape[3])
        args.causal = 1 if self.causal else 0
        args.window_flags = _abi.WINDOW_GIVEN  # window_left/right are read (-1 = no limit)
        args.window_left = self.window_left  # the plugin refuses calls with another window, naming it
        args.window_right = self.window_right
        args.device = device_of(shape[4])
        args.stream = stream
        return args

    @staticmethod
    def _shape(num_heads, num_kv_heads, head_dim, dtype, device, what="cad.plan"):
        """The shapes as the ABI's int32 fields take them, checked (a CadError names the argument)."""
        heads = _checks.integer(num_heads, "num_heads", what, 1, _checks.INT32_MAX)
        kv_heads = _checks.integer(num_kv_heads, "num_kv_heads", what, 1, _checks.INT32_MAX)
        dim = _checks.integer(head_dim, "head_dim", what, 1, _checks.INT32_MAX)
        if not isinstance(dtype, torch.dtype):
            raise CadError(f"{what}: dtype must be a torch.dtype, got {dtype!r}", "INVALID_ARGUMENT")
        return heads, kv_heads, dim, dtype, torch.device(device)

    def make(self, num_heads, num_kv_heads, head_dim, dtype, device):
        """Make the plugin's plan for these shapes (collective, now). Done once; later calls must match."""
        shape = self._shape(num_heads, num_kv_heads, head_dim, dtype, device)
        if self.handle is not None or self._ready is not None:
            return
        host = self.lane.stack(shape[4])
        args = self._args(shape, current_stream(shape[4]))
        start = time.perf_counter()
        self._adopt(host, host.make_plan(args), shape, start)

    def make_ahead(self, num_heads, num_kv_heads, head_dim, dtype, device, tag=None):
        """Queue the plugin's plan on the stack's planning thread and return at once (see cad.plan)."""
        shape = self._shape(num_heads, num_kv_heads, head_dim, dtype, device)
        if self.handle is not None or self._ready is not None:
            return
        host = self.lane.stack(shape[4])  # made here if new: a stack is made collectively, on this thread
        # The tables go up in the order of the caller's current stream: ready for its calls, no host wait.
        args = self._args(shape, current_stream(shape[4]))
        self.tag = tag
        self._ready = threading.Event()
        try:
            self.context.planner(host).submit(self, args, shape, tag)
        except CadError:
            self._ready = None  # never queued: nothing to wait for
            raise

    def _adopt(self, host, handle, shape, start):
        """Take the plugin's plan (on the calling or the planning thread)."""
        self.context.makes += 1
        self.make_started_at = start
        # Wall time of the whole collective make (agreement, piece tables, balancer, device buffers), which a
        # rank also spends waiting for the others to arrive; the plugin's plan_ms is the balancer's share.
        self.make_ms = (time.perf_counter() - start) * 1e3
        self._host = host
        self.shape = shape
        self.handle = handle
        self._finalizer = weakref.finalize(self, host.release_plan, handle)
        host.owns(self._finalizer)
        if self.released:  # dropped or released while it was being made ahead
            self._finalizer()
            self.handle = None
            return
        try:
            self._record_stats("plan")  # the plugin reports what a plan will do as soon as it is made
        except CadError:
            pass  # statistics are a report: reading them must never fail the plan (stats stays None)

    def wait(self, timeout=None):
        """Wait until a plan made ahead is made (no-op otherwise); raises its failure. timeout: seconds (default:
        what its collectives may take, from the context's timeout). Returns the plan."""
        if self._ready is None:
            return self
        if not self._ready.is_set():
            limit = timeout if timeout is not None else self.context.planning_wait_limit_s()
            start = time.perf_counter()
            done = self._ready.wait(limit)
            self.wait_ms += (time.perf_counter() - start) * 1e3
            if not done:
                raise CadError(f"cad: rank {self.context.rank}: plan #{self.id}{self._tag_text()} made ahead was not "
                               f"ready within {limit:g} s (its planning thread is still waiting for the other ranks)",
                               "TIMEOUT")
        if self._error is not None:
            raise CadError(str(self._error), getattr(self._error, "status", "INTERNAL"))
        return self

    @property
    def ready(self):
        """Whether the plugin's plan is made (False while made ahead, or before the first call)."""
        return self.handle is not None and (self._ready is None or self._ready.is_set())

    def _tag_text(self):
        return f" (tag {self.tag})" if self.tag is not None else ""

    def release(self):
        """Give the plugin's plan back (not collective). The Plan cannot be used afterwards. A plan still being
        made ahead goes back as soon as it is made."""
        if self.handle is not None:
            self._finalizer()
            self.handle = None
        self.released = True
        self.context._forget(self.id)

    def check_usable(self, device, what="cad.varlen_attn"):
        """Refuse a plan that was released, or whose CAD stack is gone (its context reconfigured or closed since),
        before anything of it reaches the plugin."""
        if self.released:
            raise CadError(f"{what}: plan #{self.id} was released", "INVALID_ARGUMENT")
        if self._host is not None and (self._host.closed or self._host is not self.lane.existing(device)):
            raise CadError(f"{what}: plan #{self.id} was made on a CAD stack that cad.init(), cad.shutdown() or "
                           f"Context.close() has closed since; make a new plan with cad.plan(...)",
                           "INVALID_ARGUMENT")
        if self.device is not None and torch.device(device).type != self.device.type:
            raise CadError(f"{what}: plan #{self.id} was made for {self.device}, the call's tensors are on {device}",
                           "INVALID_ARGUMENT")

    def check_tensors(self, q, k, v, what="cad.varlen_attn"):
        """Refuse q, k, v whose heads, head dim, dtype or device type are not what the plan fixed, naming the tensor
        and what the plan expected, before anything reaches the plugin. A plan without shapes yet (made by its first
        call) fixes none of them.

        Where: a refusal here is this rank's alone, so it is made only where no peer waits for the call (a group of
        one rank). In a group of several, a rank that refused here would leave its peers waiting in the call's
        collectives until their timeout, and they would fail without a word about this rank (a bad input on one
        rank must fail every rank, naming it: tests/python/test_varlen_distributed.py); there the plugin's one
        check of a call against its plan (plugins/cad/call_check.h) refuses the same tensors, naming the tensor and
        the plan, and every rank agrees on the refusal. A call's token count (the rows of q, k, v) is always left
        to the plugin."""
        if self.shape is None or self.context.world > 1:
            return
        heads, kv_heads, dim, dtype, device = self.shape
        fixed = f"plan #{self.id} was made for num_heads={heads}, num_kv_heads={kv_heads}, head_dim={dim}, {dtype}"
        for name, t, want_heads, heads_name in (("q", q, heads, "num_heads"), ("k", k, kv_heads, "num_kv_heads"),
                                                ("v", v, kv_heads, "num_kv_heads")):
            if t.dim() != 3:
                raise CadError(f"{what}: tensor '{name}' has shape {tuple(t.shape)}, expected 3 dims [T, H, D]; "
                               f"{fixed}", "INVALID_ARGUMENT")
            if t.shape[1] != want_heads:
                raise CadError(f"{what}: tensor '{name}' has {t.shape[1]} heads (dim 1 of {tuple(t.shape)}), but "
                               f"{fixed} ({heads_name}={want_heads})", "INVALID_ARGUMENT")
            if t.shape[2] != dim:
                raise CadError(f"{what}: tensor '{name}' has head dim {t.shape[2]} (dim 2 of {tuple(t.shape)}), but "
                               f"{fixed} (head_dim={dim})", "INVALID_ARGUMENT")
            if t.dtype != dtype:
                raise CadError(f"{what}: tensor '{name}' is {t.dtype}, but {fixed} (dtype={dtype})", "INVALID_ARGUMENT")
            if t.device.type != device.type:
                raise CadError(f"{what}: tensor '{name}' is on {t.device}, but plan #{self.id} was made for {device}",
                               "INVALID_ARGUMENT")

    def pieces_for(self, cu_seqlens, rank):
        """The pieces a call with `cu_seqlens` describes (the plan's own when it holds the plan's documents).
        Decided from the tensor's values, never from its version counter alone (a refill through .data or
        .numpy() does not move it)."""
        if cu_seqlens is None:
            return self._array, len(self.pieces)
        cu = self.context.documents.offsets(cu_seqlens, "cad.varlen_attn")
        if cu is self._documents or cu == self._documents:
            return self._array, len(self.pieces)
        if cu_seqlens is self.cu_seqlens:
            raise CadError(f"cad.varlen_attn: the cu_seqlens tensor of plan #{self.id} holds other documents "
                           f"({_documents.shown(cu)}) than when cad.plan(...) read it "
                           f"({_documents.shown(self._documents)}); "
                           f"the plan is for the documents it held then. Make a new plan for new documents",
                           "INVALID_ARGUMENT")
        # Another tensor with other documents: its pieces go to the plugin, which refuses them naming the plan.
        cached = self._call_pieces.get(cu)
        if cached is None:
            pieces = pieces_from_cu_seqlens(self.context.documents, cu_seqlens, rank, "cad.varlen_attn")
            cached = self._call_pieces[cu] = (piece_array(pieces), len(pieces))
        return cached

    @property
    def piece_table(self):
        """The ABI array of the pieces the plan was made for (what pieces_for returns for the plan's documents)."""
        return self._array

    @property
    def stats(self):
        """The plan's imbalance, bytes and per-server cost (dict), known once the plan is made; None before."""
        return self._stats

    def _record_stats(self, key="forward"):
        if self._stats is None and self._host is not None:
            forward = self._host.stats().get(key)
            if forward:
                keys = ("imbalance", "servers", "model_forward_bytes_sent_by_rank",
                        "model_forward_bytes_received_by_rank", "workspace_bytes", "plan_ms")
                self._stats = {k: forward[k] for k in keys if k in forward}
                self._stats["rank"] = self._host.stats().get("rank")
                self._stats["make_ms"] = self.make_ms

    def host(self, device):
        """The CAD stack this plan's calls run on (its lane's)."""
        return self._host if self._host is not None else self.lane.stack(device)

    def __repr__(self):
        lane = f", lane {self.lane.index}" if self.lane.index else ""
        return (f"cad.Plan(#{self.id}{self._tag_text()}, {len(self.pieces)} pieces, {self.tokens} tokens{lane}, "
                f"made={self.ready})")
