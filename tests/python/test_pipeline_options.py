"""The pipeline trainer's parts that run in one process: the GPipe and 1F1B timetables (cad.train.schedule), the
deadline of a tick's wait for its GPU work (cad.train.pipeline_stage), and the command line
(cad.train.pipeline_args): --help, the defaults and the refusals."""
import os
import pathlib
import time

import pytest

from cad.train.pipeline_args import configurations, parse_args
from cad.train.pipeline_stage import wait_for_device
from cad.train.schedule import Layout, bubble_tick, forward_micro_batch, mirrored_tick, one_f_one_b, ticks

REPO = pathlib.Path(__file__).resolve().parents[2]
DATA = pathlib.Path(os.environ.get("CAD_DATA", REPO.parent / "shared" / "data" / "doclen_pretrain.json"))


def test_gpipe_schedule():
    M, S = 4, 2
    assert ticks(M, S) == 5
    assert [forward_micro_batch(0, k, M) for k in range(5)] == [0, 1, 2, 3, None]
    assert [forward_micro_batch(1, k, M) for k in range(5)] == [None, 0, 1, 2, 3]
    # backward tick b runs forward tick T-1-b's micro-batches on every stage: the last stage starts
    assert [forward_micro_batch(1, mirrored_tick(b, M, S), M) for b in range(5)] == [3, 2, 1, 0, None]
    assert [forward_micro_batch(0, mirrored_tick(b, M, S), M) for b in range(5)] == [None, 3, 2, 1, 0]
    # the ticks --pool bubble pools: some stage idle (fill t < S - 1, drain t >= M)
    assert [bubble_tick(k, M, S) for k in range(5)] == [True, False, False, False, True]
    assert [bubble_tick(k, 4, 3) for k in range(6)] == [True, True, False, False, True, True]
    assert [bubble_tick(k, 2, 3) for k in range(4)] == [True] * 4  # fewer micro-batches than stages: no steady tick
    layout = Layout(5, 6, 3)  # 3 stages x 2 replicas, stage-major
    assert (layout.stage, layout.replica, layout.dp) == (2, 1, 2) and layout.last and not layout.first
    assert layout.stage_ranks(1) == [2, 3] and layout.rank_of(1, 1) == 3
    with pytest.raises(ValueError, match="not divisible by --pp 4"):
        Layout(0, 6, 4)


@pytest.mark.parametrize("M,S", [(4, 2), (4, 3), (8, 4), (2, 3), (1, 2)])
def test_one_f_one_b_timetable(M, S):
    """Every forward and backward of every (stage, micro-batch) exactly once, each after what it needs (the stage
    before's forward, the stage after's backward, on the last stage its own forward) at an earlier tick; stage s
    holds at most min(S - s, M) micro-batches in flight (GPipe: M); forwards before backwards, each in order."""
    table = one_f_one_b(M, S)
    at = {}
    for tick, row in enumerate(table):
        assert len(row) == S and any(op is not None for op in row)
        for s, op in enumerate(row):
            if op is not None:
                assert (s, *op) not in at
                at[(s, *op)] = tick
    assert len(at) == 2 * M * S
    for s in range(S):
        for m in range(M):
            if s > 0:
                assert at[(s - 1, "forward", m)] < at[(s, "forward", m)]
            need = (s + 1, "backward", m) if s < S - 1 else (s, "forward", m)
            assert at[need] < at[(s, "backward", m)]
        in_flight = max(sum(1 for m in range(M) if at[(s, "forward", m)] <= tick < at[(s, "backward", m)])
                        for tick in range(len(table)))
        assert in_flight == min(S - s, M), (s, in_flight)
        for phase in ("forward", "backward"):
            assert [at[(s, phase, m)] for m in range(M)] == sorted(at[(s, phase, m)] for m in range(M))
    if (M, S) == (4, 2):  # forwards and backwards at the same tick on different stages
        assert table[3] == [("backward", 0), ("forward", 1)] and len(table) == 10


def test_gpu_wait_at_a_tick_end_has_a_deadline(monkeypatch):
    """On CUDA a tick ends waiting for its GPU work with a deadline (a peer that never sends would otherwise hold it
    until NCCL's watchdog ends the process); here the GPU is a stand-in event that finishes late or never."""
    import torch

    class Event:
        polls = 0
        finishes_after = None  # polls; None: never

        def record(self):
            pass

        def query(self):
            Event.polls += 1
            return Event.finishes_after is not None and Event.polls > Event.finishes_after

    monkeypatch.setattr(torch.cuda, "Event", Event)
    cuda = torch.device("cuda", 0)  # a name only: nothing runs on it
    Event.finishes_after = 3
    wait_for_device(cuda, 5.0)
    assert Event.polls == 4
    Event.finishes_after, started = None, time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish within 0.3 s"):
        wait_for_device(cuda, 0.3)
    assert 0.3 <= time.monotonic() - started < 2.0
    wait_for_device(torch.device("cpu"), 0.0)  # nothing to wait for on the CPU


def _refused(capsys, argv):
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for words in ("--pp", "--pool", "--configs", "cad_tick", "GPipe", "1F1B", "rank = stage * DP + replica",
                  "--test-fault", "ideal_step", "0 tokens"):
        assert words in text, words


def test_attention_timing_defaults_to_no_syncs_on_cuda():
    # the syncs slow an imbalanced step far more than a balanced one (bench/results/trainer_h200x2_2026-11-27_24bbc98{,_2}): step times
    # come without them unless asked for
    assert parse_args(["--data", str(DATA)]).sync_attention_timing == "on"  # CPU: nothing to wait for
    assert parse_args(["--device", "cuda", "--data", str(DATA)]).sync_attention_timing == "off"
    on = parse_args(["--device", "cuda", "--sync-attention-timing", "on", "--data", str(DATA)])
    assert on.sync_attention_timing == "on"


def test_bubble_pool_under_1f1b_needs_full_checkpointing(capsys):
    """--pool bubble with --schedule 1f1b (as options, as 1f1b_cad_bubble, or as cad_bubble under --schedule 1f1b)
    runs only with --checkpointing full (a backward must make all of its attention calls in its own tick) and not
    with --keep-forward-tensors on; the message names the configuration. GPipe's bubble runs with or without
    checkpointing; a 1f1b_ configuration keeps its own pool under --pool bubble."""
    err = _refused(capsys, ["--pool", "bubble", "--schedule", "1f1b"])
    assert "--pool bubble with --schedule 1f1b needs --checkpointing full" in err, err
    err = _refused(capsys, ["--configs", "local,1f1b_cad_bubble"])
    assert "--pool bubble (1f1b_cad_bubble) with --schedule 1f1b needs --checkpointing full" in err, err
    err = _refused(capsys, ["--configs", "local,cad_bubble", "--schedule", "1f1b"])
    assert "--pool bubble (cad_bubble) with --schedule 1f1b needs --checkpointing full" in err, err
    err = _refused(capsys, ["--pool", "bubble", "--schedule", "1f1b", "--checkpointing", "full",
                               "--keep-forward-tensors", "on"])
    assert "takes --keep-forward-tensors auto or off, not on" in err, err
    args = parse_args(["--pool", "bubble", "--schedule", "1f1b", "--checkpointing", "full"])
    assert (args.pool, args.schedule) == ("bubble", "1f1b")
    (_, one), = configurations(parse_args(["--configs", "1f1b_cad_bubble", "--checkpointing", "full"]))
    assert (one.attention, one.pool, one.schedule) == ("cad", "bubble", "1f1b")
    (_, bubble), = configurations(parse_args(["--configs", "cad_bubble"]))
    assert (bubble.attention, bubble.pool, bubble.schedule, bubble.checkpointing) == ("cad", "bubble", "gpipe",
                                                                                      "none")
    (_, kept), = configurations(parse_args(["--configs", "1f1b_cad_tick", "--pool", "bubble"]))
    assert (kept.pool, kept.schedule) == ("tick", "1f1b")
    assert parse_args(["--pool", "bubble"]).pool == "bubble"


def test_bad_options_are_refused(capsys, monkeypatch):
    assert "--layers 3 is not divisible by --pp 2" in _refused(capsys, ["--layers", "3", "--pp", "2"])
    assert "'cad' is not one of local, torch_varlen, cad_tick, cad_stage" in \
        _refused(capsys, ["--configs", "local,cad"])
    assert "must contain {config}" in _refused(capsys, ["--configs", "local", "--json-out", "x.json"])
    assert "--test-fault must be RANK:PHASE:TICK:KIND" in _refused(capsys, ["--test-fault", "1:sideways:2:stall"])
    assert "at least 1" in _refused(capsys, ["--micro-batches", "0"])
    assert "needs NCCL" in _refused(capsys, ["--device", "cuda", "--communicator", "host"])
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert "the world of 3 ranks is not divisible by --pp 2" in _refused(capsys, ["--pp", "2"])
