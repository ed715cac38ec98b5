"""cad.plan: one micro-batch's CAD plan, made once (collectively) and used by every layer's forward and backward."""
import ctypes as C
import itertools
import os
import threading
import time
import weakref

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import _abi, _documents, _runtime
from ._errors import CadError
from ._tensors import current_stream, device_of, dtype_of

_serials = itertools.count(1)
_plans = weakref.WeakValueDictionary()  # plan id -> Plan, how the custom op (ints only) reaches a plan
_makes = [0]  # collective plan makes in this process (tests check that a backward makes none)


def makes_so_far():
    return _makes[0]


def pieces_from_cu_seqlens(cu_seqlens, rank, what="cad.plan"):
    """This rank's documents as pieces: one whole document per cu_seqlens interval (empty ones dropped).
    Document ids are unique across ranks without communication: rank << 32 | index."""
    cu = _documents.offsets(cu_seqlens, what)
    return [(rank << 32 | i, cu[i + 1] - cu[i], 0, cu[i + 1] - cu[i]) for i in range(len(cu) - 1) if cu[i + 1] > cu[i]]


def piece_array(pieces):
    array = (_abi.Piece * max(len(pieces), 1))()
    for i, p in enumerate(pieces):
        array[i] = _abi.Piece(*p)
    return array


class Plan:
    """What CAD needs to run one micro-batch again and again: made by `cad.plan(...)`.

    The plugin's plan is made on the first call that needs it (collective: every rank of the group makes its
    plan at the same layer), or at once when the shapes are given to cad.plan. `stats` gives the imbalance
    (max/mean server cost), bytes and per-server cost, as soon as the plugin's plan is made. Release with
    `release()` or let it be collected.

    Made ahead (cad.plan(..., ahead=True)): the plugin's plan is made on the stack's planning thread while the
    caller goes on; `wait()` (or the first call that uses it) waits for it and raises what went wrong there.

    Lifetime: a plan belongs to one micro-batch. Every forward that used it keeps it alive until its backward
    ran, so a recomputed forward (activation checkpointing) finds the same plan and makes none. It dies with
    the CAD stack it was made on: after cad.init() or cad.shutdown() it is refused, never handed to the new
    stack. It is made for the documents `cu_seqlens` held when cad.plan was called: refilling that tensor in
    place afterwards is refused at the next call (make a new plan for new documents).

    Lane: which of the device's CAD stacks makes and runs it (cad.plan's lane; _runtime says why there are
    several).
    """

    def __init__(self, pieces, cu_seqlens=None, causal=True, device=None, window_left=-1, lane=0):
        self.lane = _runtime.check_lane(lane)
        self.pieces = [tuple(int(x) for x in p) for p in pieces]
        self.tokens = sum(p[3] for p in self.pieces)
        self.cu_seqlens = cu_seqlens
        self._cu_version = cu_seqlens._version if cu_seqlens is not None else None
        self.released = False
        self.causal = bool(causal)
        self.window_left = int(window_left)  # the sliding window every call with this plan uses (-1 = none)
        self.device = None if device is None else torch.device(device)
        self.id = next(_serials)
        self.handle = None
        self.shape = None
        self._stats = None
        self.make_ms = None
        self.make_started_at = None  # time.perf_counter() when the collective make began
        self._host = None
        self._array = piece_array(self.pieces)
        self._call_pieces = WeakIdKeyDictionary()  # another cu_seqlens tensor a call gave -> (version, array, n)
        self._ready = None      # threading.Event while made ahead (set when made or failed)
        self._error = None      # what went wrong making it ahead
        self.tag = None
        self.wait_ms = 0.0      # how long callers waited for a plan made ahead (0: it was ready)
        _plans[self.id] = self

    # ---- the plugin's plan ------------------------------------------------------------------------------
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
        args.window_right = _abi.NO_WINDOW
        args.device = device_of(shape[4])
        args.stream = stream
        return args

    @staticmethod
    def _shape(num_heads, num_kv_heads, head_dim, dtype, device):
        return int(num_heads), int(num_kv_heads), int(head_dim), dtype, torch.device(device)

    def make(self, num_heads, num_kv_heads, head_dim, dtype, device):
        """Make the plugin's plan for these shapes (collective, now). Done once; later calls must match."""
        shape = self._shape(num_heads, num_kv_heads, head_dim, dtype, device)
        if self.handle is not None or self._ready is not None:
            return
        host = _runtime.runtime(shape[4], self.lane)
        args = self._args(shape, current_stream(shape[4]))
        start = time.perf_counter()
        self._adopt(host, host.make_plan(args), shape, start)

    def make_ahead(self, num_heads, num_kv_heads, head_dim, dtype, device, tag=None):
        """Queue the plugin's plan on the stack's planning thread and return at once (see cad.plan)."""
        shape = self._shape(num_heads, num_kv_heads, head_dim, dtype, device)
        if self.handle is not None or self._ready is not None:
            return
        host = _runtime.runtime(shape[4], self.lane)  # made here if new: a stack is made collectively, on this thread
        # The tables go up in the order of the caller's current stream: ready for its calls, no host wait.
        args = self._args(shape, current_stream(shape[4]))
        self.tag = tag
        self._ready = threading.Event()
        try:
            _runtime.planner(host).submit(self, args, shape, tag)
        except CadError:
            self._ready = None  # never queued: nothing to wait for
            raise

    def _adopt(self, host, handle, shape, start):
        """Take the plugin's plan (on the calling or the planning thread)."""
        _makes[0] += 1
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
        what its collectives may take, from the stack's timeout). Returns the plan."""
        if self._ready is None:
            return self
        if not self._ready.is_set():
            limit = timeout if timeout is not None else _runtime.planning_wait_limit_s()
            start = time.perf_counter()
            done = self._ready.wait(limit)
            self.wait_ms += (time.perf_counter() - start) * 1e3
            if not done:
                raise CadError(f"cad: rank {_rank()}: plan #{self.id}{self._tag_text()} made ahead was not ready "
                               f"within {limit:g} s (its planning thread is still waiting for the other ranks)",
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
        _plans.pop(self.id, None)

    def check_usable(self, device, what="cad.varlen_attn"):
        """Refuse a plan that was released, or whose CAD stack is gone (cad.init / cad.shutdown since), before
        anything of it reaches the plugin."""
        if self.released:
            raise CadError(f"{what}: plan #{self.id} was released", "INVALID_ARGUMENT")
        if self._host is not None and (self._host.closed or self._host is not _runtime.existing(device, self.lane)):
            raise CadError(f"{what}: plan #{self.id} was made on a CAD stack that cad.init() or cad.shutdown() has "
                           f"closed since; make a new plan with cad.plan(...)", "INVALID_ARGUMENT")
        if self.device is not None and torch.device(device).type != self.device.type:
            raise CadError(f"{what}: plan #{self.id} was made for {self.device}, the call's tensors are on {device}",
                           "INVALID_ARGUMENT")

    def pieces_for(self, cu_seqlens, rank):
        """The pieces a call with `cu_seqlens` describes (the plan's own when it is the plan's tensor)."""
        if cu_seqlens is None or cu_seqlens is self.cu_seqlens:
            if cu_seqlens is not None and cu_seqlens._version != self._cu_version:
                raise CadError(f"cad.varlen_attn: the cu_seqlens tensor of plan #{self.id} was modified in place after "
                               f"cad.plan(...) read it; the plan is for the documents it held then. Make a new plan "
                               f"for new documents", "INVALID_ARGUMENT")
            return self._array, len(self.pieces)
        # Another tensor, e.g. the device copy FSDP2's root module made of the plan's: its pieces, built once.
        cached = self._call_pieces.get(cu_seqlens)
        if cached is None or cached[0] != cu_seqlens._version:
            pieces = pieces_from_cu_seqlens(cu_seqlens, rank, "cad.varlen_attn")
            cached = self._call_pieces[cu_seqlens] = (cu_seqlens._version, piece_array(pieces), len(pieces))
        return cached[1], cached[2]

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
        return self._host if self._host is not None else _runtime.runtime(device, self.lane)

    def __repr__(self):
        lane = f", lane {self.lane}" if self.lane else ""
        return (f"cad.Plan(#{self.id}{self._tag_text()}, {len(self.pieces)} pieces, {self.tokens} tokens{lane}, "
                f"made={self.ready})")


def lookup(plan_id):
    plan = _plans.get(plan_id)
    if plan is None:
        raise CadError(f"cad.varlen_attn: plan #{plan_id} was released or never existed")
    return plan


def _rank():
    """This process's rank in the group CAD spans: torch.distributed's, else the MPI launcher's (communicator
    "mpi" under mpirun without torch.distributed), else 0."""
    from ._runtime import _settings
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(_settings["group"])
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def plan(cu_seqlens, *, causal=True, window_size=(-1, -1), num_heads=None, num_kv_heads=None, head_dim=None,
         dtype=None, device=None, ahead=False, tag=None, lane=0):
    """A plan for this rank's packed documents, `cu_seqlens` int32 [num_docs + 1] (as flash_attn's varlen
    functions take). Once per micro-batch, on every rank of the group. window_size=(left, 0): a plan for
    causal sliding-window layers (varlen_attn's window_size); interleaved local/global layers need one plan
    per window. With num_heads, num_kv_heads, head_dim,
    dtype and device given the plugin's plan is made now (collective); otherwise by the first varlen_attn
    call that uses it. The balancer and communicator are the stack's (cad.init).

    ahead=True (shapes required): return at once and make the plan on the stack's planning thread, e.g. for
    micro-batch i+1 while micro-batch i computes; its first use waits for it (Plan.wait). Every rank must ask
    for the same plans ahead in the same order; `tag` (an int, e.g. the micro-batch's index) is compared across
    ranks before each make, so that a different order fails with both tags named instead of pairing the wrong
    plans.

    lane: which of the device's CAD stacks makes and runs the plan (0 to 3; each lane's stack is made by the
    first plan naming it, collectively). Plans whose calls should overlap -- the two nano-batches of ping-pong
    -- go on different lanes: one stack runs its exchanges in enqueue order, so on one lane nano-batch 1's send
    would wait behind nano-batch 0's return (and with it nano-batch 0's attention). Each lane holds its own
    communicator (on CUDA an NCCL communicator and stream)."""
    p = Plan(pieces_from_cu_seqlens(cu_seqlens, _rank()), cu_seqlens=cu_seqlens, causal=causal, device=device,
             window_left=_plan_window(window_size, causal), lane=lane)
    shapes = (num_heads, num_kv_heads, head_dim, dtype, device)
    if ahead and None in shapes:
        raise CadError("cad.plan(ahead=True): give num_heads, num_kv_heads, head_dim, dtype and device (a plan made "
                       "ahead cannot wait for the first call to learn them)")
    if tag is not None and (not ahead or isinstance(tag, bool) or not isinstance(tag, int)):
        raise CadError(f"cad.plan: tag must be an int and goes with ahead=True, got tag={tag!r}, ahead={ahead!r}")
    if num_heads is not None:
        if None in shapes:
            raise CadError("cad.plan: give num_heads, num_kv_heads, head_dim, dtype and device together (or none)")
        if ahead:
            p.make_ahead(num_heads, num_kv_heads, head_dim, dtype, device, tag=tag)
        else:
            p.make(num_heads, num_kv_heads, head_dim, dtype, device)
    return p


def _plan_window(window_size, causal):
    from ._ops import window_of  # the same checks (and words) as varlen_attn's
    return window_of(window_size, bool(causal), "cad.plan")[0]


def plan_pieces(pieces, *, causal=True, window_size=(-1, -1), num_heads=None, num_kv_heads=None, head_dim=None,
                dtype=None, device=None, lane=0):
    """A plan from pieces (doc_id, doc_len, offset_in_doc, len), this rank's tokens in order, for documents cut
    across ranks: doc_id must name the same document on every rank that holds a piece of it. varlen_attn calls
    with such a plan take cu_seqlens=None. window_size and lane as for cad.plan."""
    p = Plan(pieces, causal=causal, device=device, window_left=_plan_window(window_size, causal), lane=lane)
    if num_heads is not None:
        p.make(num_heads, num_kv_heads, head_dim, dtype, device)
    return p
