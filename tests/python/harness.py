"""Running a test body on N CPU processes under a gloo process group, with a deadline: a rank that hangs fails the
test instead of stalling CI.

The ranks are forked from a forkserver that imported torch once (BASE; started at a suite's first run, with the
environment of that moment), not spawned: a spawned rank imports torch again, about 3 s of CPU each, and the
suites start hundreds of ranks (on CI's two cores that was most of their time). Nothing CAD-specific is
imported before the fork: the package, its library and its threads start in each rank. A suite whose ranks build
transformers models asks for TRANSFORMERS too (its Llama modules cost about 3 s of CPU per rank to import); the
others do not, so that their server does not pay for it."""
import os
import socket
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, body, args, errors):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    import datetime
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        import cad
        cad.init(timeout_ms=20000)
        body(rank, world, *args)
    except BaseException:  # noqa: BLE001 -- reported to the parent
        errors.put((rank, traceback.format_exc()))
        raise
    finally:
        import cad
        cad.shutdown()
        # Leave together: a rank whose peers already closed their gloo connections can abort in teardown.
        dist.barrier()
        dist.destroy_process_group()


# What every rank imports: torch, and torch.nn.attention.varlen (import cad brings it in for cad.varlen; it imports
# torch._dynamo, about 1.2 s of CPU when the machine is idle, more than a small run's ranks compute).
BASE = ("torch", "torch.distributed", "torch.nn.attention.varlen")
# Modules of transformers that a rank building a Llama (cad.train.model, AutoModelForCausalLM) imports.
TRANSFORMERS = ("transformers", "transformers.models.auto.modeling_auto", "transformers.models.llama.modeling_llama")


def context(preload=()):
    """The forkserver context whose server imports BASE and `preload` when it starts (at a suite's first run: a
    later run's `preload` is not read, and a module it names is then imported per rank, as before)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([*BASE, *preload])
    return ctx


def run(world, body, *args, timeout_s=120, preload=()):
    """Run body(rank, world, *args) on `world` processes; raise with every failing rank's traceback."""
    ctx = context(preload)
    errors = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, body, args, errors)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout_s)
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    if hung:
        raise AssertionError(f"ranks {hung} of {world} did not finish within {timeout_s} s")
    if failures or any(p.exitcode != 0 for p in procs):
        text = "\n".join(f"--- rank {r}:\n{tb}" for r, tb in sorted(failures))
        raise AssertionError(f"{len(failures)} rank(s) failed (exit codes {[p.exitcode for p in procs]}):\n{text}")
