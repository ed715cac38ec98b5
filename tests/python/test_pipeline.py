"""examples/train_pipeline.py (GPipe pipeline x data parallel) on CPU ranks over gloo.

- PP=2 on 2 ranks, PP=2 x DP=2 on 4 ranks and PP=3 on 3 ranks (a middle stage): CAD with one plan per tick over
  every rank (--pool tick), and CAD per stage (--pool stage), give the same losses and every parameter's gradient
  as the same pipeline with local attention, and the pipeline with local attention gives those of the whole model
  run in one process on the same micro-batches (the pipeline itself is right).
- --pool bubble (cad_bubble) pools only the fill and drain ticks: there the idle stage serves attention and the
  tick is balanced; the steady ticks run local attention, with no plan (checkpointed too: the recomputation in the
  backward runs the attention of its forward tick), and it trains as local attention. Under 1F1B
  (1f1b_cad_bubble, --checkpointing full only) each operation of a tick with an idle stage has a plan of its own;
  the other ticks run local attention, and a backward recomputes under its own tick's kind.
- Plans are per tick and made ahead: each forward tick has a plan of its own, tagged with its tick, asked for
  during the tick before; its mirrored backward tick reuses it; the step makes exactly one plan per tick.
A stage that stalls or raises: test_pipeline_faults.py; the schedules' timetables and the command line:
test_pipeline_options.py.

The training cases of one layout run in one set of spawned processes (tests/python/harness.py): torch and
transformers start once per rank."""
import argparse
import contextlib
import io
import json
import os
import pathlib
import runpy
import subprocess
import sys
import time
import traceback

import pytest

import harness
from cad.train.batches import make_inputs, make_nanos
from cad.train.flops import causal_cost
from cad.train.model import MicroBatchLoss, build_model
from cad.train.pipeline import train_one
from cad.train.pipeline_args import configurations, parse_args
from cad.train.pipeline_report import comparison, comparison_table
from cad.train.pipeline_stage import micro_batch_documents, token_seed
from cad.train.schedule import BUBBLE_1F1B_TAGS, one_f_one_b, one_f_one_b_bubble_tick

REPO = pathlib.Path(__file__).resolve().parents[2]
TRAINER = REPO / "examples" / "train_pipeline.py"
DATA = pathlib.Path(os.environ.get("CAD_DATA", REPO.parent / "shared" / "data" / "doclen_pretrain.json"))
needs_data = pytest.mark.skipif(not DATA.exists(), reason=f"no Pretrain data at {DATA}")

# A tiny Llama: 4 micro-batches of 256 tokens per replica, 2 steps; 2 decoder layers per stage (1 with 3 stages).
TINY = ["--hidden", "64", "--intermediate", "96", "--context", "256", "--micro-batches", "4", "--steps", "2",
        "--timeout-ms", "20000"]
# name -> (ranks, layout, cases: configuration -> options), each trained in one set of processes
RUNS = {
    "pp2": (2, ["--pp", "2", "--layers", "4"],
            {"local": ["--attention", "local"],
             "cad_tick": ["--attention", "cad", "--pool", "tick"],
             "cad_tick_full": ["--attention", "cad", "--pool", "tick", "--checkpointing", "full"],
             "cad_tick_now": ["--attention", "cad", "--pool", "tick", "--plan-ahead", "off"],
             "cad_stage": ["--attention", "cad", "--pool", "stage"],
             "cad_bubble": ["--attention", "cad", "--pool", "bubble"],
             "cad_bubble_full": ["--attention", "cad", "--pool", "bubble", "--checkpointing", "full"],
             "1f1b_local": ["--schedule", "1f1b", "--attention", "local"],
             "1f1b_cad_tick": ["--schedule", "1f1b", "--attention", "cad", "--pool", "tick"],
             "1f1b_cad_tick_full": ["--schedule", "1f1b", "--attention", "cad", "--pool", "tick", "--checkpointing",
                                    "full"],
             "1f1b_cad_tick_kept": ["--schedule", "1f1b", "--attention", "cad", "--pool", "tick",
                                    "--keep-forward-tensors", "on"],
             "1f1b_cad_stage": ["--schedule", "1f1b", "--attention", "cad", "--pool", "stage"],
             "1f1b_cad_bubble_full": ["--schedule", "1f1b", "--attention", "cad", "--pool", "bubble",
                                      "--checkpointing", "full"]}),
    "pp2_dp2": (4, ["--pp", "2", "--layers", "4"],
                {"local": ["--attention", "local"],
                 "cad_tick_full": ["--attention", "cad", "--pool", "tick", "--checkpointing", "full"],
                 "cad_stage": ["--attention", "cad", "--pool", "stage"],
                 "cad_bubble_full": ["--attention", "cad", "--pool", "bubble", "--checkpointing", "full"],
                 "1f1b_cad_tick_full": ["--schedule", "1f1b", "--attention", "cad", "--pool", "tick",
                                        "--checkpointing", "full"],
                 "1f1b_cad_stage": ["--schedule", "1f1b", "--attention", "cad", "--pool", "stage"]}),
    # a middle stage: it receives and sends activations, and gradients
    "pp3": (3, ["--pp", "3", "--layers", "3"],
            {"local": ["--attention", "local"],
             "cad_tick_full": ["--attention", "cad", "--pool", "tick", "--checkpointing", "full"],
             "1f1b_cad_tick": ["--schedule", "1f1b", "--attention", "cad", "--pool", "tick"],
             "1f1b_cad_bubble_full": ["--schedule", "1f1b", "--attention", "cad", "--pool", "bubble",
                                      "--checkpointing", "full"]}),
}


def _reference(args, lengths, dp, step=0):
    """The whole model in this process, no pipeline: every micro-batch of every replica of `step` through
    train_llama's MicroBatchLoss with local attention, each loss scaled by 1 / (micro-batches x replicas) (the
    pipeline's 1 / M and the replicas' average). Returns (the step's loss, {parameter name: gradient})."""
    import torch
    cpu = torch.device("cpu")
    local = argparse.Namespace(**vars(args))
    local.attention = "local"
    lm = build_model(local, cpu, torch.float32)
    model = MicroBatchLoss(lm, args.loss_chunk)
    docs = micro_batch_documents(lengths, args, dp, step)
    total = 0.0
    for m in range(args.micro_batches):
        for r in range(dp):
            inputs = make_inputs(docs[m][r], args.vocab, token_seed(args, step, r, m), cpu)
            loss = model(**inputs, nanos=make_nanos([docs[m][r]], "local", local, cpu, torch.float32))
            (loss / (args.micro_batches * dp)).backward()
            total += loss.item() / (args.micro_batches * dp)
    return total, {n: p.grad for n, p in lm.named_parameters()}


def _relative_error(a, b):
    """Worst relative difference of two gradients, as a norm (elementwise ratios of tiny entries mean nothing)."""
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


def _train_cases(rank, world, out_dir, run):
    """Every case of this run trained on this rank, then the gradients compared here (they are this
    rank's stage's); writes rank<R>.json with each case's records and the comparisons."""
    import torch
    lengths = json.loads(DATA.read_text())
    results, grads = {}, {}
    _, layout, cases = RUNS[run]
    for name, argv in cases.items():
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                args = parse_args(TINY + layout + argv + ["--data", str(DATA)])
                started = time.perf_counter()
                result = train_one(args, rank, world, torch.device("cpu"), lengths, capture_grads=True)
            grads[name] = result.pop("grads")
            results[name] = dict(result, stdout=printed.getvalue(), seconds=time.perf_counter() - started)
        except Exception:  # noqa: BLE001 -- reported per case by the tests
            results[name] = {"error": traceback.format_exc()[-4000:], "stdout": printed.getvalue()}
    args = parse_args(TINY + layout + ["--data", str(DATA)])
    ref_loss, ref_grads = _reference(args, lengths, world // args.pp)
    comparisons = {"reference_loss": ref_loss, "names": {}, "vs_local": {}, "vs_local_after_step": {},
                   "vs_reference": {}}
    for name, by_step in grads.items():
        comparisons["names"][name] = sorted(by_step[0])
        if "local" in grads:  # every step: the same weights and batches, so the same gradients
            per_step = [max(_relative_error(g[n], l[n]) for n in g) for g, l in zip(by_step, grads["local"])]
            comparisons["vs_local"][name] = per_step[0]
            comparisons["vs_local_after_step"][name] = max(per_step[1:], default=0.0)
        comparisons["vs_reference"][name] = max(_relative_error(g, ref_grads[n]) for n, g in by_step[0].items())
    pathlib.Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"results": results, "compare": comparisons}))


def _run(tmp_path_factory, run):
    if not DATA.exists():
        pytest.skip(f"no Pretrain data at {DATA}")
    world = RUNS[run][0]
    out = tmp_path_factory.mktemp(run)
    harness.run(world, _train_cases, str(out), run, timeout_s=240, preload=harness.TRANSFORMERS)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return _run(tmp_path_factory, "pp2")


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    return _run(tmp_path_factory, "pp2_dp2")


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    return _run(tmp_path_factory, "pp3")


def _result(ranks, name, rank=0):
    result = ranks[rank]["results"][name]
    assert "error" not in result, f"{name} raised on rank {rank}:\n{result['error']}\n{result['stdout'][-2000:]}"
    return result


# fp32 on CPU. Against local attention CAD computes the same attention, its partial results combined in another
# order; the whole model in one process sums the micro-batches' and replicas' gradients in another order than the
# pipeline's accumulation and all-reduce. Gradients are compared as ||a - b|| / ||b|| per parameter; seen (torch
# 2.15, CPU): <= 1.7e-7 against local attention and against the whole model at step 0. Step 1 starts from weights
# that one AdamW step moved from the step-0 gradients, and AdamW normalises each update (m / sqrt(v)), so the
# step-0 rounding differences of small-gradient entries come back up to ~50x larger: seen <= 7.9e-6 (GPipe local
# against 1F1B local, which differ only in accumulation order, alike). A wrong loss scale, micro-batch or stage
# boundary is off by O(1) at either step. Losses: train_llama's CAD_RTOL.
LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-6
GRAD_RTOL_AFTER_ADAMW_STEP = 1e-4


def _check_same_training(ranks, run):
    """Every case: losses as local attention's, every gradient as local attention's (both steps) and as the
    whole model's (step 0); the ranks together compare every parameter of the model."""
    world, layout, cases = RUNS[run]
    pp, layers = int(layout[1]), int(layout[3])
    local = _result(ranks, "local")
    reference_loss = ranks[0]["compare"]["reference_loss"]
    assert abs(local["steps"][0]["loss"] - reference_loss) <= LOSS_RTOL * abs(reference_loss), \
        (local["steps"][0]["loss"], reference_loss)
    for name in cases:
        run_ = _result(ranks, name)
        assert len(run_["steps"]) == 2
        for a, b in zip(local["steps"], run_["steps"]):
            assert len(b["losses"]) == world // pp  # one per replica (the last stage's ranks)
            for x, y in zip(a["losses"], b["losses"]):
                assert abs(x - y) <= LOSS_RTOL * abs(x), f"{name} step {a['step']}: loss {y} vs local {x}"
        for rank, data in enumerate(ranks):
            compare = data["compare"]
            assert compare["vs_reference"][name] <= GRAD_RTOL, (name, rank, compare["vs_reference"][name])
            assert compare["vs_local"][name] <= GRAD_RTOL, (name, rank, compare["vs_local"][name])
            assert compare["vs_local_after_step"][name] <= GRAD_RTOL_AFTER_ADAMW_STEP, \
                (name, rank, compare["vs_local_after_step"][name])
        # every parameter of the whole model is some rank's: embeddings on stage 0, norm and head on the last
        names = set().union(*(set(d["compare"]["names"][name]) for d in ranks))
        assert len(names) == 3 + layers * 9, sorted(names)  # embed, norm, head; 9 tensors per decoder layer
        per = layers // pp
        for rank, data in enumerate(ranks):
            stage = rank // (world // pp)
            mine = data["compare"]["names"][name]
            assert ("model.embed_tokens.weight" in mine) == (stage == 0)
            assert ("lm_head.weight" in mine) == ("model.norm.weight" in mine) == (stage == pp - 1)
            assert {n.split(".")[2] for n in mine if n.startswith("model.layers.")} == \
                {str(i) for i in range(stage * per, (stage + 1) * per)}


@needs_data
def test_pp2_cad_trains_as_local_and_as_the_whole_model(two):
    _check_same_training(two, "pp2")


@needs_data
def test_pp2_dp2_cad_trains_as_local_and_as_the_whole_model(four):
    _check_same_training(four, "pp2_dp2")
    # the replicas of a stage hold the same averaged gradients (the all-reduce): the very same comparisons
    for name in RUNS["pp2_dp2"][2]:
        for stage in (0, 1):
            a, b = (four[stage * 2 + r]["compare"] for r in (0, 1))
            assert a["names"][name] == b["names"][name]
            assert a["vs_reference"][name] == b["vs_reference"][name] and a["vs_local"][name] == b["vs_local"][name]
            assert a["vs_local_after_step"][name] == b["vs_local_after_step"][name]


@needs_data
def test_pp2_dp2_bubble_pool_says_the_replicas_stay_unbalanced_in_steady_ticks(four):
    """With DP > 1 --pool bubble still trains as local attention (above) and pools its bubble ticks over all four
    ranks, but leaves the steady ticks' imbalance between a stage's replicas: the trainer says so once."""
    printed = _result(four, "cad_bubble_full")["stdout"]
    assert printed.count("note: --pool bubble with DP = 2") == 1, printed[-2000:]
    assert "note: --pool bubble" not in _result(four, "cad_tick_full")["stdout"]
    for record in _result(four, "cad_bubble_full")["steps"]:
        pooled = [e for e in record["ticks"] if "planned_imbalance" in e]
        assert len(pooled) == 4  # forward ticks 0 and 4, backward ticks 0 and 4
        assert all(len(e["attention_s"]) == 4 and min(e["attention_s"]) > 0.0 for e in pooled)


@needs_data
def test_pp3_middle_stage_trains_as_local_and_as_the_whole_model(three):
    _check_same_training(three, "pp3")


@needs_data
def test_pp2_tick_pool_balances_every_tick(two):
    _check_balance(two, 2)


@needs_data
def test_pp2_dp2_tick_pool_balances_every_tick(four):
    _check_balance(four, 4)
    # 1F1B with CAD per stage: each stage's two replicas balanced (the stages' ops are their own)
    for record in _result(four, "1f1b_cad_stage")["steps"]:
        assert record["mean_planned_imbalance"] < record["mean_colocated_imbalance"]
        assert record["plans_made"] == [4] * 4  # one per micro-batch on every rank (its stage's replicas)


def _check_balance(ranks, world):
    """With one CAD group over every rank the plans balance each tick's attention (fill and drain ticks
    included: the idle stage serves); per stage, with DP=1, nothing moves (and the trainer says so), with DP=2
    each stage's replicas are balanced but not the stages."""
    name = "cad_tick" if world == 2 else "cad_tick_full"
    tick = _result(ranks, name)
    for record in tick["steps"]:
        forward = [e for e in record["ticks"] if e["phase"] == "forward"]
        assert len(forward) == 5 and all(e["planned_imbalance"] < 1.1 for e in forward), forward
        # the drain and fill ticks are the most unequal before balancing: one stage holds every token
        assert forward[0]["colocated_imbalance"] >= 1.9 and forward[-1]["colocated_imbalance"] >= 1.9
    stage = _result(ranks, "cad_stage")
    if world == 2:
        assert "CAD balances nothing here" in stage["stdout"]
        for record in stage["steps"]:
            assert record["mean_planned_imbalance"] == pytest.approx(record["mean_colocated_imbalance"], rel=1e-9)
    else:  # each stage's two replicas balanced; the stages still differ per tick
        assert "CAD balances nothing" not in stage["stdout"]
        for record in stage["steps"]:
            assert record["mean_planned_imbalance"] < record["mean_colocated_imbalance"]
            assert record["mean_planned_imbalance"] > max(r["mean_planned_imbalance"] for r in tick["steps"])


@needs_data
def test_pp2_bubble_pool_pools_only_the_bubble_ticks(two):
    """--pool bubble (M = 4, PP = 2: forward ticks 0 and 4 have an idle stage, 1-3 are steady; backward tick b
    mirrors forward tick 4 - b). Bubble ticks: a plan over both ranks (tag step x T + tick), the idle rank serves
    attention and the tick is balanced; the backward reuses the forward tick's plan. Steady ticks: no plan at all
    (local attention), so their planned imbalance is the colocated one. One plan make per bubble tick, none for the
    steady ticks (cad's own counter: no layer made a plan of its own). Losses and gradients equal local attention's
    (test_pp2_cad_trains_as_local_and_as_the_whole_model)."""
    M, S = 4, 2
    T = M + S - 1
    bubble = [0, T - 1]
    for name in ("cad_bubble", "cad_bubble_full"):
        for rank in range(2):
            run = _result(two, name, rank)
            assert run["summary"]["pool"] == "bubble"
            assert run["summary"]["plan_makes_total"] == 2 * len(bubble)
            assert [r["plans_made"] for r in run["steps"]] == [[len(bubble)] * 2] * 2
            for record in run["steps"]:
                forward = [r for r in record["rank_ticks"] if r["phase"] == "forward"]
                backward = [r for r in record["rank_ticks"] if r["phase"] == "backward"]
                assert [(r["tick"], r["plan_tag"]) for r in forward if "plan_id" in r] == \
                    [(t, record["step"] * T + t) for t in bubble], (name, rank, forward)
                assert [r["tick"] for r in backward if "plan_id" in r] == [T - 1 - t for t in bubble[::-1]]
                ids = {r["tick"]: r["plan_id"] for r in forward if "plan_id" in r}
                assert [r["plan_id"] for r in backward if "plan_id" in r] == [ids[t] for t in bubble[::-1]]
        for record in _result(two, name)["steps"]:
            assert len(record["ticks"]) == 2 * T
            steady = 0
            for entry in record["ticks"]:
                forward_tick = entry["tick"] if entry["phase"] == "forward" else T - 1 - entry["tick"]
                if forward_tick in bubble:  # the idle stage serves; one stage holds every token before balancing
                    assert min(entry["attention_s"]) > 0.0, (name, entry)
                    assert entry["planned_imbalance"] < 1.1 < entry["colocated_imbalance"], (name, entry)
                else:  # local attention: nothing planned, nothing moved
                    assert "planned_imbalance" not in entry and "plan_imbalance" not in entry, (name, entry)
                    steady += 1
            assert steady == 2 * (T - len(bubble))  # forward and backward


@needs_data
def test_pp2_1f1b_trains_as_local_and_balances_every_tick(two):
    """1F1B (forwards and backwards at the same ticks on different stages) trains as GPipe with local attention
    (_check_same_training covers every case). With CAD over the world every rank makes every plan's calls of a
    tick (cad.CallOrder): a plan per (micro-batch, stage), made ahead, each balanced over both ranks, so every
    tick is balanced, the mixed ones included; the local 1F1B's stages are not."""
    M, S = 4, 2
    for name in ("1f1b_cad_tick", "1f1b_cad_tick_full", "1f1b_cad_tick_kept"):
        for rank in range(2):
            run = _result(two, name, rank)
            assert run["summary"]["schedule"] == "1f1b" and run["summary"]["ticks_per_step"] == 10
            assert [r["plans_made"] for r in run["steps"]] == [[M * S] * 2] * 2  # every rank makes every plan
            for record in run["steps"]:
                phases = [r["phase"] for r in record["rank_ticks"]]
                assert phases == (["forward", "forward", "idle", "backward", "forward", "backward", "forward",
                                   "backward", "idle", "backward"] if rank == 0 else
                                  ["idle", "forward", "backward", "forward", "backward", "forward", "backward",
                                   "forward", "backward", "idle"])
                forward = [r for r in record["rank_ticks"] if r["phase"] == "forward"]
                assert all(r["asked_ms"] < 0 for r in forward[1:]), forward  # asked during the tick before
        for record in _result(two, name)["steps"]:
            assert all(e["planned_imbalance"] < 1.1 for e in record["ticks"]), record["ticks"]
            mixed = [e for e in record["ticks"] if e["tick"] in (3, 4, 5, 6, 7)]  # a forward beside a backward
            assert all(e["colocated_imbalance"] > 1.2 for e in mixed)
    local = _result(two, "1f1b_local")
    assert all(r["mean_colocated_imbalance"] > 1.2 for r in local["steps"])


@needs_data
def test_pp2_1f1b_bubble_pool_pools_only_the_ticks_with_an_idle_stage(two):
    """1F1B --pool bubble (M = 4, PP = 2; --checkpointing full): the timetable [F0,-] [F1,F0] [-,B0] [B0,F1]
    [F2,B1] [B1,F2] [F3,B2] [B2,F3] [-,B3] [B3,-] has an idle stage at ticks 0, 2, 8, 9. There each operation has a
    plan of its own over both ranks (tag bubble_1f1b_tag: forward and backward apart), the idle rank serves
    attention and the tick is balanced; the other ticks run local attention, no plan, nothing planned. Stage 1's
    F0 (steady tick 1) and B0 (bubble tick 2), and stage 0's F0 (bubble tick 0) and B0 (steady tick 3), run their
    forward and backward in different kinds of tick, and train as local attention
    (test_pp2_cad_trains_as_local_and_as_the_whole_model)."""
    M, S = 4, 2
    bubble = [0, 2, 8, 9]
    table = one_f_one_b(M, S)
    assert [k for k in range(len(table)) if one_f_one_b_bubble_tick(table, k)] == bubble
    name = "1f1b_cad_bubble_full"
    for rank in range(2):
        run = _result(two, name, rank)
        assert (run["summary"]["pool"], run["summary"]["schedule"]) == ("bubble", "1f1b")
        assert run["summary"]["plan_makes_total"] == 2 * len(bubble)  # every rank makes every plan, no other
        assert [r["plans_made"] for r in run["steps"]] == [[len(bubble)] * 2] * 2
        for record in run["steps"]:
            step = record["step"]
            planned = {r["tick"]: r["plan_tag"] for r in record["rank_ticks"] if "plan_id" in r}
            # this rank's own operations in the bubble ticks, each with its own tag; the idle rank's tick none
            expected = {k: BUBBLE_1F1B_TAGS + 2 * ((step * M + table[k][rank][1]) * S + rank) +
                        (table[k][rank][0] == "backward") for k in bubble if table[k][rank] is not None}
            assert planned == expected, (rank, record["rank_ticks"])
            assert len(set(planned.values())) == len(planned)
    tags = [_result(two, name, r)["steps"][0]["rank_ticks"][0].get("plan_tag") for r in range(2)]
    assert tags == [BUBBLE_1F1B_TAGS + 0, None]  # stage 0's F0 at tick 0; stage 1 idle there
    for record in _result(two, name)["steps"]:
        assert len(record["ticks"]) == len(table)
        for entry in record["ticks"]:
            if entry["tick"] in bubble:  # the idle rank serves; one rank holds every token before balancing
                assert min(entry["attention_s"]) > 0.0, entry
                assert entry["planned_imbalance"] < 1.1 < entry["colocated_imbalance"], entry
            else:  # local attention: nothing planned, nothing moved
                assert "planned_imbalance" not in entry and "plan_imbalance" not in entry, entry


@needs_data
def test_plans_are_per_tick_and_made_ahead(two):
    """Each forward tick runs a plan of its own (tag step x T + tick, a new plan id per tick) asked for at the
    start of the tick before it (the first at the step before); backward tick b reuses forward tick T-1-b's
    plan; one plan make per forward tick and rank, and every step records its plan waits. With --plan-ahead off
    the plans are made at their own tick's start, and train the same."""
    T = 4 + 2 - 1
    for rank, data in enumerate(two):
        for name in ("cad_tick", "cad_tick_full"):
            run = _result(two, name, rank)
            assert run["summary"]["plan_makes_total"] == 2 * T
            assert [r["plans_made"] for r in run["steps"]] == [[T, T]] * 2
            seen = set()
            for record in run["steps"]:
                assert len(record["plan_wait_ms"]) == 2 and all(w >= 0 for w in record["plan_wait_ms"])
                mine = record["rank_ticks"]
                forward = [r for r in mine if r["phase"] == "forward"]
                backward = [r for r in mine if r["phase"] == "backward"]
                assert [r["plan_tag"] for r in forward] == [record["step"] * T + t for t in range(T)]
                ids = [r["plan_id"] for r in forward]
                assert len(set(ids)) == T and not seen & set(ids)
                seen |= set(ids)
                assert [r["plan_id"] for r in backward] == ids[::-1]
                for t, r in enumerate(forward):
                    # asked before its tick began: at the start of the tick before (the step's first: before it)
                    assert r["asked_ms"] < 0, (name, rank, t, r)
                    if t > 0:  # before the tick before had done half its work
                        assert -r["asked_ms"] >= 1e3 * forward[t - 1]["tick_s"] * 0.5, (name, rank, t, r)
                    assert "make_started_ms" in r
                # idle ticks (stage 0's last, stage 1's first) have a plan over no documents too
                assert [r["micro_batch"] for r in forward] == ([0, 1, 2, 3, -1] if rank == 0 else [-1, 0, 1, 2, 3])
        now = _result(two, "cad_tick_now", rank)
        for record in now["steps"]:
            assert all(r["asked_ms"] >= 0 for r in record["rank_ticks"] if r["phase"] == "forward")
        for a, b in zip(_result(two, "cad_tick")["steps"], now["steps"]):
            assert a["losses"] == pytest.approx(b["losses"], rel=LOSS_RTOL)


@needs_data
def test_records_and_ideal(two):
    """Per step: every tick's attention and tick time per rank, its imbalance = max/mean, and the ideal step =
    step - sum over ticks of (max - mean) attention; the summary averages the steps after the first."""
    for name in ("local", "cad_tick"):
        run = _result(two, name)
        for record in run["steps"]:
            assert len(record["ticks"]) == 2 * 5
            saved = 0.0
            for entry in record["ticks"]:
                attention = entry["attention_s"]
                assert len(attention) == 2 and len(entry["tick_s"]) == 2 and min(attention) >= 0
                mean = sum(attention) / 2
                assert entry["imbalance"] == pytest.approx(max(attention) / mean if mean else 1.0, rel=1e-9)
                saved += max(attention) - mean
            assert record["ideal_step_ms"] == pytest.approx(record["step_ms"] - 1e3 * saved, rel=1e-9)
            assert record["step_ms"] == pytest.approx(1e3 * max(record["step_s"]), rel=1e-9)
            assert record["tokens_per_s"] == pytest.approx(4 * 256 / max(record["step_s"]), rel=1e-9)
            if name == "local":  # an idle stage computes no attention at all
                idle = [e for e in record["ticks"] if e["phase"] == "forward" and e["tick"] in (0, 4)]
                assert all(min(e["attention_s"]) == 0.0 for e in idle)
            else:  # under CAD every rank serves in every tick
                assert all(min(e["attention_s"]) > 0.0 for e in record["ticks"])
        summary = run["summary"]
        assert summary["mean_step_ms_after_step0"] == pytest.approx(run["steps"][1]["step_ms"], rel=1e-12)
        assert summary["pp"] == 2 and summary["dp"] == 1 and summary["ticks_per_step"] == 10


@needs_data
def test_comparison_table(two, tmp_path):
    """tests/multi_gpu/pipeline_table.py over --json-out files (here the 2-rank runs' summaries): speedup = local's
    step / the configuration's, ideal = local's step / local's ideal step, share = (speedup - 1) / (ideal - 1)."""
    summaries = {name: _result(two, name)["summary"] for name in ("local", "cad_tick", "cad_stage")}
    for name, summary in summaries.items():
        (tmp_path / f"pipe_256_4_{name}.json").write_text(json.dumps({"summary": summary, "steps": []}))
    skipped = dict(summaries["local"], skipped="torch_varlen: runs on CUDA only")
    (tmp_path / "pipe_256_4_torch_varlen.json").write_text(json.dumps({"summary": skipped, "steps": []}))
    done = subprocess.run([sys.executable, str(REPO / "tests" / "multi_gpu" / "pipeline_table.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split("|")[1].strip() for r in rows] == ["config", "local", "torch_varlen", "cad_tick", "cad_stage"]
    assert "skipped: torch_varlen: runs on CUDA only" in rows[2]
    assert "256 tokens per micro-batch and replica, 4 micro-batches, PP=2 x DP=1" in done.stdout
    local, cad = summaries["local"], summaries["cad_tick"]
    speedup = local["mean_step_ms_after_step0"] / cad["mean_step_ms_after_step0"]
    ideal = local["mean_step_ms_after_step0"] / local["mean_ideal_step_ms_after_step0"]
    cells = [c.strip() for c in rows[3].split("|")[1:-1]]
    assert cells[3] == f"{speedup:.3f}" and cells[4] == f"{ideal:.3f}"
    assert cells[5] == (f"{(speedup - 1) / (ideal - 1):.2f}" if ideal > 1 + 1e-9 else "-")
    assert cells[6] == f"{cad['mean_tick_imbalance']:.3f}" and cells[8] == f"{cad['mean_colocated_imbalance']:.3f}"

    # Attention timed without CUDA waits (--sync-attention-timing off) counts only the enqueue: the table gives
    # the step times and speedups but no ideal, share or measured tick imbalance from such times.
    for name, summary in summaries.items():
        (tmp_path / f"pipe_256_4_{name}.json").write_text(json.dumps(
            {"summary": dict(summary, sync_attention_timing="off"), "steps": []}))
    # The script's main in this process (its command line ran above: a second interpreter would import torch again).
    table_script = runpy.run_path(str(REPO / "tests" / "multi_gpu" / "pipeline_table.py"))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert table_script["main"]([str(tmp_path)]) == 0
    rows = [line for line in printed.getvalue().splitlines() if line.startswith("| ") and "---" not in line]
    cells = [c.strip() for c in rows[3].split("|")[1:-1]]
    assert cells[3] == f"{speedup:.3f}" and cells[4] == "-" and cells[5] == "-" and cells[6] == "-"
    assert cells[7] == f"{cad['mean_planned_imbalance']:.3f}"


@needs_data
def test_comparison_table_measures_1f1b_against_1f1b_local(two):
    """1F1B configurations (--configs 1f1b_...) are compared with local attention on the same schedule."""
    summaries = {name: _result(two, name)["summary"] for name in ("local", "cad_tick", "1f1b_local", "1f1b_cad_tick")}
    rows = {row["config"]: row for row in comparison(summaries)}
    for name, base in (("cad_tick", "local"), ("1f1b_cad_tick", "1f1b_local"), ("1f1b_local", "1f1b_local")):
        assert rows[name]["speedup"] == pytest.approx(summaries[base]["mean_step_ms_after_step0"] /
                                                      summaries[name]["mean_step_ms_after_step0"], rel=1e-12)
        assert rows[name]["ideal"] == pytest.approx(summaries[base]["mean_step_ms_after_step0"] /
                                                    summaries[base]["mean_ideal_step_ms_after_step0"], rel=1e-12)
    fastest = min(summaries[n]["mean_step_ms_after_step0"] for n in ("local", "1f1b_local"))
    for name in summaries:  # against the best alternative: the fastest local attention of either schedule
        assert rows[name]["speedup_vs_fastest_local"] == pytest.approx(
            fastest / summaries[name]["mean_step_ms_after_step0"], rel=1e-12)
    table = comparison_table(summaries).splitlines()
    assert table[0].endswith("| speedup vs fastest local |") and len(table) == 2 + len(summaries)
    args = parse_args(["--configs", "local,1f1b_cad_tick", "--pp", "2", "--layers", "4"])
    (_, gpipe), (_, one_f_one_b) = configurations(args)
    assert (gpipe.schedule, one_f_one_b.schedule, one_f_one_b.attention, one_f_one_b.pool) == \
        ("gpipe", "1f1b", "cad", "tick")


@needs_data
def test_balanced_batches_give_every_buffer_of_a_step_the_mean_attention_work():
    """local_balanced (--balanced-batches), the measured ideal: every buffer of a step (micro-batches x replicas)
    keeps its tokens, and its causal attention work comes within a few percent of the step's mean buffer, where the
    recipe's buffers differ by much more."""
    lengths = json.loads(DATA.read_text())
    (_, raw), (_, balanced) = configurations(parse_args(
        ["--configs", "local,local_balanced", "--context", "16384", "--micro-batches", "4"]))
    assert (raw.balanced_batches, balanced.balanced_batches) == (False, True)
    for step in range(2):
        before = micro_batch_documents(lengths, raw, 2, step)
        after = micro_batch_documents(lengths, balanced, 2, step)
        assert [[sum(d) for d in m] for m in after] == [[sum(d) for d in m] for m in before] == [[16384] * 2] * 4
        spread = lambda docs: max(docs) / (sum(docs) / len(docs))  # noqa: E731
        work_before = [causal_cost(d) for m in before for d in m]
        work_after = [causal_cost(d) for m in after for d in m]
        assert sum(work_after) == pytest.approx(sum(work_before), rel=0.05)
        assert spread(work_after) < 1.05 < spread(work_before)


def test_comparison_prefers_the_measured_ideal_and_never_counts_it_as_an_alternative():
    """With a local_balanced run of the same schedule the ideal is local / local_balanced (measured, no timing syncs
    needed); the balanced runs are not the fastest local attention a user has (their data differ)."""

    def summary(step_ms, ideal_ms, sync="off"):
        return {"mean_step_ms_after_step0": step_ms, "mean_ideal_step_ms_after_step0": ideal_ms,
                "mean_tokens_per_s_after_step0": 1.0, "mean_tick_imbalance": 1.0, "mean_planned_imbalance": 1.0,
                "mean_colocated_imbalance": 1.5, "peak_memory_gib": 1.0, "sync_attention_timing": sync}
    summaries = {"local": summary(1200, 1100, "on"), "local_balanced": summary(1000, 1000),
                 "cad_tick": summary(1100, 1100), "1f1b_local": summary(1300, 1200, "on"),
                 "1f1b_cad_tick": summary(1250, 1250)}
    rows = {row["config"]: row for row in comparison(summaries)}
    assert rows["cad_tick"]["ideal"] == pytest.approx(1.2) and rows["cad_tick"]["realised_share"] == pytest.approx(
        (1200 / 1100 - 1) / 0.2)
    assert rows["local_balanced"]["speedup"] == pytest.approx(1.2)
    # no 1f1b_local_balanced: 1F1B's ideal falls back to the computed one (synchronised timing)
    assert rows["1f1b_cad_tick"]["ideal"] == pytest.approx(1300 / 1200)
    assert rows["cad_tick"]["speedup_vs_fastest_local"] == pytest.approx(1200 / 1100)


# ---- failures: a stage that stalls or raises in a tick ---------------------------------------------------
