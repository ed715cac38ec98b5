"""cad.Context: the one owner of CAD's state in a process, for one group.

A context holds its settings (the group and the stack knobs, `_settings`), its CAD stacks (one per device and
lane: communicator, balancer, server backend, then "cad"; each with its communicators and, on CUDA, its
communication stream), the plain local backends of `plan=None` calls, its plans (by id: the custom ops carry
only integers), the state forwards kept for their backwards, the state kept for other ranks' backwards
(cad.CallOrder) and the call order active in it. Nothing of it lives in module globals; a plan knows its
context, and the ops find a context by its id (`lookup`).

Several contexts in one process are independent: two over two process groups (or two over the same ranks)
each make their own stacks and gloo groups and run their own plans.

The package's functions (cad.init, cad.plan, cad.plan_pieces, cad.shutdown, cad.stack_config and the timing
functions) act on the default context (`default()`), made at the first use: a thin facade, so that a
program that drives one group never names a context.

Lanes: a plan names the lane whose stack makes and runs it (`Context.lane(i)`, or lane=i). Each lane's stack
has its own communicator -- on CUDA its own NCCL communicator and communication stream --, because one stack
runs its exchanges in the order they were enqueued: two nano-batches on one stack (ping-pong) put nano-batch 1's
send behind nano-batch 0's return, which waits for nano-batch 0's attention. On separate lanes each waits only
for its own data. A lane's stack is made by the first plan that names it (collectively: every rank asks for the
same lanes in the same order).
"""
import atexit
import itertools
import os
import threading
import weakref

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import _checks, _documents, _settings
from ._collectives import Collectives
from ._errors import CadError
from ._host import Host
from ._plans import Plan, pieces_from_cu_seqlens
from ._planner import Planner
from ._timing import Timer

MAX_LANES = 4  # a stack per lane holds a communicator (an NCCL one on CUDA): a small, fixed number

_ids = itertools.count(1)
_contexts = weakref.WeakValueDictionary()  # context id -> Context: how the custom ops (ints only) reach one
_registry_lock = threading.RLock()  # default() makes a Context, which registers itself
_default = []  # [the default Context] once made


def lookup(context_id):
    context = _contexts.get(context_id)
    if context is None:
        raise CadError(f"cad: context #{context_id} is gone (closed and collected) or never existed",
                       "INVALID_ARGUMENT")
    return context


def default():
    """The default context: what cad.init / cad.plan / cad.shutdown act on."""
    with _registry_lock:
        if not _default:
            _default.append(Context())
        return _default[0]


def device_key(device):
    """The device a stack is kept under: cuda with its index (the current one when none is given); other devices
    by their type alone, so that "cpu" and "cpu:0" (a trainer's torch.device("cpu", 0)) find the same stack."""
    device = torch.device(device)
    if device.type == "cuda":
        return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
    return torch.device(device.type)


class Lane:
    """One of a context's lanes (see the module doc): `index` (0 to 3), `context`; `stack(device)` is its CAD
    stack on a device (made collectively on first use). Equal to its index, so that code comparing a plan's lane
    with an int keeps working."""

    __slots__ = ("context", "index", "__weakref__")

    def __init__(self, context, index):
        self.context, self.index = context, index

    def stack(self, device):
        return self.context._stack(device, self.index)

    def existing(self, device):
        """This lane's CAD stack on `device` if one is up (None otherwise); makes nothing."""
        return self.context._existing(device, self.index)

    def __index__(self):
        return self.index

    def __eq__(self, other):
        if isinstance(other, Lane):
            return other.context is self.context and other.index == self.index
        return not isinstance(other, bool) and isinstance(other, int) and other == self.index

    def __hash__(self):
        return hash(self.index)

    def __repr__(self):
        return f"cad.Lane({self.index} of context #{self.context.id})"


class Context:
    """CAD over one process group: cad.Context(group=None, **settings), with cad.init's settings (see its doc):
    config, communicator, balancer, balancer_config, keep_forward_tensors, min_shard_tokens, timeout_ms,
    log_level, comm_stream_priority, nccl_max_ctas, nccl_blocking_comm, nccl_copy_engines, own_tasks_in_place,
    own_tasks_reserve_sms, forward_walk, head_groups. group: the torch.distributed group it spans (None: the
    default group); every rank of it makes the context's plans, in the same order.

        ctx = cad.Context(group)
        plan = ctx.plan(cu_seqlens, num_heads=Hq, num_kv_heads=Hkv, head_dim=D, dtype=torch.bfloat16)
        o = cad.varlen_attn(q, k, v, cu_seqlens, plan=plan)   # the plan knows its context
        ctx.close()                                            # or `with cad.Context(group) as ctx:`

    Stacks are made at the first plan that needs one (collectively over the group). `close()` gives back every
    stack; plans made before are refused afterwards, and a later plan makes new stacks.
    """

    def __init__(self, group=None, *, config=None, **settings):
        self._settings = _settings.checked("cad.Context", config=config, group=group, **settings)
        self.id = next(_ids)
        self._lock = threading.RLock()
        self._stacks = {}   # (device key, lane index) -> Host
        self._locals = {}   # device key -> Host: the plain local backend of plan=None calls
        self._lanes = [Lane(self, i) for i in range(MAX_LANES)]
        self._plans = weakref.WeakValueDictionary()  # plan id -> Plan
        self._plan_ids = itertools.count(1)
        self._saved_keys = itertools.count(1)
        # key -> (host, saved handle or None, plan): what a CAD forward leaves for its backward. The key tensor is
        # saved by autograd, so the plan lives until the backward ran (or the graph was dropped), also when a
        # compiled graph holds the plan only as its id.
        self._saved = {}
        # plan id -> [(key in _saved, key tensor)]: the servers' state this rank kept when it made another rank's
        # forward calls (cad.CallOrder), one per layer, until it makes that plan's backward calls (last kept first).
        self._served = {}
        self.call_order = None  # the cad.CallOrder of the tick running on this context, or None
        self.makes = 0          # collective plan makes so far (tests check that a backward makes none)
        self.timer = Timer()
        self.extras = {}  # state of the package's integrations kept with the context, by name (cad.hf: "hf")
        # Per-tensor caches, weakly keyed by the tensor (an entry lives as long as its tensor and this context):
        self.documents = _documents.ReadBack()       # what each cu_seqlens tensor held when last read
        self.segment_tables = WeakIdKeyDictionary()  # cu_seqlens -> the local backend's segment table (_ops)
        self._nano_streams = {}  # CUDA device index -> ping-pong's two nano-batch streams (cad.ping_pong)
        with _registry_lock:
            _contexts[self.id] = self
            _open.add(self)

    # ---- settings ---------------------------------------------------------------------------------------------
    @property
    def settings(self):
        """A copy of the settings this context builds its stacks from."""
        return dict(self._settings)

    @property
    def group(self):
        return self._settings["group"]

    def configure(self, config=None, **settings):
        """Replace the settings (cad.init's keywords; the rest take their defaults) and give back every stack
        made with the old ones (plans made before are refused afterwards)."""
        new = _settings.checked("cad.init", config=config, **settings)
        with self._lock:
            self._close_stacks()
            self._settings = new

    def stack_config(self, device):
        """The generated CAD stack config for `device` (what the settings mean)."""
        return _settings.stack_config(device, self._settings)

    def keeps_forward(self, in_backward):
        return _settings.keeps_forward(self._settings, in_backward)

    @property
    def rank(self):
        """This process's rank in the group: torch.distributed's, else the MPI launcher's (communicator "mpi"
        under mpirun without torch.distributed), else 0."""
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(self._settings["group"])
        for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
            if os.environ.get(name, "").isdigit():
                return int(os.environ[name])
        return 0

    @property
    def world(self):
        """How many ranks the group has: torch.distributed's, else the MPI launcher's, else 1 (as `rank`)."""
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size(self._settings["group"])
        for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
            if os.environ.get(name, "").isdigit():
                return int(os.environ[name])
        return 1

    # ---- lanes and stacks -------------------------------------------------------------------------------------
    def lane(self, lane):
        """This context's Lane `lane` (an int in [0, 4) or a Lane of this context)."""
        if isinstance(lane, Lane):
            if lane.context is not self:
                raise CadError(f"cad: {lane!r} belongs to another context than #{self.id}", "INVALID_ARGUMENT")
            return lane
        return self._lanes[_checks.integer(lane, "lane", "cad.plan", 0, MAX_LANES - 1)]

    def _stack(self, device, lane=0):
        """The CAD stack for `device` and lane, made on first use (collective over the group)."""
        key = (device_key(device), self.lane(lane).index)
        with self._lock:
            host = self._stacks.get(key)
            if host is None:
                config = self._settings["config"] or self.stack_config(key[0])
                collectives = Collectives(self._settings["group"], int(self._settings["timeout_ms"]))
                host = self._stacks[key] = Host(config, config.get("attention", "cad"), collectives)
            return host

    def _existing(self, device, lane=0):
        with self._lock:
            return self._stacks.get((device_key(device), int(lane)))

    def local_backend(self, device):
        """A plain varlen attention backend for `device` ("reference" on CPU, "cuda" on GPU); no communication."""
        key = device_key(device)
        with self._lock:
            host = self._locals.get(key)
            if host is None:
                plugin = "cuda" if key.type == "cuda" else "reference"
                host = self._locals[key] = Host({"log_level": self._settings["log_level"], "instances": [
                    {"name": "local", "plugin": plugin, "config": {}}], "attention": "local"}, "local")
            return host

    def planner(self, host):
        """The planning thread of CAD stack `host` (made on first use). Refuses a stack whose CAD instance has no
        plan communicator (a user config without "plan_communicator", or communicator "mpi")."""
        with self._lock:
            if host.planner is None:
                cad = next((i for i in host.config.get("instances", []) if i.get("name") == host.name), {})
                if not cad.get("config", {}).get("plan_communicator"):
                    raise CadError(f"cad.plan(ahead=True): the CAD instance '{host.name}' has no "
                                   f"\"plan_communicator\" (communicator 'mpi', or a config given to cad.init without "
                                   f"one), so a plan made on another thread would share the data path's communicator; "
                                   f"use ahead=False, or name a communicator instance of its own (plugin \"host\") as "
                                   f"plan_communicator", "UNSUPPORTED")
                host.planner = Planner(host, host.collectives, int(self._settings["timeout_ms"]))
            return host.planner

    def nano_batch_streams(self, device):
        """The two CUDA streams nano-batches 0 and 1 of cad.ping_pong run on: the same two at every call on a device,
        for the context's life (see cad.ping_pong.nano_batch_streams)."""
        device = torch.device(device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        with self._lock:
            if index not in self._nano_streams:
                self._nano_streams[index] = (torch.cuda.Stream(index), torch.cuda.Stream(index))
            return self._nano_streams[index]

    def planning_wait_limit_s(self):
        """How long a caller waits for a plan made ahead: its three collectives' timeouts, and some slack."""
        return 3 * int(self._settings["timeout_ms"]) / 1e3 + 5.0

    # ---- plans ------------------------------------------------------------------------------------------------
    def plan(self, cu_seqlens, *, causal=True, window_size=(-1, -1), num_heads=None, num_kv_heads=None,
             head_dim=None, dtype=None, device=None, ahead=False, tag=None, lane=0):
        """A plan for this rank's packed documents, `cu_seqlens` int32 [num_docs + 1] (flash_attn's varlen
        convention), on every rank of the group, once per micro-batch. The plan fixes everything about the
        micro-batch's attention: the documents, the mask (causal, window_size=(left, 0) for causal sliding-window
        layers; interleaved local/global layers need one plan per window), the shapes and dtype, the context.
        varlen_attn calls then pass only the plan and the tensors.

        Made ahead by default: with num_heads, num_kv_heads, head_dim and dtype given, the plugin's plan is made
        here, collectively (or, with ahead=True, on the stack's planning thread while the caller goes on: e.g. for
        micro-batch i+1 while micro-batch i computes; its first use waits for it, Plan.wait). device: where the
        calls' tensors live (default: cu_seqlens' device if it is CUDA, else the current CUDA device where CUDA is
        available and the communicator is not "host"/"mpi", else the CPU). Without shapes the plan is NOT made
        ahead: the plugin's plan is then made by the first varlen_attn call, inside the first layer's forward
        (collective there), from that call's tensors.

        tag (an int, with ahead=True, e.g. the micro-batch's index) is compared across ranks before each make, so
        that plans asked for in different orders fail with both tags named instead of pairing the wrong plans.
        lane: which of the device's CAD stacks makes and runs the plan (an int 0 to 3, or a Lane; see the module
        doc)."""
        lane = self.lane(lane)
        what = "cad.plan"
        p = Plan(self, pieces_from_cu_seqlens(self.documents, cu_seqlens, self.rank, what), cu_seqlens=cu_seqlens,
                 causal=causal, device=device, window=_checks.window_of(window_size, bool(causal), what), lane=lane)
        self._make_if_shaped(p, what, num_heads, num_kv_heads, head_dim, dtype, device, ahead, tag,
                             cu_seqlens.device)
        return p

    def plan_pieces(self, pieces, *, causal=True, window_size=(-1, -1), num_heads=None, num_kv_heads=None,
                    head_dim=None, dtype=None, device=None, ahead=False, tag=None, lane=0):
        """A plan from pieces (doc_id, doc_len, offset_in_doc, len), this rank's tokens in order, for documents
        cut across ranks: doc_id must name the same document on every rank that holds a piece of it. varlen_attn
        calls with such a plan take cu_seqlens=None. The rest as for plan()."""
        lane = self.lane(lane)
        what = "cad.plan_pieces"
        p = Plan(self, checked_pieces(pieces, what), causal=causal, device=device,
                 window=_checks.window_of(window_size, bool(causal), what), lane=lane)
        self._make_if_shaped(p, what, num_heads, num_kv_heads, head_dim, dtype, device, ahead, tag, None)
        return p

    def _make_if_shaped(self, plan, what, num_heads, num_kv_heads, head_dim, dtype, device, ahead, tag, cu_device):
        shapes = {"num_heads": num_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim, "dtype": dtype}
        missing = [name for name, value in shapes.items() if value is None]
        if not isinstance(ahead, bool):
            raise CadError(f"{what}: ahead must be True or False, got {ahead!r}", "INVALID_ARGUMENT")
        if tag is not None:
            if not ahead:
                raise CadError(f"{what}: tag must be an int and goes with ahead=True, got tag={tag!r}, ahead={ahead!r}",
                               "INVALID_ARGUMENT")
            tag = _checks.integer(tag, "tag", what)
        if ahead and missing:
            raise CadError(f"{what}(ahead=True): give num_heads, num_kv_heads, head_dim and dtype (missing: "
                           f"{', '.join(missing)}): a plan made ahead cannot wait for the first call to learn them",
                           "INVALID_ARGUMENT")
        if len(missing) == len(shapes):
            return  # made by the first call (not ahead)
        if missing:
            raise CadError(f"{what}: give num_heads, num_kv_heads, head_dim and dtype together, or none (missing: "
                           f"{', '.join(missing)})", "INVALID_ARGUMENT")
        device = self._default_device(device, cu_device)
        plan.device = device
        if ahead:
            plan.make_ahead(num_heads, num_kv_heads, head_dim, dtype, device, tag=tag)
        else:
            plan.make(num_heads, num_kv_heads, head_dim, dtype, device)

    def _default_device(self, device, cu_device):
        if device is not None:
            return torch.device(device)
        if cu_device is not None and cu_device.type == "cuda":
            return cu_device
        if torch.cuda.is_available() and self._settings["communicator"] not in ("host", "mpi"):
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _register(self, plan):
        plan_id = next(self._plan_ids)
        self._plans[plan_id] = plan
        return plan_id

    def _forget(self, plan_id):
        self._plans.pop(plan_id, None)

    def find_plan(self, plan_id):
        """The live plan `plan_id` of this context, or None."""
        return self._plans.get(plan_id)

    def plan_by_id(self, plan_id):
        plan = self._plans.get(plan_id)
        if plan is None:
            raise CadError(f"cad.varlen_attn: plan #{plan_id} of context #{self.id} was released or never existed",
                           "INVALID_ARGUMENT")
        return plan

    # ---- what forwards keep for their backwards ---------------------------------------------------------------
    def keep_saved(self, host, handle, plan):
        """Record a forward's saved state; returns its key (an int)."""
        key = next(self._saved_keys)
        self._saved[key] = (host, handle, plan)
        return key

    def saved(self, key):
        """(host, saved handle or None, plan) of a key, or None once released."""
        return self._saved.get(key)

    def release_saved(self, key):
        entry = self._saved.pop(key, None)
        if entry is not None and entry[1]:
            entry[0].release_saved(entry[1])

    def keep_served(self, plan_id, key, key_tensor):
        self._served.setdefault(plan_id, []).append((key, key_tensor))

    def take_served(self, plan_id):
        """The last state kept for plan `plan_id`'s served forwards, (key, key tensor), or None."""
        kept = self._served.get(plan_id)
        return kept.pop() if kept else None

    def release_served(self, plan_id=None):
        """Give back the state kept for other ranks' backwards (of one plan, or all of them)."""
        for pid in ([plan_id] if plan_id is not None else list(self._served)):
            for key, _ in self._served.pop(pid, []):
                self.release_saved(key)

    # ---- the documented test and diagnostics hook -------------------------------------------------------------
    def state(self):
        """A snapshot of what this context holds, for tests and diagnostics (read-only copies): "stacks"
        {(device, lane index): Host}, "plans" [plan ids alive], "saved" {key: whether the servers hold that
        forward's state}, "served" {plan id: [keys]}, "makes" (collective plan makes so far), "call_order"."""
        with self._lock:
            return {"stacks": dict(self._stacks), "plans": sorted(self._plans.keys()),
                    "saved": {k: bool(e[1]) for k, e in self._saved.items()},
                    "served": {pid: [k for k, _ in kept] for pid, kept in self._served.items() if kept},
                    "makes": self.makes, "call_order": self.call_order}

    # ---- timing -----------------------------------------------------------------------------------------------
    def attention_time(self, reset=True):
        """Seconds spent in this context's varlen_attn forward and backward calls (wall clock; with
        timing(sync_cuda=True) CUDA work is waited for, otherwise CUDA calls count only their enqueue) since the
        last reset."""
        return self.timer.take(reset)

    def attention_calls(self):
        """How many varlen_attn forward and backward calls ran since the last attention_time(reset=True): calls
        whose work ran, so a forward that activation checkpointing recomputes counts twice, one whose output a
        selective checkpointing policy saved counts once."""
        return self.timer.calls

    def timing(self, sync_cuda=False):
        self.timer.sync_cuda = bool(sync_cuda)

    def _gpu_times(self, key, device):
        """A get_stats_json section (`key`: gpu_exchange, gpu_calls) summed over the device's lanes; None without a
        stack or where none has that section."""
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        device = device_key(device)
        with self._lock:
            hosts = [h for (d, _), h in sorted(self._stacks.items(), key=lambda kv: kv[0][1])
                     if d == device and not h.closed]
        times = [t for t in (h.stats().get(key) for h in hosts) if t is not None]
        if not times:
            return None
        total = dict(times[0])
        for t in times[1:]:
            for k, v in t.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(total.get(k), (int, float)):
                    total[k] = total[k] + v
        return total

    def exchange_times(self, device=None):
        """The CUDA data path's exchanges as the GPU ran them, summed since the device's CAD stack was made (None
        without one): {"exchanges", "comm_ms" (the collectives on CAD's communication stream), "stall_ms" (how long
        the calling streams waited for them, from their data being ready), "pending" (enqueued, not finished: not
        counted yet), "untimed"}, summed over the device's lanes. Reads only what completed: never waits for the
        GPU (synchronise first to count everything). Take differences between two calls for a step's share."""
        return self._gpu_times("gpu_exchange", device)

    def call_times(self, device=None):
        """The CUDA data path's calls as the GPU ran them (timing events on the calling stream), summed since the
        device's CAD stack was made (None without one): {"forwards", "backwards", "forward_ms", "backward_ms"
        (each call from its first enqueued work to its last: exchanges, packing, compute), "forward_server_ms",
        "backward_server_ms" (the server backend's compute inside them), "pending", "untimed"}, summed over the
        device's lanes. Like exchange_times: never waits for the GPU; take differences between two calls."""
        return self._gpu_times("gpu_calls", device)

    # ---- the end ----------------------------------------------------------------------------------------------
    def _close_stacks(self):
        self.release_served()  # state kept for other ranks' backwards goes with its stack
        self.extras.clear()    # the integrations' plans were made on these stacks
        with self._lock:
            stacks = list(self._stacks.values()) + list(self._locals.values())
            self._stacks.clear()
            self._locals.clear()
        for host in stacks:
            host.close()

    def close(self):
        """Give back every stack (local, not collective; also done at exit). Plans made before are refused
        afterwards; a later plan makes new stacks with the same settings."""
        self._close_stacks()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f"cad.Context(#{self.id}, {len(self._stacks)} stack(s), {len(self._plans)} plan(s))"


def checked_pieces(pieces, what):
    """Pieces (doc_id, doc_len, offset_in_doc, len) as int tuples, each field a checked int64 (entry and field
    named on a bad one)."""
    fields = ("doc_id", "doc_len", "offset_in_doc", "len")
    out = []
    for i, piece in enumerate(pieces):
        try:
            values = tuple(piece)
        except TypeError:
            values = None
        if values is None or len(values) != 4:
            raise CadError(f"{what}: pieces[{i}] must be (doc_id, doc_len, offset_in_doc, len), got {piece!r}",
                           "INVALID_ARGUMENT")
        out.append(tuple(_checks.integer(v, f"pieces[{i}].{name}", what, 0 if name != "doc_id" else _checks.INT64_MIN)
                         for v, name in zip(values, fields)))
    return out


_open = weakref.WeakSet()  # every context not yet collected, closed at exit


def close_all():
    """Close every context (at exit, before the interpreter tears modules and torch's process groups down in no
    particular order: the stacks, their plugins' threads and communicators go first, while what they use exists)."""
    with _registry_lock:
        contexts = sorted(_open, key=lambda c: -c.id)
    for context in contexts:
        context.close()


atexit.register(close_all)
