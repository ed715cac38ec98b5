"""examples/train_pipeline.py when a stage fails: a stage that stalls or raises in a tick ends every rank with an
error naming its stage, tick, micro-batch and rank, within the timeout. The processes are started here without
torchrun, so nothing else ends them; each runs the trainer's own entry (its __main__, sys.argv, the launcher's
environment), forked from the ranks' forkserver, which imported torch and transformers once."""
import os
import pathlib
import runpy
import sys
import time

import pytest

import harness

REPO = pathlib.Path(__file__).resolve().parents[2]
TRAINER = REPO / "examples" / "train_pipeline.py"
DATA = pathlib.Path(os.environ.get("CAD_DATA", REPO.parent / "shared" / "data" / "doclen_pretrain.json"))
needs_data = pytest.mark.skipif(not DATA.exists(), reason=f"no Pretrain data at {DATA}")


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _trainer_rank(rank, world, port, argv, out_dir):
    """One rank of examples/train_pipeline.py run as its command line runs it (its __main__, sys.argv, the
    launcher's environment), its stdout and stderr (file descriptors 1 and 2: Python's and the library's) in
    out_dir. A failing rank leaves through the trainer's own os._exit(1)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    for fd, name in ((1, "stdout"), (2, "stderr")):
        with open(os.path.join(out_dir, f"{name}{rank}.txt"), "w") as f:
            os.dup2(f.fileno(), fd)
    sys.argv = [str(TRAINER), *argv]
    runpy.run_path(str(TRAINER), run_name="__main__")


def _launch(world, argv, timeout_s, tmp_path):
    """The trainer's command line on `world` processes started here (no torchrun, which would end the others when
    one fails): returns per rank (exit code, seconds until it exited, stderr)."""
    ctx = harness.context(harness.TRANSFORMERS)
    port = _free_port()
    procs = [ctx.Process(target=_trainer_rank, args=(r, world, port, list(argv), str(tmp_path)))
             for r in range(world)]
    start = time.monotonic()
    for p in procs:
        p.start()
    ended = [None] * world
    while any(e is None for e in ended) and time.monotonic() - start < timeout_s:
        for r, p in enumerate(procs):
            if ended[r] is None and p.exitcode is not None:
                ended[r] = time.monotonic() - start
        time.sleep(0.05)
    for p in procs:
        if p.exitcode is None:
            p.kill()
        p.join()
    return [(p.exitcode, ended[r], (tmp_path / f"stderr{r}.txt").read_text()) for r, p in enumerate(procs)]


FAULT_ARGS = ["--attention", "cad", "--pool", "tick", "--layers", "2", "--hidden", "64", "--intermediate", "96",
              "--context", "256", "--micro-batches", "4", "--steps", "1", "--pp", "2", "--timeout-ms", "2000"]


@needs_data
def test_a_stalled_stage_ends_every_rank_naming_the_tick(tmp_path):
    """Stage 1 stalls (6 s: 3 x the 2 s timeout) at the start of forward tick 2. Stage 0 is then inside that
    tick's CAD calls (micro-batch 2) and must give up after the timeout, naming its stage, tick, micro-batch and
    rank -- long before the stalled rank wakes up; the stalled rank fails at its next call (its peer is gone),
    naming its own tick (micro-batch 1)."""
    (rc0, t0, err0), (rc1, t1, err1) = _launch(2, FAULT_ARGS + ["--data", str(DATA), "--test-fault",
                                                                "1:forward:2:stall"], 90, tmp_path)
    assert rc0 != 0 and rc1 != 0, (rc0, rc1, err0[-3000:], err1[-3000:])
    assert "pipeline: rank 0 (stage 0, replica 0): forward tick 2 (micro-batch 2) of step 0 failed" in err0, \
        err0[-3000:]
    assert "train_pipeline: rank 0 failed; exiting without teardown" in err0
    assert "pipeline: rank 1 (stage 1, replica 0): forward tick 2 (micro-batch 1) of step 0 failed" in err1, \
        err1[-3000:]
    assert "test fault: rank 1 stalls for 6 s at forward tick 2" in err1
    # rank 0 ended by its own timeout, not by rank 1 waking up (which takes 6 s from the same moment)
    assert t1 - t0 > 2.0, (t0, t1)


@needs_data
def test_a_stage_that_raises_ends_every_rank_naming_the_tick(tmp_path):
    """Stage 1 raises at the start of backward tick 1; stage 0, waiting in that tick for micro-batch 3's gradient
    from stage 1, fails within the timeout naming its tick."""
    (rc0, t0, err0), (rc1, t1, err1) = _launch(2, FAULT_ARGS + ["--data", str(DATA), "--test-fault",
                                                                "1:backward:1:raise"], 90, tmp_path)
    assert rc0 != 0 and rc1 != 0, (rc0, rc1, err0[-3000:], err1[-3000:])
    assert "pipeline: rank 1 (stage 1, replica 0): backward tick 1 (micro-batch 2) of step 0 failed" in err1
    assert "test fault: rank 1 raises at backward tick 1" in err1
    assert "pipeline: rank 0 (stage 0, replica 0): backward tick 1 (micro-batch 3) of step 0 failed" in err0, \
        err0[-3000:]
    assert t0 - t1 < 2.0 + 5.0, (t0, t1)  # within the timeout (and a margin) of rank 1's failure


@needs_data
def test_a_stalled_stage_under_1f1b_ends_every_rank_naming_the_tick(tmp_path):
    """1F1B, CAD over the world: stage 0 stalls at the start of tick 3 (its backward of micro-batch 0), where
    stage 1 runs the forward of micro-batch 1 and, by the tick's call order, waits inside the calls it shares
    with stage 0: it gives up after the timeout naming its stage, tick and micro-batch."""
    (rc0, t0, err0), (rc1, t1, err1) = _launch(2, FAULT_ARGS + ["--schedule", "1f1b", "--data", str(DATA),
                                                                "--test-fault", "0:backward:3:stall"], 90, tmp_path)
    assert rc0 != 0 and rc1 != 0, (rc0, rc1, err0[-3000:], err1[-3000:])
    assert "pipeline: rank 1 (stage 1, replica 0): forward tick 3 (micro-batch 1) of step 0 failed" in err1, \
        err1[-3000:]
    assert "test fault: rank 0 stalls for 6 s at backward tick 3" in err0
    assert t0 - t1 > 2.0, (t0, t1)  # rank 1 ended by its own timeout, long before rank 0 woke up
