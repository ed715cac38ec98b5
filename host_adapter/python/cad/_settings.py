"""What a CAD stack is built from: the settings a cad.Context (and cad.init) takes, checked in one place, and the
stack config they generate.

  CPU:  communicator "host" (torch.distributed over gloo, lent through the ABI v1.1 host collectives; works
        under torchrun) -- or "mpi" under mpirun --, server backend "reference";
  CUDA: communicator "nccl", bootstrapped through torch.distributed (no MPI), server backend "cuda".
"""
import json
import os
import pathlib

import torch

from . import _checks
from ._errors import CadError
from . import server_backend as _server_backend

DEFAULTS = {
    "config": None,               # a user stack config (dict or path); overrides everything below
    "communicator": None,         # "host", "mpi", "nccl" (default per device, see above)
    "balancer": "prefix_aware",
    "balancer_config": None,      # the balancer plugin's config keys, e.g. {"tolerance": 0.005} (None: its defaults)
    "keep_forward_tensors": "auto",
    "min_shard_tokens": 0,
    "memory_cap_bytes": 0,        # most Q/K/V/O bytes a server receives per call (the balancers' cap; 0: none)
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
    "server_backend": "default",  # what runs the server batches: "default" (ours), "fa4", "torch", or one per direction
                                  # ({"forward": ..., "backward": ...} or "FORWARD+BACKWARD"): cad.server_backend
}


def checked(what="cad.init", config=None, **given):
    """The settings `given` (cad.init's / cad.Context's keywords) over DEFAULTS, each checked; a CadError names
    the first one that is wrong."""
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise CadError(f"{what}: unknown setting(s) {unknown}; the settings are {sorted(DEFAULTS)}", "INVALID_ARGUMENT")
    s = dict(DEFAULTS, **given)
    if s["keep_forward_tensors"] not in (True, False, "auto"):
        raise CadError(f"{what}: keep_forward_tensors must be True, False or 'auto', got {s['keep_forward_tensors']!r}")
    if s["comm_stream_priority"] not in ("highest", "normal"):
        raise CadError(f"{what}: comm_stream_priority must be 'highest' or 'normal', got {s['comm_stream_priority']!r}")
    _bounded(s, "nccl_max_ctas", what, 0, 64, "(0: NCCL's default)")
    if not isinstance(s["own_tasks_in_place"], bool):
        raise CadError(f"{what}: own_tasks_in_place must be True or False, got {s['own_tasks_in_place']!r}")
    _bounded(s, "own_tasks_reserve_sms", what, 0, 64)
    if s["forward_walk"] not in ("static", "dynamic"):
        raise CadError(f"{what}: forward_walk must be 'static' or 'dynamic', got {s['forward_walk']!r}")
    if not isinstance(s["nccl_copy_engines"], bool):
        raise CadError(f"{what}: nccl_copy_engines must be True or False, got {s['nccl_copy_engines']!r}")
    _bounded(s, "head_groups", what, 1, 64, "dividing the model's heads")
    # One name where both directions agree, else {"forward": ..., "backward": ...}: one spelling per choice.
    forward, backward = _server_backend.directions(s["server_backend"], f"{what}: server_backend")
    s["server_backend"] = forward if forward == backward else {"forward": forward, "backward": backward}
    s["timeout_ms"] = _checks.integer(s["timeout_ms"], "timeout_ms", what, 1, _checks.INT32_MAX)
    s["min_shard_tokens"] = _checks.integer(s["min_shard_tokens"], "min_shard_tokens", what, 0)
    s["memory_cap_bytes"] = _checks.integer(s["memory_cap_bytes"], "memory_cap_bytes", what, 0)
    balancer_config = s["balancer_config"]
    if balancer_config is not None and (not isinstance(balancer_config, dict) or
                                        not all(isinstance(k, str) for k in balancer_config)):
        raise CadError(f"{what}: balancer_config must be a dict of the balancer's config keys (e.g. "
                       f"{{'tolerance': 0.005}}) or None, got {balancer_config!r}")
    s["balancer_config"] = dict(balancer_config) if balancer_config else None
    s["nccl_blocking_comm"] = bool(s["nccl_blocking_comm"])
    if isinstance(config, (str, pathlib.Path)):
        config = json.loads(pathlib.Path(config).read_text())
    s["config"] = config
    return s


def _bounded(s, name, what, low, high, note=""):
    value = s[name]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CadError(f"{what}: {name} must be an int in [{low}, {high}]{' ' + note if note else ''}, got {value!r}")


def keeps_forward(settings, in_backward):
    """Whether a forward that needs a backward asks the servers to keep its tensors (keep_forward_tensors)."""
    mode = settings["keep_forward_tensors"]
    return in_backward if mode == "auto" else bool(mode)


def default_communicator(device):
    if device.type == "cuda":
        return "nccl"
    mpi_launched = "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ
    dist_up = torch.distributed.is_available() and torch.distributed.is_initialized()
    return "mpi" if mpi_launched and not dist_up else "host"


def stack_config(device, settings):
    """The generated CAD stack config for `device` from `settings` (what cad.init's arguments mean)."""
    s = dict(settings)
    comm = s["communicator"] or default_communicator(device)
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
    if int(s.get("memory_cap_bytes", 0)):  # prefix_aware plans within it; the other balancers refuse a plan over it
        cad_config["memory_cap_bytes"] = int(s["memory_cap_bytes"])
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
    if s.get("server_backend", "default") != "default":  # Python's kernels through the callback plugin
        instances[-1:] = _server_backend.instances(s["server_backend"], device, instances[-1])
    elif device.type == "cuda" and cad_config["own_tasks_in_place"]:
        instances.append({"name": "server_own", "plugin": "cuda",
                          "config": {"reserve_sms": int(s.get("own_tasks_reserve_sms", 0)), "forward_walk": "dynamic"}})
        cad_config["own_server_backend"] = "server_own"
    instances.append({"name": "cad", "plugin": "cad", "config": cad_config})
    return {"log_level": s["log_level"], "instances": instances, "attention": "cad"}
