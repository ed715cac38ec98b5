"""How a trainer runs under a launcher: whether it was started with several ranks, a failing rank leaving at
once, and every rank's floats gathered over a gloo group of the trainer's own."""
import os
import sys

import torch
import torch.distributed as dist


def launched_distributed():
    """Started by torchrun (or another launcher) with more than one rank."""
    return "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1


def run_exiting_on_failure(name, train_function, args):
    """train_function(args); under torchrun a rank that fails leaves at once, skipping the interpreter's teardown.
    On 4 GPUs (2026-11-26) a rank out of memory stayed alive until every peer's 120 s timeout had passed, most
    likely in that teardown (destroying NCCL communicators whose peers are still inside a collective). Exiting now
    lets torchrun end the peers right away. Its traceback is on stderr."""
    try:
        train_function(args)
    except BaseException:
        if not launched_distributed():
            raise
        import traceback
        traceback.print_exc()
        sys.stderr.write(f"{name}: rank {os.environ.get('RANK', '?')} failed; exiting without teardown\n")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.exit(0)


def all_gather_floats(values, world):
    t = torch.tensor(values, dtype=torch.float64)
    if world == 1:
        return [t.tolist()]
    out = [torch.zeros_like(t) for _ in range(world)]
    dist.all_gather(out, t, group=_cpu_group())
    return [o.tolist() for o in out]


_GROUP = {}


def _cpu_group():
    if "g" not in _GROUP:
        _GROUP["g"] = dist.new_group(backend="gloo")
    return _GROUP["g"]
