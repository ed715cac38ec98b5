"""cad.OverlapChoice: the decision on synthetic steps shaped like the measured ones (NVLink: nothing; the slow-link
stand-in: head groups; a slower link: ping-pong), confirm and revert, the same decision on 2 gloo ranks that
measured different numbers, the head groups applied to a Context (plans made before refused), and the trainer's
--overlap auto on 2 CPU ranks training exactly as --overlap off while its choice changes the schedule.

CPU has no GPU exchanges, so no stall: the trainer cases feed the choice synthetic numbers in place of the
measured ones (the choice is what is tested; the trainer must apply whatever it chose without changing a loss)."""
import json
import os
import pathlib

import pytest
import torch

import cad
import harness
from cad.overlap import FIXED_COST_SHARE, HIDDEN_SHARE

REPO = pathlib.Path(__file__).resolve().parents[2]
DATA = pathlib.Path(os.environ.get("CAD_DATA", REPO.parent / "shared" / "data" / "doclen_pretrain.json"))
LLAMA3 = (32, 8)  # Llama-3-8B's query and key/value heads: 2, 4 and 8 groups all divide them


def test_nvlink_like_step_pays_nothing():
    """The 2-H200 NVLink step of trainer_h200x2_2026-11-28_6fc2a34_5: 2377 ms, stall 68 ms (2.9%): under 5%, off for good, nothing predicted."""
    choice = cad.OverlapChoice(heads=LLAMA3)
    assert choice.mode is None and choice.split is None
    assert choice.observe(2377.0, 68.0, 68.0) == "off"
    assert choice.final and choice.groups == 1 and choice.split is False
    assert "under 5%" in choice.reason and choice.predictions == {}
    assert choice.observe(100.0, 90.0) == "off"  # decided for good: later steps change nothing


def test_slow_link_like_step_takes_head_groups():
    """Runs 41-42 through host memory: 2777 ms, stall 244 ms (8.8%): head groups 4 (measured best); ping-pong's
    prediction is close but within its margin (its constants are NVLink's), so the measured overlap wins."""
    choice = cad.OverlapChoice(heads=LLAMA3)
    assert choice.observe(2777.0, 244.0, 244.0) == "head_groups"
    assert choice.groups == 4 and not choice.final and choice.split is False
    p = choice.predictions
    assert set(p) == {"head_groups=2", "head_groups=4", "head_groups=8", "ping_pong"}
    assert p["head_groups=4"] > p["head_groups=8"] > p["head_groups=2"] > 0
    assert p["head_groups=2"] == pytest.approx(HIDDEN_SHARE * 244.0 / 2 - FIXED_COST_SHARE * 2777.0)
    assert "head groups 4" in choice.reason and "8.8%" in choice.reason
    # Only the counts dividing both head counts are candidates (the tiny model's 4 and 2 heads: 2 groups).
    small = cad.OverlapChoice(heads=(4, 2), ping_pong=False)
    assert small.observe(2777.0, 244.0) == "head_groups" and small.groups == 2
    assert set(small.predictions) == {"head_groups=2"}


def test_slower_link_takes_ping_pong_and_never_splits_where_it_cannot():
    """A stall of 20% of the step: ping-pong's predicted saving beats the best head groups' by more than its margin.
    Without ping-pong (a trainer that cannot split) the best head groups instead."""
    choice = cad.OverlapChoice(heads=LLAMA3)
    assert choice.observe(3000.0, 600.0, 600.0, 900.0) == "ping_pong"
    assert choice.split is True and choice.groups == 1
    no_split = cad.OverlapChoice(heads=LLAMA3, ping_pong=False)
    assert no_split.observe(3000.0, 600.0) == "head_groups" and no_split.groups == 8
    # The server compute bounds what head groups hide (a group's exchange hides under another group's compute).
    bounded = cad.OverlapChoice(heads=LLAMA3, ping_pong=False)
    bounded.observe(3000.0, 600.0, 600.0, 100.0)
    assert bounded.predictions["head_groups=4"] < no_split.predictions["head_groups=4"]
    # A stall over the threshold whose best prediction gains too little: off.
    weak = cad.OverlapChoice(heads=LLAMA3)
    assert weak.observe(2400.0, 130.0, 130.0, 20.0) == "off" and weak.final and "none at least" in weak.reason


def test_second_observation_confirms_or_reverts_once():
    reverted = cad.OverlapChoice(heads=LLAMA3)
    reverted.observe(2777.0, 244.0)
    assert reverted.observe(2790.0, 120.0) == "off"  # slower under head groups than unsplit: back to off
    assert reverted.final and reverted.groups == 1 and "reverted" in reverted.reason
    assert reverted.observe(1000.0, 500.0) == "off"
    confirmed = cad.OverlapChoice(heads=LLAMA3)
    confirmed.observe(2777.0, 244.0)
    assert confirmed.observe(2717.0, 120.0) == "head_groups"
    assert confirmed.final and confirmed.groups == 4 and "confirmed" in confirmed.reason
    lenient = cad.OverlapChoice(heads=LLAMA3, revert_tolerance=0.01)  # within the tolerance: kept
    lenient.observe(2777.0, 244.0)
    assert lenient.observe(2790.0, 120.0) == "head_groups"
    assert lenient.record()["baseline"]["step_ms"] == 2777.0


def test_bad_arguments_are_named():
    with pytest.raises(cad.CadError, match="min_stall_share"):
        cad.OverlapChoice(min_stall_share=1.5)
    with pytest.raises(cad.CadError, match="head_groups"):
        cad.OverlapChoice(head_groups=(1, 4))
    with pytest.raises(cad.CadError, match="heads"):
        cad.OverlapChoice(heads=(32,))
    with pytest.raises(cad.CadError, match="stall_ms"):
        cad.OverlapChoice().observe(1000.0, float("nan"))
    with pytest.raises(cad.CadError, match="step_ms"):
        cad.OverlapChoice().observe(-1.0, 0.0)


def test_apply_sets_the_contexts_head_groups():
    """apply() rebuilds a context's stacks with the chosen head groups, keeping its other settings."""
    context = cad.Context(balancer="distca", timeout_ms=5000)
    try:
        choice = cad.OverlapChoice(heads=LLAMA3)
        choice.observe(2777.0, 244.0)
        assert choice.apply(context) is True
        assert context.settings["head_groups"] == 4 and context.settings["balancer"] == "distca"
        assert context.settings["timeout_ms"] == 5000
        cad_config = next(i for i in context.stack_config(torch.device("cpu"))["instances"] if i["name"] == "cad")
        assert cad_config["config"]["head_groups"] == 4
        assert choice.apply(context) is False  # already so: nothing rebuilt
    finally:
        context.close()


# ---- 2 gloo ranks -------------------------------------------------------------------------------------------
def _on_two_ranks(rank, world, out):
    """Both 2-rank bodies in one pair of processes (the ranks start once): the decision, then the trainer runs."""
    results = {"ranks": _same_decision(rank, world)}
    results.update(_train(rank, world) if DATA.exists() else {})
    if rank == 0:
        pathlib.Path(out).write_text(json.dumps(results))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("overlap") / "ranks.json"
    harness.run(2, _on_two_ranks, str(out), timeout_s=150)
    return json.loads(out.read_text())


def _same_decision(rank, world):
    """Rank 0 measured a step with little stall, rank 1 one with much: both decide from the slowest rank's."""
    import torch.distributed as dist
    numbers = [(2000.0, 40.0, 40.0, 300.0), (2777.0, 244.0, 244.0, 400.0)][rank]
    choice = cad.OverlapChoice(heads=LLAMA3)
    mode = choice.observe(*numbers, group=dist.group.WORLD)
    # The head groups applied on both ranks: a plan made before is refused, a new plan runs (CPU runs unsplit).
    q = torch.randn(64, 4, 8, generator=torch.Generator().manual_seed(7))
    cu = torch.tensor([0, 40, 64], dtype=torch.int32)
    before = cad.plan(cu)
    o_before = cad.varlen_attn(q, q, q, cu, plan=before)
    assert choice.apply() is True
    try:
        cad.varlen_attn(q, q, q, cu, plan=before)
        refused = False
    except cad.CadError:
        refused = True
    after = cad.plan(cu)
    o_after = cad.varlen_attn(q, q, q, cu, plan=after)
    gathered = [None] * world
    dist.all_gather_object(gathered, {"mode": mode, "groups": choice.groups, "reason": choice.reason,
                                      "baseline": choice.baseline, "refused": refused,
                                      "same_output": bool(torch.equal(o_before, o_after)),
                                      "head_groups": cad.context().settings["head_groups"]})
    cad.init(timeout_ms=20000)  # the harness's settings again
    return gathered


def test_every_rank_decides_alike(two_ranks):
    ranks = two_ranks["ranks"]
    assert ranks[0] == ranks[1]
    assert ranks[0]["mode"] == "head_groups" and ranks[0]["groups"] == 4  # rank 1's numbers decide
    assert ranks[0]["baseline"]["stall_ms"] == 244.0 and ranks[0]["baseline"]["server_ms"] == 400.0
    assert ranks[0]["refused"] and ranks[0]["same_output"] and ranks[0]["head_groups"] == 4


# ---- the trainer on 2 CPU ranks -----------------------------------------------------------------------------
TRAIN_ARGS = ["--attention", "cad", "--balancer", "prefix_aware", "--seed", "1", "--context", "256", "--steps", "4",
              "--layers", "2", "--hidden", "64", "--intermediate", "96", "--timeout-ms", "20000"]
# Synthetic observations in place of CPU's (no stall): (stall share of the first, second step / first step).
SCENARIOS = {"head_groups_reverted": (0.07, 1.10), "ping_pong_confirmed": (0.20, 0.90)}


def _train(rank, world):
    from cad.train.llama import train_one
    from cad.train.llama_args import parse_args
    lengths = json.loads(DATA.read_text())
    results = {}
    real = cad.OverlapChoice.observe
    for name in ("off", *SCENARIOS):
        seen, head_groups = [], []

        def fake(self, step_ms, stall_ms, exchange_ms=None, server_ms=None, *, group=None, name=name, seen=seen):
            seen.append([step_ms, stall_ms, exchange_ms, server_ms])
            share, ratio = SCENARIOS[name]
            if len(seen) == 1:
                return real(self, 1000.0, share * 1000.0, share * 1000.0, None)
            return real(self, 1000.0 * ratio, 10.0)

        cad.OverlapChoice.observe = fake
        try:
            argv = TRAIN_ARGS + ["--overlap", "off" if name == "off" else "auto", "--data", str(DATA)]
            result = train_one(parse_args(argv), rank, world, torch.device("cpu"), lengths,
                               on_gradients=lambda step, model: head_groups.append(
                                   cad.context().settings["head_groups"]))
        finally:
            cad.OverlapChoice.observe = real
        results[name] = {"steps": result["steps"], "summary": result["summary"], "seen": seen,
                         "head_groups": head_groups}
    return results


@pytest.mark.skipif(not DATA.exists(), reason=f"no Pretrain data at {DATA}")
def test_trainer_overlap_auto_trains_as_off(two_ranks):
    runs = two_ranks
    off = runs["off"]
    assert off["summary"]["overlap_decision"] is None and off["seen"] == []
    assert not any(step["ping_pong"] for step in off["steps"])
    for name in SCENARIOS:
        run = runs[name]
        for a, b in zip(off["steps"], run["steps"]):
            for x, y in zip(a["losses"], b["losses"]):
                assert abs(x - y) <= 1e-5 * abs(x), f"{name}: step {a['step']} loss {x!r} vs {y!r}"
            assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-5 * abs(a["grad_norm"]), name
        # Observed after step 1 (step 0 warms up) with the slowest rank's numbers, then after step 2 under it.
        assert len(run["seen"]) == 2, run["seen"]
        first = run["steps"][1]
        assert run["seen"][0][0] == pytest.approx(max(first["step_s"]) * 1e3)
        assert run["seen"][0][1] == max(first["exchange_stall_ms"]) and run["seen"][0][3] is None
        decision = run["summary"]["overlap_decision"]
        assert decision["final"]
    hg, pp = runs["head_groups_reverted"], runs["ping_pong_confirmed"]
    # Head groups 2 (the tiny model's 4 and 2 heads) for step 2, reverted for step 3: the stacks rebuilt twice.
    assert hg["summary"]["overlap_steps"] == {"2": "head_groups", "3": "off"}
    assert hg["head_groups"] == [1, 1, 2, 1]
    assert hg["summary"]["overlap_decision"]["mode"] == "off" and "reverted" in hg["summary"]["overlap_decision"]["reason"]
    assert not any(step["ping_pong"] for step in hg["steps"])
    # Ping-pong from step 2 on, confirmed: steps 2 and 3 split into nano-batches.
    assert pp["summary"]["overlap_steps"] == {"2": "ping_pong"}
    assert [step["ping_pong"] for step in pp["steps"]] == [False, False, True, True]
    assert pp["head_groups"] == [1, 1, 1, 1]
    assert "confirmed" in pp["summary"]["overlap_decision"]["reason"]


def test_trainer_options(capsys):
    """--overlap auto and the '+ovauto' config suffix; what they do not go with is refused, naming it."""
    from cad.train.llama_args import configurations, parse_args
    (label, run), = configurations(parse_args(["--configs", "prefix_aware+ovauto"]))
    assert label == "prefix_aware_autooverlap" and run.overlap == "auto" and not run.ping_pong
    assert parse_args([]).overlap == "off"
    for argv, message in ((["--configs", "local+ovauto"], "'local+ovauto' is not"),
                          (["--configs", "prefix_aware+ovauto+pp"], "'prefix_aware+ovauto+pp' is not"),
                          (["--configs", "prefix_aware+ovauto+hg2"], "'prefix_aware+ovauto+hg2' is not"),
                          (["--overlap", "auto", "--ping-pong"], "--overlap auto chooses ping-pong"),
                          (["--overlap", "auto", "--cad-head-groups", "2"], "--overlap auto chooses ping-pong"),
                          (["--overlap", "auto", "--attention", "local"], "--overlap auto chooses ping-pong"),
                          (["--overlap", "auto", "--max-doc-len", "512"], "--max-doc-len does not go with --overlap")):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert message in capsys.readouterr().err, argv
