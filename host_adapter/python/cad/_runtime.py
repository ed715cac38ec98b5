"""The stacks the package runs on: one CAD stack per device and lane (communicator, balancer, server backend,
then "cad"), made collectively on first use, and one plain local backend per device for `plan=None` calls.

Lanes: a plan names the lane whose stack makes and runs it (cad.plan(..., lane=i), default 0). Each lane's stack
has its own communicator -- on CUDA its own NCCL communicator and communication stream --, because one stack
runs its exchanges in the order they were enqueued: two nano-batches on one stack (ping-pong) put nano-batch 1's
send behind nano-batch 0's return, which waits for nano-batch 0's attention, so nothing of nano-batch 1's
exchange could hide under it. On separate lanes each waits only for its own data. A lane's stack is made by the
first plan that names it (collectively: every rank asks for the same lanes in the same order).

`cad.init(...)` chooses how the CAD stack is built; without it the defaults below apply:
  CPU:  communicator "host" (torch.distributed over gloo, lent through the ABI v1.1 host collectives; works
        under torchrun) -- or "mpi" under mpirun --, server backend "reference";
  CUDA: communicator "nccl", bootstrapped through torch.distributed (no MPI), server backend "cuda".
"""
import atexit
import json
import os
import pathlib
import threading
import time

import torch

from ._collectives import Collectives
from ._errors import CadError
from ._host import Host
from ._planner import Planner

_settings = {
    "config": None,               # a user stack config (dict or path); overrides everything below
    "communicator": None,         # "host", "mpi", "nccl" (default per device, see above)
    "balancer": "prefix_aware",
    "balancer_config": None,      # the balancer plugin's config keys, e.g. {"tolerance": 0.005} (None: its defaults)
    "keep_forward_tensors": "auto",
    "min_shard_tokens": 0,
    "timeout_ms": 60000,
    "group": None,                # torch.distributed group (None: the default group)
    "log_level": "warn",
    "comm_stream_priority": "highest",  # CAD's CUDA communication stream ("highest" or "normal")
    "nccl_max_ctas": 0,           # CTAs of CAD's NCCL operations at most (0: NCCL's default)
    "nccl_blocking_comm": False,  # CAD's NCCL communicator blocking (launches on the calling thread)
    "nccl_copy_engines": False,   # CAD's all-to-alls by the GPUs' copy engines (one host), not NCCL's kernels
    "own_tasks_in_place": False,  # a server runs the tasks on documents it holds whole on its own tensors
    "own_tasks_reserve_sms": 16,  # on GPUs: SMs their forward kernel leaves to the collective beside it
    "forward_walk": "static",     # on GPUs: the server's forward kernel's walk ("static" or "dynamic")
    "head_groups": 1,             # on GPUs: the server batch's heads run and move in this many pipelined groups
}
_DEFAULTS = dict(_settings)  # what cad.shutdown() goes back to
_runtimes = {}  # (device, lane) -> Host
_locals = {}
MAX_LANES = 4  # a stack per lane holds a communicator (an NCCL one on CUDA): a small, fixed number
_lock = threading.Lock()


def init(config=None, *, communicator=None, balancer="prefix_aware", keep_forward_tensors="auto", min_shard_tokens=0,
         timeout_ms=60000, group=None, log_level="warn", comm_stream_priority="highest", nccl_max_ctas=0,
         nccl_blocking_comm=False, nccl_copy_engines=False, balancer_config=None, own_tasks_in_place=False,
         own_tasks_reserve_sms=16, forward_walk="static", head_groups=1):
    """Choose how CAD stacks are built (call before the first plan; drops stacks made with older settings).

    config: a full stack config (dict, JSON file path) whose "attention" names the CAD instance; the other
    arguments then do not apply. communicator: "host" (torch.distributed/gloo, CPU memory), "mpi" (under
    mpirun) or "nccl" (CUDA; bootstrapped through torch.distributed). balancer: "colocated", "per_doc_cp",
    "distca", "prefix_aware". balancer_config: that balancer's config keys (docs/balancers.md), e.g.
    {"tolerance": 0.005} for prefix_aware: a plan within 0.5% of the mean instead of 2% (more bytes, better
    balance: where links are fast); None: the plugin's defaults. keep_forward_tensors: where a forward's Q/K/V/O/LSE wait for its backward --
    True: on the servers that computed it (the backward then moves only dO out and gradients back; the owner
    keeps no copy, but the servers' O is a second copy of the output), False: on the owners, as local attention
    keeps them (the backward re-sends them), "auto" (default): kept on the servers only for a forward that runs
    inside a backward -- a recomputed layer under activation checkpointing, whose state lives until that
    layer's backward a moment later --, re-sent otherwise, so that CAD holds no more than local attention.
    timeout_ms: every collective's deadline. group: the torch.distributed group CAD spans.
    comm_stream_priority: "highest" (default) or "normal", the priority of CAD's CUDA communication stream;
    nccl_max_ctas: at most this many CTAs (SMs) per NCCL operation of CAD's communicator (0: NCCL's default).
    Both matter where exchanges run beside compute (ping-pong): an exchange waiting for a late peer holds its
    SMs (plugins/cad/README.md, docs/nccl.md). nccl_blocking_comm: a blocking NCCL communicator for CAD (the
    nccl plugin's blocking_comm): its operations launch on the calling thread instead of a job thread of NCCL's
    own that the caller waits for (measured 2.4-5 ms per exchange under ping-pong, docs/multi_gpu.md), at the
    price of no deadline while an enqueue waits for a peer (docs/nccl.md). nccl_copy_engines: CAD's all-to-alls
    move through the GPUs' copy engines and CUDA IPC (the nccl plugin's copy_engines; every rank on one host, its
    GPUs reaching each other): no SM is used, so an exchange can run beside the persistent attention kernels that
    NCCL's kernels wait behind (head_groups). own_tasks_in_place: True: a rank runs
    the tasks on documents it holds whole in place on its own tensors, on GPUs while one collective moves the other
    rows; False (default): they go through the exchange to itself like every other task (the plugin's
    own_tasks_in_place, plugins/cad/README.md; measured no faster on 2 H200s, docs/multi_gpu.md runs 30-32).
    own_tasks_reserve_sms: on GPUs, the SMs their forward kernel (persistent, one block per SM) leaves free for the
    collective that runs beside it; 0: every SM. A second 'cuda' backend instance runs them, with that 'reserve_sms'
    and the dynamic walk (its blocks take the next untaken unit, so that those whose SM the collective holds at
    first take fewer). forward_walk: on GPUs, the walk of the server's forward kernel: "static" (default; each
    block a fixed share, what `cad simulate` models) or "dynamic" (the 'cuda' backend's forward_walk).
    head_groups: on GPUs over NCCL, each call's heads split into this many groups (a divisor of the model's query
    and key/value heads): the server computes group g while group g + 1's rows arrive and group g - 1's results
    leave, so that only the first group's inbound and the last group's outbound exchange are left exposed
    (the plugin's head_groups, plugins/cad/README.md); 1 (default): one exchange per tensor, unsplit.
    """
    if keep_forward_tensors not in (True, False, "auto"):
        raise CadError(f"cad.init: keep_forward_tensors must be True, False or 'auto', got {keep_forward_tensors!r}")
    if comm_stream_priority not in ("highest", "normal"):
        raise CadError(f"cad.init: comm_stream_priority must be 'highest' or 'normal', got {comm_stream_priority!r}")
    if isinstance(nccl_max_ctas, bool) or not isinstance(nccl_max_ctas, int) or not 0 <= nccl_max_ctas <= 64:
        raise CadError(f"cad.init: nccl_max_ctas must be an int in [0, 64] (0: NCCL's default), got {nccl_max_ctas!r}")
    if not isinstance(own_tasks_in_place, bool):
        raise CadError(f"cad.init: own_tasks_in_place must be True or False, got {own_tasks_in_place!r}")
    if isinstance(own_tasks_reserve_sms, bool) or not isinstance(own_tasks_reserve_sms, int) or \
            not 0 <= own_tasks_reserve_sms <= 64:
        raise CadError(f"cad.init: own_tasks_reserve_sms must be an int in [0, 64], got {own_tasks_reserve_sms!r}")
    if forward_walk not in ("static", "dynamic"):
        raise CadError(f"cad.init: forward_walk must be 'static' or 'dynamic', got {forward_walk!r}")
    if not isinstance(nccl_copy_engines, bool):
        raise CadError(f"cad.init: nccl_copy_engines must be True or False, got {nccl_copy_engines!r}")
    if isinstance(head_groups, bool) or not isinstance(head_groups, int) or not 1 <= head_groups <= 64:
        raise CadError(f"cad.init: head_groups must be an int in [1, 64] dividing the model's heads, got {head_groups!r}")
    if balancer_config is not None and (not isinstance(balancer_config, dict) or
                                        not all(isinstance(k, str) for k in balancer_config)):
        raise CadError(f"cad.init: balancer_config must be a dict of the balancer's config keys (e.g. "
                       f"{{'tolerance': 0.005}}) or None, got {balancer_config!r}")
    if isinstance(config, (str, pathlib.Path)):
        config = json.loads(pathlib.Path(config).read_text())
    with _lock:
        _settings.update(config=config, communicator=communicator, balancer=balancer,
                         balancer_config=dict(balancer_config) if balancer_config else None,
                         keep_forward_tensors=keep_forward_tensors, min_shard_tokens=min_shard_tokens,
                         timeout_ms=timeout_ms, group=group, log_level=log_level,
                         comm_stream_priority=comm_stream_priority, nccl_max_ctas=nccl_max_ctas,
                         nccl_blocking_comm=bool(nccl_blocking_comm), nccl_copy_engines=nccl_copy_engines,
                         own_tasks_in_place=own_tasks_in_place,
                         own_tasks_reserve_sms=own_tasks_reserve_sms, forward_walk=forward_walk,
                         head_groups=head_groups)
        for runtime in _runtimes.values():
            runtime.close()
        _runtimes.clear()


def _default_communicator(device):
    if device.type == "cuda":
        return "nccl"
    mpi_launched = "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ
    dist_up = torch.distributed.is_available() and torch.distributed.is_initialized()
    return "mpi" if mpi_launched and not dist_up else "host"


def stack_config(device, settings=None):
    """The generated CAD stack config for `device` (what cad.init's arguments mean)."""
    s = dict(_settings if settings is None else settings)
    comm = s["communicator"] or _default_communicator(device)
    timeout = int(s["timeout_ms"])
    if comm == "nccl":
        comm_config = {"bootstrap": "host", "device": device.index if device.index is not None else
                       torch.cuda.current_device(), "timeout_ms": timeout}
        if s.get("nccl_max_ctas"):
            comm_config["max_ctas"] = int(s["nccl_max_ctas"])
        if s.get("nccl_blocking_comm"):
            comm_config["blocking_comm"] = True
        if s.get("nccl_copy_engines"):
            comm_config["copy_engines"] = True
    elif comm in ("host", "mpi"):
        comm_config = {"timeout_ms": timeout}
    else:
        raise CadError(f"cad.init: communicator '{comm}' is not one of 'host', 'mpi', 'nccl'")
    instances = [{"name": "comm", "plugin": comm, "config": comm_config}]
    cad_config = {"communicator": "comm", "balancer": "balancer", "server_backend": "server",
                  "keep_forward_tensors": s["keep_forward_tensors"] is not False,
                  "min_shard_tokens": int(s["min_shard_tokens"]),
                  "comm_stream_priority": s.get("comm_stream_priority", "highest"),
                  "own_tasks_in_place": bool(s.get("own_tasks_in_place", False))}
    if int(s.get("head_groups", 1)) != 1:  # the plugin's default otherwise
        cad_config["head_groups"] = int(s["head_groups"])
    if comm != "mpi":
        # Plans made ahead (cad.plan(ahead=True)) gather over torch.distributed's gloo on a thread of their own:
        # a communicator instance of their own, never the data path's.
        instances.append({"name": "plan_comm", "plugin": "host", "config": {"timeout_ms": timeout}})
        cad_config["plan_communicator"] = "plan_comm"
    walk = s.get("forward_walk", "static")  # the cuda backend's key, given only where it is not its default
    instances += [
        {"name": "balancer", "plugin": s["balancer"], "config": dict(s.get("balancer_config") or {})},
        {"name": "server", "plugin": "cuda" if device.type == "cuda" else "reference",
         "config": {"forward_walk": walk} if device.type == "cuda" and walk != "static" else {}},
    ]
    if device.type == "cuda" and cad_config["own_tasks_in_place"]:
        instances.append({"name": "server_own", "plugin": "cuda",
                          "config": {"reserve_sms": int(s.get("own_tasks_reserve_sms", 0)), "forward_walk": "dynamic"}})
        cad_config["own_server_backend"] = "server_own"
    instances.append({"name": "cad", "plugin": "cad", "config": cad_config})
    return {"log_level": s["log_level"], "instances": instances, "attention": "cad"}


def keeps_forward(in_backward):
    """Whether a forward that needs a backward asks the servers to keep its tensors (see init)."""
    mode = _settings["keep_forward_tensors"]
    return in_backward if mode == "auto" else bool(mode)


def _key(device):
    """The device a stack is kept under: cuda with its index (the current one when none is given); other devices
    by their type alone, so that "cpu" and "cpu:0" (a trainer's torch.device("cpu", 0)) find the same stack."""
    device = torch.device(device)
    if device.type == "cuda":
        return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
    return torch.device(device.type)


def _cached(table, key, make):
    """table[key], made by make(key) on first use."""
    with _lock:
        host = table.get(key)
        if host is None:
            host = table[key] = make(key)
        return host


def check_lane(lane, what="cad.plan"):
    if isinstance(lane, bool) or not isinstance(lane, int) or not 0 <= lane < MAX_LANES:
        raise CadError(f"{what}: lane must be an int in [0, {MAX_LANES}), got {lane!r}", "INVALID_ARGUMENT")
    return lane


def _make_cad_stack(key):
    device, _lane = key
    config = _settings["config"] or stack_config(device)
    collectives = Collectives(_settings["group"], int(_settings["timeout_ms"]))
    return Host(config, config.get("attention", "cad"), collectives)


def _make_local_backend(device):
    plugin = "cuda" if device.type == "cuda" else "reference"
    return Host({"log_level": _settings["log_level"], "instances": [{"name": "local", "plugin": plugin, "config": {}}],
                 "attention": "local"}, "local")


def existing(device, lane=0):
    """The CAD stack for `device` and `lane` if one is up (None otherwise); makes nothing."""
    with _lock:
        return _runtimes.get((_key(device), lane))


def runtime(device, lane=0):
    """The CAD stack for `device` and `lane`, made on first use (collective over the group: every rank gets
    here)."""
    return _cached(_runtimes, (_key(device), check_lane(lane)), _make_cad_stack)


def local_backend(device):
    """A plain varlen attention backend for `device` ("reference" on CPU, "cuda" on GPU); no communication."""
    return _cached(_locals, _key(device), _make_local_backend)


def planner(host):
    """The planning thread of CAD stack `host` (made on first use). Refuses a stack whose CAD instance has no
    plan communicator (a user config without "plan_communicator", or communicator "mpi")."""
    with _lock:
        if host.planner is None:
            cad = next((i for i in host.config.get("instances", []) if i.get("name") == host.name), {})
            if not cad.get("config", {}).get("plan_communicator"):
                raise CadError(f"cad.plan(ahead=True): the CAD instance '{host.name}' has no \"plan_communicator\" "
                               f"(communicator 'mpi', or a config given to cad.init without one), so a plan made on "
                               f"another thread would share the data path's communicator; use ahead=False, or name a "
                               f"communicator instance of its own (plugin \"host\") as plan_communicator",
                               "UNSUPPORTED")
            host.planner = Planner(host, host.collectives, int(_settings["timeout_ms"]))
        return host.planner


def planning_wait_limit_s():
    """How long a caller waits for a plan made ahead: its three collectives' timeouts, and some slack."""
    return 3 * int(_settings["timeout_ms"]) / 1e3 + 5.0


def shutdown():
    """Destroy every stack (also done at exit) and forget cad.init's settings: a later stack is built from the
    defaults unless cad.init is called again (a failed or test-only cad.init must not outlive its user)."""
    from . import _ops
    _ops.release_served()  # state kept for other ranks' backwards (cad.CallOrder) goes with its stack
    with _lock:
        for rt in list(_runtimes.values()) + list(_locals.values()):
            rt.close()
        _runtimes.clear()
        _locals.clear()
        _settings.clear()
        _settings.update(_DEFAULTS)


# At exit, before the interpreter tears modules and torch's process groups down in no particular order: the
# stacks (and their plugins' threads and communicators) go first, while everything they use still exists.
atexit.register(shutdown)


def _gpu_times(key, device):
    """A get_stats_json section that sums over lanes (`key`: gpu_exchange, gpu_calls), summed over the device's
    CAD stacks; None without one or where none has that section."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    device = _key(device)
    with _lock:
        hosts = [h for (d, _), h in sorted(_runtimes.items(), key=lambda kv: kv[0][1]) if d == device and not h.closed]
    times = [t for t in (h.stats().get(key) for h in hosts) if t is not None]
    if not times:
        return None
    total = dict(times[0])
    for t in times[1:]:
        for k, v in t.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(total.get(k), (int, float)):
                total[k] = total[k] + v
    return total


def exchange_times(device=None):
    """The CUDA data path's exchanges as the GPU ran them, summed since the device's CAD stack was made (None
    without one): {"exchanges", "comm_ms" (the collectives on CAD's communication stream), "stall_ms" (how long
    the calling streams waited for them, from their data being ready), "pending" (enqueued, not finished: not
    counted yet), "untimed"}, summed over the device's lanes. Reads only what completed: never waits for the
    GPU (synchronise first to count everything). Take differences between two calls for a step's share."""
    return _gpu_times("gpu_exchange", device)


def call_times(device=None):
    """The CUDA data path's calls as the GPU ran them (timing events on the calling stream), summed since the
    device's CAD stack was made (None without one): {"forwards", "backwards", "forward_ms", "backward_ms" (each
    call from its first enqueued work to its last: exchanges, packing, compute), "forward_server_ms",
    "backward_server_ms" (the server backend's compute inside them), "pending", "untimed"}, summed over the
    device's lanes. The ranks' server times show the balance the GPUs got, against the plan's prediction. Like
    exchange_times: never waits for the GPU; take differences between two calls."""
    return _gpu_times("gpu_calls", device)


# ---- attention time, as trainers report it -----------------------------------------------------------
class _Timer:
    seconds = 0.0
    calls = 0
    sync_cuda = False


def attention_time(reset=True):
    """Seconds spent in varlen_attn forward and backward calls (wall clock; with cad.timing(sync_cuda=True)
    CUDA work is waited for, otherwise CUDA calls count only their enqueue) since the last reset."""
    seconds = _Timer.seconds
    if reset:
        _Timer.seconds, _Timer.calls = 0.0, 0
    return seconds


def attention_calls():
    """How many varlen_attn forward and backward calls ran since the last attention_time(reset=True): calls whose
    work ran, so a forward that activation checkpointing recomputes counts twice, one whose output a selective
    checkpointing policy saved counts once."""
    return _Timer.calls


def timing(sync_cuda=False):
    _Timer.sync_cuda = sync_cuda


class timed:
    def __init__(self, device):
        self.device = device

    def __enter__(self):
        if _Timer.sync_cuda and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        if _Timer.sync_cuda and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        _Timer.seconds += time.perf_counter() - self.start
        _Timer.calls += 1
        return False
