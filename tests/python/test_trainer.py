"""examples/train_llama.py on 2 CPU ranks (gloo): CAD and local attention train the same (losses and gradient
norms over 2 steps of 2 micro-batches) under DDP and FSDP2, with and without activation checkpointing (full,
full reentrant, selective attention, selective mlp); --ping-pong trains the same as one nano-batch; --configs in
one torchrun writes what it promises; the CLI refuses bad options.

Most training runs inside one pair of spawned processes (tests/python/harness.py) that call the trainer's
train_one for every case, so the interpreter and torch start once: the matrix and ping-pong cases below cost
about a second each. The command line end to end runs under torchrun (tests marked `torchrun`: interpreters
starting take most of their time; ctest runs them as python.trainer.torchrun, the rest as python.trainer)."""
import contextlib
import io
import json
import os
import pathlib
import subprocess
import sys
import traceback

import pytest

import harness
from cad.train import attention as train_attention
from cad.train.attention import AttentionClock, torch_varlen_unavailable
from cad.train.batches import make_inputs, make_nanos
from cad.train.flops import attention_pairs, causal_cost, layer_windows, masks, model_flops
from cad.train.llama import train_one
from cad.train.llama_args import balancer_config, configurations, parse_args
from cad.train.model import MicroBatchLoss, build_model
from cad.train.recipe import balanced_documents, cached_batch

REPO = pathlib.Path(__file__).resolve().parents[2]
TRAINER = REPO / "examples" / "train_llama.py"
DATA = pathlib.Path(os.environ.get("CAD_DATA", REPO.parent / "shared" / "data" / "doclen_pretrain.json"))
needs_data = pytest.mark.skipif(not DATA.exists(), reason=f"no Pretrain data at {DATA}")

TINY = ["--layers", "2", "--hidden", "64", "--intermediate", "96", "--timeout-ms", "20000"]


# ---- every case trained once, in one pair of gloo processes -------------------------------------------------
PARALLEL = ("ddp", "fsdp2")
CHECKPOINTING = {"none": [], "full": ["--checkpointing", "full"],
                 "full_reentrant": ["--checkpointing", "full", "--checkpoint-reentrant"],
                 "attention": ["--checkpointing", "attention"], "mlp": ["--checkpointing", "mlp"]}
MATRIX = [(parallel, ckpt) for parallel in PARALLEL for ckpt in CHECKPOINTING]
MATRIX_ARGS = ["--context", "256", "--steps", "2", "--micro-batches", "2", "--seed", "1", *TINY]
# (attention, balancer, seed): seed 43's step 1 has a rank with one document (the recipe cut a long one to the
# buffer's length): that step runs unsplit, with a note; its steps 0 and 2 are split. Seed 1's are all split.
PING_PONG = [("cad", "prefix_aware", "1"), ("cad", "colocated", "43"), ("local", "prefix_aware", "1")]
PING_PONG_ARGS = ["--context", "512", "--steps", "3", *TINY]
# Windowed layers: 3 layers, window 8 (documents up to 512 tokens: most of the long ones' keys are hidden);
# --global-every 3: layers 0 and 1 windowed, layer 2 global (two plans per nano-batch), or every layer windowed.
WINDOW_ARGS = ["--context", "512", "--steps", "2", "--seed", "1", *TINY, "--layers", "3"]
MIXED = ["--window", "8", "--global-every", "3"]
WINDOW_CASES = {"window/global/local": ["--attention", "local"],
                "window/mixed/local": ["--attention", "local", *MIXED],
                "window/mixed/cad": ["--attention", "cad", "--balancer", "prefix_aware", *MIXED],
                "window/mixed/cad_pp": ["--attention", "cad", "--balancer", "prefix_aware", "--ping-pong", *MIXED],
                "window/all/local": ["--attention", "local", "--window", "8"],
                "window/all/cad": ["--attention", "cad", "--balancer", "distca", "--window", "8"]}


def _cases():
    """name -> trainer arguments of every in-process case."""
    cases = {}
    for parallel, ckpt in MATRIX:
        for attention in ("local", "cad"):
            cases[f"{parallel}/{ckpt}/{attention}"] = ["--attention", attention, "--balancer", "prefix_aware",
                                                       "--parallel", parallel, *CHECKPOINTING[ckpt], *MATRIX_ARGS]
    for attention, balancer, seed in PING_PONG:
        for pp in ([], ["--ping-pong"]):
            cases[f"pp/{attention}/{balancer}/{seed}/{bool(pp)}"] = ["--attention", attention, "--balancer", balancer,
                                                                     "--seed", seed, *PING_PONG_ARGS, *pp]
    cases["pp/one_lane"] = ["--attention", "cad", "--balancer", "prefix_aware", "--seed", "1", *PING_PONG_ARGS,
                            "--ping-pong", "--ping-pong-lanes", "1"]
    for share in ("0.07", "0"):  # CPU: no GPU exchanges, so no stall: off at 0.07, on from step 3 at 0
        cases[f"pp/worthwhile/{share}"] = ["--attention", "cad", "--balancer", "prefix_aware", "--seed", "1",
                                           "--ping-pong", "--ping-pong-when", "worthwhile",
                                           "--ping-pong-min-stall-share", share, *PING_PONG_ARGS, "--steps", "4"]
    # The step's two micro-batches as the two nano-batches of one call (--ping-pong-nanos micro-batches), against
    # the matrix's cases trained one micro-batch at a time; and paired only from step 3 (worthwhile, share 0).
    PAIRS = ["--ping-pong", "--ping-pong-nanos", "micro-batches"]
    for parallel in PARALLEL:
        cases[f"pp/pairs/{parallel}"] = ["--attention", "cad", "--balancer", "prefix_aware", "--parallel", parallel,
                                         *CHECKPOINTING["full"], *MATRIX_ARGS, *PAIRS]
    cases["pp/pairs/worthwhile"] = ["--attention", "cad", "--balancer", "prefix_aware", "--parallel", "ddp",
                                    *MATRIX_ARGS, *PAIRS, "--ping-pong-when", "worthwhile",
                                    "--ping-pong-min-stall-share", "0", "--steps", "4"]
    cases["gc/freeze"] = ["--attention", "cad", "--balancer", "prefix_aware", "--seed", "1", "--gc", "freeze",
                          *PING_PONG_ARGS]
    cases["timing/unsynced"] = ["--attention", "cad", "--balancer", "prefix_aware", "--seed", "1",
                                "--sync-attention-timing", "off", *PING_PONG_ARGS]
    for name, argv in WINDOW_CASES.items():
        cases[name] = [*argv, *WINDOW_ARGS]
    return cases


def _train_cases(rank, world, out_path):
    """Every case's result (or its traceback) on this rank; rank 0 writes them to out_path. A case that raises
    is recorded and the next one runs (CAD raises on every rank, so the ranks stay in step)."""
    import torch
    lengths = json.loads(DATA.read_text())
    results = {}
    for name, argv in _cases().items():
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                result = train_one(parse_args(argv + ["--data", str(DATA)]), rank, world, torch.device("cpu"),
                                     lengths)
            results[name] = dict(result, stdout=printed.getvalue())
        except Exception:  # noqa: BLE001 -- reported per case by the tests below
            results[name] = {"error": traceback.format_exc()[-4000:]}
    if rank == 0:
        pathlib.Path(out_path).write_text(json.dumps(results))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    if not DATA.exists():
        pytest.skip(f"no Pretrain data at {DATA}")
    out = tmp_path_factory.mktemp("trainer") / "cases.json"
    harness.run(2, _train_cases, str(out), timeout_s=280)
    return json.loads(out.read_text())


def _result(trained, name):
    result = trained[name]
    assert "error" not in result, f"{name} raised:\n{result['error']}"
    return result


# fp32 on CPU: CAD computes the same attention as local, its partial results combined in another order; the
# losses and gradient norms agree to a few ulp (1e-5 relative is ~80 fp32 eps).
CAD_RTOL = 1e-5


def _assert_close(a, b, rtol, what):
    assert abs(a - b) <= rtol * abs(a), f"{what}: {a!r} vs {b!r} (relative {abs(a - b) / abs(a):.2e} > {rtol})"


@needs_data
@pytest.mark.parametrize("parallel,ckpt", MATRIX, ids=[f"{p}-{c}" for p, c in MATRIX])
def test_cad_trains_as_local(trained, parallel, ckpt):
    """prefix_aware over 2 ranks vs local attention, 2 steps x 2 micro-batches: every rank's loss and the
    gradient norm (after the data-parallel averaging) per step; and local attention with this checkpointing
    trains as local attention without (recomputation changes nothing)."""
    local = _result(trained, f"{parallel}/{ckpt}/local")
    cad = _result(trained, f"{parallel}/{ckpt}/cad")
    assert len(local["steps"]) == len(cad["steps"]) == 2
    for a, b in zip(local["steps"], cad["steps"]):
        for x, y in zip(a["losses"], b["losses"]):
            _assert_close(x, y, CAD_RTOL, f"step {a['step']} loss")
        _assert_close(a["grad_norm"], b["grad_norm"], CAD_RTOL, f"step {a['step']} grad norm")
        assert len(b["nano_imbalance"]) == 2  # one plan per micro-batch
    summary = cad["summary"]
    assert summary["parallel"] == parallel and summary["micro_batches"] == 2
    assert summary["checkpointing"] == ("none" if ckpt == "none" else CHECKPOINTING[ckpt][1])
    assert summary["checkpoint_reentrant"] == (ckpt == "full_reentrant")
    assert summary["mean_imbalance"] < 1.1 <= max(r["colocated_imbalance"] for r in cad["steps"])
    plain = _result(trained, f"{parallel}/none/local")
    for a, b in zip(plain["steps"], local["steps"]):
        for x, y in zip(a["losses"], b["losses"]):
            _assert_close(x, y, CAD_RTOL, f"step {a['step']} loss without vs with checkpointing {ckpt}")
        _assert_close(a["grad_norm"], b["grad_norm"], CAD_RTOL, f"step {a['step']} grad norm vs no checkpointing")


@needs_data
def test_ddp_and_fsdp2_train_alike(trained):
    """The same weights and batches: DDP and FSDP2 give the same first loss, and gradient norms to fp32 rounding
    (FSDP2 reduce-scatters per micro-batch, DDP all-reduces once per step)."""
    ddp, fsdp2 = _result(trained, "ddp/none/local"), _result(trained, "fsdp2/none/local")
    assert ddp["steps"][0]["losses"] == fsdp2["steps"][0]["losses"]
    for a, b in zip(ddp["steps"], fsdp2["steps"]):
        _assert_close(a["grad_norm"], b["grad_norm"], CAD_RTOL, f"step {a['step']} grad norm, DDP vs FSDP2")


def test_balanced_batches_keep_tokens_and_give_every_rank_the_mean_work():
    docs = [[30000, 20000, 15536], [60000, 5536], [1000] * 65 + [536], [65536]]
    balanced = balanced_documents(docs)
    mean_work = sum(causal_cost(d) for d in docs) / len(docs)
    assert [sum(d) for d in balanced] == [sum(d) for d in docs]
    for d in balanced:
        assert len(set(d[:-1])) <= 1 and d[-1] <= d[0]  # equal lengths and one shorter remainder
        assert abs(causal_cost(d) - mean_work) / mean_work < 1e-3
    # mean work 10.5: length 2 gives 12, length 1 gives 8, length 3 ([3, 3, 2]) 15; the empty rank stays empty
    assert balanced_documents([[5, 3], []]) == [[2, 2, 2, 2], []]
    args = parse_args(["--configs", "local,local_balanced,prefix_aware", "--json-out", "x_{config}.json"])
    runs = dict(configurations(args))
    assert runs["local_balanced"].balanced_batches and runs["local_balanced"].attention == "local"
    assert not runs["local"].balanced_batches and runs["local_balanced"].json_out == "x_local_balanced.json"
    # +blocking: CAD's NCCL communicator blocking for that configuration only, named in its JSON
    args = parse_args(["--configs", "prefix_aware,prefix_aware+blocking", "--json-out", "x_{config}.json"])
    runs = dict(configurations(args))
    assert runs["prefix_aware_ncclblocking"].cad_nccl_blocking and not runs["prefix_aware"].cad_nccl_blocking
    assert runs["prefix_aware_ncclblocking"].json_out == "x_prefix_aware_ncclblocking.json"
    # +tolT: the balancer's tolerance for that configuration only
    args = parse_args(["--configs", "prefix_aware,prefix_aware+tol0.005,distca+pp+tol0", "--json-out", "x_{config}.json"])
    runs = dict(configurations(args))
    assert runs["prefix_aware_tol0.005"].balancer_tolerance == 0.005 and runs["prefix_aware"].balancer_tolerance is None
    assert runs["distca_pingpong_tol0"].balancer_tolerance == 0.0 and runs["distca_pingpong_tol0"].ping_pong
    # +time: prefix_aware balances predicted time with --balancer-rate-table (an absolute path in its config: the
    # plugin opens it relative to the process's directory), the guard only where asked for
    args = parse_args(["--configs", "prefix_aware,prefix_aware+time+tol0.01", "--json-out", "x_{config}.json"])
    runs = dict(configurations(args))
    assert balancer_config(runs["prefix_aware"]) is None
    table = str(REPO / "configs" / "calibration" / "h200.json")
    assert balancer_config(runs["prefix_aware_time_tol0.01"]) == {"tolerance": 0.01, "rate_table": table}
    assert runs["prefix_aware_time_tol0.01"].json_out == "x_prefix_aware_time_tol0.01.json"
    args = parse_args(["--configs", "prefix_aware+time", "--balancer-min-time-gain", "0"])
    assert balancer_config(dict(configurations(args))["prefix_aware_time"]) == {"rate_table": table,
                                                                                   "min_time_gain": 0.0}
    # +ce: CAD's all-to-alls by the copy engines
    args = parse_args(["--configs", "prefix_aware,prefix_aware+hg2+ce", "--json-out", "x_{config}.json"])
    runs = dict(configurations(args))
    assert runs["prefix_aware_ce_hg2"].cad_nccl_copy_engines and not runs["prefix_aware"].cad_nccl_copy_engines
    assert runs["prefix_aware_ce_hg2"].cad_head_groups == 2
    # +own (and with it +resN): the tasks on a rank's own documents run in place, its forward leaving N SMs
    args = parse_args(["--configs", "prefix_aware,prefix_aware+own,prefix_aware+own+res32", "--json-out", "x_{config}.json"])
    runs = dict(configurations(args))
    assert runs["prefix_aware"].cad_own_tasks == "off" and runs["prefix_aware_own"].cad_own_tasks == "on"
    assert runs["prefix_aware_own"].cad_own_reserve_sms == 16 and runs["prefix_aware_own_res32"].cad_own_reserve_sms == 32
    # +dyn: the server's forward walks dynamically; +ctasN: CAD's NCCL operations on at most N CTAs
    args = parse_args(["--configs", "prefix_aware,prefix_aware+dyn,prefix_aware+own+res0+ctas8", "--json-out", "x_{config}.json"])
    runs = dict(configurations(args))
    assert runs["prefix_aware"].cad_forward_walk == "static" and runs["prefix_aware_dyn"].cad_forward_walk == "dynamic"
    assert runs["prefix_aware_own_res0_ctas8"].cad_nccl_max_ctas == 8 and runs["prefix_aware"].cad_nccl_max_ctas == 0
    assert runs["prefix_aware_own_res0_ctas8"].cad_own_reserve_sms == 0
    assert runs["prefix_aware_dyn"].json_out == "x_prefix_aware_dyn.json"
    # +hgN: CAD's calls by N head groups
    args = parse_args(["--configs", "prefix_aware,prefix_aware+hg2", "--json-out", "x_{config}.json"])
    runs = dict(configurations(args))
    assert runs["prefix_aware_hg2"].cad_head_groups == 2 and runs["prefix_aware"].cad_head_groups == 1


# fp32 on CPU: with and without ping-pong the same per-token terms are summed, in another order (two partial
# sums of the cross-entropy, linear layers over half-length inputs, other CAD plans), so each loss and gradient
# norm may differ by a few units in the last place (fp32 eps 1.2e-7; seen: 0 or 1 ulp, <= 7e-8 relative).
# 1e-6 is ~8 eps: a wrong weighting or a document cut between nano-batches moves them far more.
PING_PONG_RTOL = 1e-6


@needs_data
@pytest.mark.parametrize("attention,balancer,seed", PING_PONG)
def test_ping_pong_trains_the_same(trained, attention, balancer, seed):
    plain = _result(trained, f"pp/{attention}/{balancer}/{seed}/False")
    pp = _result(trained, f"pp/{attention}/{balancer}/{seed}/True")
    for a, b in zip(plain["steps"], pp["steps"]):
        for x, y in zip(a["losses"], b["losses"]):
            _assert_close(x, y, PING_PONG_RTOL, f"step {a['step']} loss")
        _assert_close(a["grad_norm"], b["grad_norm"], PING_PONG_RTOL, f"step {a['step']} grad norm")
    unsplit = [1] if seed == "43" else []
    assert [r["step"] for r in pp["steps"] if not r["ping_pong"]] == unsplit
    assert not any(r["ping_pong"] for r in plain["steps"])
    summary = pp["summary"]
    assert summary["ping_pong"] is True and plain["summary"]["ping_pong"] is False
    if attention == "cad" and balancer == "prefix_aware":
        assert summary["mean_imbalance"] < 1.1  # each plan balances its nano-batch
    assert summary["ping_pong_steps"] == 3 - len(unsplit) and summary["attention_timing"] == "synchronized"
    for record in pp["steps"]:
        (nanos,) = record["nano_tokens"]  # one micro-batch: per rank, both nano-batches add up to the buffer
        assert len(nanos) == 2 and all(sum(n) == 512 and min(n) > 0 for n in nanos)
        assert all(len(n) == (2 if record["ping_pong"] else 1) for n in nanos)
        if attention == "cad":  # both plans' work added up per server: between 1 and the worse plan's
            assert len(record["nano_imbalance"]) == len(nanos[0])
            assert 1 <= record["imbalance"] <= max(record["nano_imbalance"]) + 1e-12
        if balancer == "colocated":  # every rank serves its own documents: the colocated cost of the buffers
            assert record["imbalance"] == pytest.approx(record["colocated_imbalance"], rel=1e-12)
    lines = [line for line in pp["stdout"].splitlines() if line.startswith("step ")]
    assert [("ping-pong" in line and "off" not in line) for line in lines if "loss" in line] == \
        [r["ping_pong"] for r in pp["steps"]]
    if unsplit:
        assert any("step 1: ping-pong off for micro-batch 0: rank(s) [0] hold one document" in line
                   for line in lines), pp["stdout"]


@needs_data
def test_ping_pong_on_one_lane_or_two_computes_the_same(trained):
    """Two CAD lanes (the default: each nano-batch's plans on a stack of its own) or both nano-batches on one:
    the same plans and kernels, so the same losses and gradient norms, bit for bit."""
    two, one = _result(trained, "pp/cad/prefix_aware/1/True"), _result(trained, "pp/one_lane")
    assert two["summary"]["ping_pong_lanes"] == 2 and one["summary"]["ping_pong_lanes"] == 1
    assert [r["losses"] for r in two["steps"]] == [r["losses"] for r in one["steps"]]
    assert [r["grad_norm"] for r in two["steps"]] == [r["grad_norm"] for r in one["steps"]]
    assert all(r["ping_pong"] for r in one["steps"])


@needs_data
def test_ping_pong_when_worthwhile_decides_from_a_measured_step(trained):
    """--ping-pong-when worthwhile: unsplit for the warm-up and one measured step, then split for good only if the
    exchanges stalled that step for at least the given share (on CPU there are no GPU exchanges: a stall of 0),
    saying why; the losses stay those of the plain run either way. The decision after step 1 takes effect at
    step 3: step 2's first micro-batch was asked for (planned ahead) while step 1 ran, undecided."""
    plain = _result(trained, "pp/cad/prefix_aware/1/False")
    for share, splits, verdict in (("0.07", [False, False, False, False], "ping-pong off"),
                                   ("0", [False, False, False, True], "ping-pong on")):
        run = _result(trained, f"pp/worthwhile/{share}")
        assert [r["ping_pong"] for r in run["steps"]] == splits, share
        assert run["summary"]["ping_pong_decision"].startswith(verdict), run["summary"]["ping_pong_decision"]
        assert f"step 1: {verdict}" in run["stdout"]
        for a, b in zip(plain["steps"], run["steps"]):
            for x, y in zip(a["losses"], b["losses"]):
                _assert_close(x, y, PING_PONG_RTOL, f"share {share} step {a['step']} loss")


@needs_data
@pytest.mark.parametrize("parallel", PARALLEL)
def test_micro_batches_paired_as_nano_batches_train_the_same(trained, parallel):
    """--ping-pong-nanos micro-batches: micro-batches 0 and 1 run as the two nano-batches of one forward and
    backward, each with its own unsplit plan (on lanes 0 and 1): the same losses and gradient norms as the same
    micro-batches one after the other, and the same plans (each micro-batch balanced as a whole)."""
    plain, pairs = _result(trained, f"{parallel}/full/cad"), _result(trained, f"pp/pairs/{parallel}")
    assert len(plain["steps"]) == len(pairs["steps"]) == 2
    for a, b in zip(plain["steps"], pairs["steps"]):
        for x, y in zip(a["losses"], b["losses"]):
            _assert_close(x, y, PING_PONG_RTOL, f"step {a['step']} loss")
        _assert_close(a["grad_norm"], b["grad_norm"], PING_PONG_RTOL, f"step {a['step']} grad norm")
        assert b["ping_pong"] and not a["ping_pong"]
        assert b["nano_tokens"] == a["nano_tokens"]  # per micro-batch one nano-batch per rank: nothing split
        assert all(len(n) == 1 for mb in b["nano_tokens"] for n in mb)
        assert b["nano_imbalance"] == a["nano_imbalance"]  # the unsplit plans, one per micro-batch
        assert b["forward_bytes_sent_by_rank"] == a["forward_bytes_sent_by_rank"]
        assert len(b["attention_s_by_micro_batch"]) == 1 and len(a["attention_s_by_micro_batch"]) == 2  # one call
    assert pairs["summary"]["ping_pong_nanos"] == "micro-batches" and plain["summary"]["ping_pong_nanos"] is None
    assert pairs["summary"]["ping_pong_steps"] == 2


@needs_data
def test_micro_batch_pairs_when_worthwhile(trained):
    """Pairs under --ping-pong-when worthwhile: one at a time until the decision after step 1, paired from step 3
    (share 0: any stall is worth hiding); the losses of the steps both ran are the plain run's."""
    plain, run = _result(trained, "ddp/none/cad"), _result(trained, "pp/pairs/worthwhile")
    assert [r["ping_pong"] for r in run["steps"]] == [False, False, False, True]
    assert [len(r["attention_s_by_micro_batch"]) for r in run["steps"]] == [2, 2, 2, 1]
    assert run["summary"]["ping_pong_decision"].startswith("ping-pong on")
    for a, b in zip(plain["steps"], run["steps"]):
        for x, y in zip(a["losses"], b["losses"]):
            _assert_close(x, y, PING_PONG_RTOL, f"step {a['step']} loss")


def test_ping_pong_choice():
    import cad
    choice = cad.PingPongChoice(0.05)
    assert choice.split is None and "undecided" in choice.reason
    assert choice.observe(1000.0, 40.0) is False and "4.0%" in choice.reason and "nothing worth hiding" in choice.reason
    assert choice.observe(1000.0, 400.0) is False  # decided for good
    assert cad.PingPongChoice(0.05).observe(1000.0, 60.0) is True
    with pytest.raises(ValueError, match="min_stall_share"):
        cad.PingPongChoice(1.5)


@needs_data
def test_gc_freeze_trains_the_same(trained):
    """--gc freeze (the collector stops scanning the model) changes no loss; the records count the collector's
    pauses per rank either way."""
    auto, frozen = _result(trained, "pp/cad/prefix_aware/1/False"), _result(trained, "gc/freeze")
    assert auto["summary"]["gc"] == "auto" and frozen["summary"]["gc"] == "freeze"
    for a, b in zip(auto["steps"], frozen["steps"]):
        assert a["losses"] == pytest.approx(b["losses"], rel=1e-6)
        assert len(b["gc_ms"]) == 2 and len(b["gc_full_collections"]) == 2


def test_attention_timing_without_syncs_trains_the_same_and_says_so(trained):
    """--sync-attention-timing off takes the CUDA waits out of the step (attention times then count the enqueue
    only, which the summary says, so that the tables leave out what derives from them); nothing else changes. Every
    step records the allocator's retries per rank (none on the CPU)."""
    synced, unsynced = _result(trained, "pp/cad/prefix_aware/1/False"), _result(trained, "timing/unsynced")
    assert synced["summary"]["attention_timing"] == "synchronized"
    assert unsynced["summary"]["attention_timing"].startswith("enqueue only")
    for a, b in zip(synced["steps"], unsynced["steps"]):
        assert a["losses"] == pytest.approx(b["losses"], rel=1e-6)
        assert b["alloc_retries"] == [0, 0]
    assert unsynced["summary"]["alloc_retries_after_step0"] == 0


@needs_data
@pytest.mark.parametrize("pattern,local,cads", [("mixed", "window/mixed/local", ["window/mixed/cad", "window/mixed/cad_pp"]),
                                                ("all", "window/all/local", ["window/all/cad"])])
def test_windowed_layers_train_through_cad_as_local(trained, pattern, local, cads):
    """--window 8 (--global-every 3: layers 0-1 windowed, layer 2 global; or every layer windowed): CAD (one plan
    per mask and nano-batch: prefix_aware, with ping-pong too, and distca) trains as local attention, and the
    window is applied (the losses are not the all-global model's). The records say which plan has which window;
    the colocated imbalance and MFU count windowed layers with their windowed cost."""
    base = _result(trained, local)
    glob = _result(trained, "window/global/local")
    differs = [abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(base["steps"], glob["steps"])]
    assert max(differs) > 10 * CAD_RTOL, f"the window changed no loss: {differs}"
    mixed = pattern == "mixed"
    for name in cads:
        run = _result(trained, name)
        assert len(run["steps"]) == len(base["steps"]) == 2
        for a, b in zip(base["steps"], run["steps"]):
            for x, y in zip(a["losses"], b["losses"]):
                _assert_close(x, y, CAD_RTOL, f"{name} step {a['step']} loss vs local")
            _assert_close(a["grad_norm"], b["grad_norm"], CAD_RTOL, f"{name} step {a['step']} grad norm vs local")
            nanos = 2 if b["ping_pong"] else 1
            # per nano-batch, its plan of each mask (the first layer's first: windowed)
            assert b["plan_windows"] == ([8, -1] * nanos if mixed else [8] * nanos), b["plan_windows"]
            assert len(b["nano_imbalance"]) == len(b["plan_windows"])
            assert 1 <= b["imbalance"] <= max(b["nano_imbalance"]) + 1e-12
        if name.endswith("_pp"):
            assert any(r["ping_pong"] for r in run["steps"])
        summary = run["summary"]
        assert (summary["window"], summary["global_every"], summary["windowed_layers"]) == \
            ((8, 3, 2) if mixed else (8, None, 3))
    # The step's batch again (the trainer's recipe): its model FLOPs and colocated imbalance with windowed costs.
    args = parse_args(WINDOW_CASES[local] + WINDOW_ARGS)
    lengths = json.loads(DATA.read_text())
    for record, other in zip(base["steps"], glob["steps"]):
        docs = [d or [512] for d in cached_batch(lengths, 512, 2, 1 + 1000 * record["step"])]
        assert record["model_tflop"] * 1e12 == pytest.approx(model_flops(args, base["summary"]["params"], [docs]),
                                                             rel=1e-12)
        assert record["model_tflop"] < other["model_tflop"]
        costs = [attention_pairs(args, d) for d in docs]
        assert record["colocated_imbalance"] == pytest.approx(max(costs) / (sum(costs) / 2), rel=1e-12)


# ---- the torch_varlen baseline and the chunked loss, in this process ------------------------------------------
def _stand_in_varlen(signature):
    """A CPU stand-in for torch.nn.attention.varlen.varlen_attn (CUDA only), with the signature of torch >= 2.11
    (window_size, scale) or of 2.9/2.10 (is_causal): SDPA per document, checking what the trainer passes."""
    from reference import sdpa_varlen, sdpa_varlen_window

    def check(query, key, cu_seq_q, cu_seq_k, max_q, max_k):
        assert key.shape[1] == query.shape[1], "K/V heads must be repeated to the query heads"
        assert cu_seq_q is cu_seq_k and cu_seq_q.dtype.is_floating_point is False
        assert max_q == max_k == int((cu_seq_q[1:] - cu_seq_q[:-1]).max())

    if signature == "window_size":
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                        window_size=(-1, -1), enable_gqa=False):
            check(query, key, cu_seq_q, cu_seq_k, max_q, max_k)
            assert window_size[1] == 0 and window_size[0] >= -1 and scale is not None
            return sdpa_varlen_window(query, key, value, cu_seq_q, True, tuple(window_size), scale)
    else:
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, is_causal=False, return_aux=None):
            check(query, key, cu_seq_q, cu_seq_k, max_q, max_k)
            assert is_causal
            return sdpa_varlen(query, key, value, cu_seq_q, True)
    return varlen_attn


def _one_micro_batch(args, attention, docs):
    import torch
    args.attention = attention
    cpu = torch.device("cpu")
    lm = build_model(args, cpu, torch.float32)
    step = MicroBatchLoss(lm, loss_chunk=16)  # several chunks
    inputs = make_inputs(docs, args.vocab, 5, cpu)
    nanos = make_nanos([docs], attention, args, cpu, torch.float32)
    loss = step(**inputs, nanos=nanos)
    loss.backward()
    return lm, inputs, nanos, loss.detach(), [p.grad.clone() for p in lm.parameters()]


@pytest.mark.parametrize("signature,window", [("window_size", []), ("is_causal", []),
                                              ("window_size", ["--window", "3", "--global-every", "2"])])
def test_torch_varlen_attention_trains_as_local(monkeypatch, signature, window):
    """The torch_varlen attention function (varlen_attn replaced by a CPU stand-in of either torch signature)
    gives cad_local's loss and gradients on a packed micro-batch, also with a windowed layer (layer 0, window
    3: window_size=(3, 0)) before a global one, and its clock counts forward and backward; the chunked loss is
    transformers' own loss."""
    import torch
    monkeypatch.setattr(train_attention, "torch_varlen_function", lambda: _stand_in_varlen(signature))
    args = parse_args(["--context", "64", *TINY, *window])
    docs = [20, 7, 30, 7]
    AttentionClock.take()
    _, _, _, loss_a, grads_a = _one_micro_batch(args, "torch_varlen", docs)
    assert AttentionClock.take() > 0
    lm, inputs, nanos, loss_b, grads_b = _one_micro_batch(args, "local", docs)
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    with torch.no_grad():  # transformers' loss over the whole [tokens, vocab] logits
        hf = lm(**inputs, use_cache=False, cad_cu_seqlens=nanos[0][1]).loss
    torch.testing.assert_close(loss_b, hf, rtol=1e-6, atol=1e-6)


def test_documents_from_position_ids():
    # The torch_varlen baseline derives its documents with the package's rule, as cad.hf does.
    import torch
    from cad.hf import cu_seqlens_from_position_ids
    assert cu_seqlens_from_position_ids(torch.tensor([[0, 1, 2, 0, 1, 0]])).tolist() == [0, 3, 5, 6]
    assert cu_seqlens_from_position_ids(torch.tensor([[3, 4, 0, 1]])).tolist() == [0, 2, 4]  # a continued document
    assert torch_varlen_unavailable(torch.device("cpu")).startswith("torch_varlen: ")


def test_torch_varlen_without_window_size_skips_windowed_models(monkeypatch):
    import torch
    monkeypatch.setattr(train_attention, "torch_varlen_function", lambda: _stand_in_varlen("is_causal"))
    cuda = torch.device("cuda")  # a device name only: nothing runs
    assert torch_varlen_unavailable(cuda) is None
    reason = torch_varlen_unavailable(cuda, 4096)
    assert "takes no window_size (torch >= 2.11), which --window 4096 needs" in reason
    monkeypatch.setattr(train_attention, "torch_varlen_function", lambda: _stand_in_varlen("window_size"))
    assert torch_varlen_unavailable(cuda, 4096) is None


# ---- the command line end to end: --configs, --json-out, --profile-step, the per-step records ------------------
@needs_data
@pytest.mark.torchrun
def test_configs_in_one_torchrun(tmp_path):
    """One torchrun trains local, torch_varlen (skipped on CPU, with its reason), prefix_aware and
    prefix_aware+pp under FSDP2 with full checkpointing and 2 micro-batches, each from the same weights (so
    all three give the same losses). Every record has what the table needs; --profile-step 1 runs step 1's
    batch once more under the profiler, kept apart from the timed steps."""
    out = tmp_path / "sweep_{config}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(TRAINER),
           "--configs", "local,torch_varlen,prefix_aware,prefix_aware+now+pp", "--parallel", "fsdp2", "--checkpointing",
           "full", *MATRIX_ARGS, "--steps", "3", "--profile-step", "1", "--data", str(DATA), "--json-out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("==== configuration ") == 4
    assert "configuration skipped: torch_varlen: torch.nn.attention.varlen.varlen_attn runs on CUDA only" in done.stdout
    skipped = json.loads((tmp_path / "sweep_torch_varlen.json").read_text())
    assert skipped["steps"] == [] and "CUDA only" in skipped["summary"]["skipped"]
    runs = {name: json.loads((tmp_path / f"sweep_{name}.json").read_text())
            for name in ("local", "prefix_aware", "prefix_aware_plannow_pingpong")}
    for name, run in runs.items():
        summary = run["summary"]
        assert summary["parallel"] == "fsdp2" and summary["checkpointing"] == "full" and summary["micro_batches"] == 2
        assert summary["params"] > 0 and summary["mean_mfu_after_step0"] > 0 and summary["peak_memory_gib"] == 0.0
        assert len(run["steps"]) == 3 and [r["profiled"] for r in run["steps"]] == [False] * 3
        extra = run["profiled_step"]
        assert extra["step"] == 1 and extra["profiled"] and extra["nano_tokens"] == run["steps"][1]["nano_tokens"]
        timed = [max(r["step_s"]) for r in run["steps"][1:]]
        assert summary["mean_step_s_after_step0"] == pytest.approx(sum(timed) / len(timed), rel=1e-12)
        for record in run["steps"] + [extra]:
            assert len(record["step_s"]) == 2 and all(s > 0 for s in record["step_s"])
            assert record["tokens_per_s"] == pytest.approx(2 * 2 * 256 / max(record["step_s"]), rel=1e-9)
            assert record["mfu"] == pytest.approx(record["model_tflop"] / (max(record["step_s"]) * 2 * 989), rel=1e-9)
            assert record["peak_memory_gib"] == [0.0, 0.0] and len(record["attention_s"]) == 2
            assert len(record["nano_tokens"]) == 2  # per micro-batch, per rank
            assert len(record["gc_ms"]) == 2 and all(isinstance(n, int) for n in record["gc_full_collections"])
            if name != "local":  # CAD: plans every micro-batch (two with ping-pong), made before the forward
                assert len(record["nano_imbalance"]) == (4 if record["ping_pong"] else 2)
                assert all(ms > 0 for ms in record["plan_ms"])
                assert all(make >= ms for make, ms in zip(record["plan_make_ms"], record["plan_ms"]))
                assert len(record["plan_wait_ms"]) == 2 and all(w >= 0 for w in record["plan_wait_ms"])
                if name == "prefix_aware":  # made ahead, on the planning thread: no make at the step's start
                    assert summary["plan_ahead"] == "on" and record["pre_plan_ms"] == [0.0, 0.0]
                else:  # +now: made at each micro-batch's start, the first one after the step began
                    assert summary["plan_ahead"] == "off"
                    assert all(0 < t < 1e3 * s for t, s in zip(record["pre_plan_ms"], record["step_s"])), record
        for rank in (0, 1):
            profile = json.loads((tmp_path / f"sweep_{name}_profile_rank{rank}.json").read_text())
            assert profile["rank"] == rank and profile["step"] == 1 and profile["step_s"] > 0
            assert isinstance(profile["families_ms"], dict) and isinstance(profile["kernels"], list)
    # the same weights and batches: CAD as local, ping-pong as one nano-batch
    for a, b, c in zip(*(runs[n]["steps"] for n in ("local", "prefix_aware", "prefix_aware_plannow_pingpong"))):
        for x, y, z in zip(a["losses"], b["losses"], c["losses"]):
            _assert_close(x, y, CAD_RTOL, f"step {a['step']} loss, CAD vs local")
            _assert_close(y, z, PING_PONG_RTOL, f"step {a['step']} loss, ping-pong vs not")
        _assert_close(a["grad_norm"], b["grad_norm"], CAD_RTOL, f"step {a['step']} grad norm, CAD vs local")
    lines = done.stdout.splitlines()
    assert "profile of step 1 on rank 0" in done.stdout
    step_lines = [line for line in lines if line.startswith("step ") and " ms " in line and "MFU" in line]
    assert len(step_lines) == 3 * (3 + 1), done.stdout  # 3 configurations x (3 steps + the profiled one)


@needs_data
@pytest.mark.torchrun
def test_a_failed_rank_exits_at_once_with_its_traceback():
    """Under torchrun a rank whose training raises prints the traceback and leaves without the interpreter's
    teardown (which waits on NCCL peers); here every rank fails at its first plan (no such balancer plugin)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(TRAINER),
           "--attention", "cad", "--balancer", "no_such_balancer", "--context", "256", "--steps", "2", *TINY,
           "--data", str(DATA)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode != 0
    assert "no_such_balancer" in done.stderr, done.stderr[-3000:]
    for rank in (0, 1):
        assert f"train_llama: rank {rank} failed; exiting without teardown" in done.stderr, done.stderr[-3000:]


# ---- the command line's options (in process: no interpreter start per case) ----------------------------------
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
    for option in ("--attention", "--balancer", "--parallel", "--checkpointing", "--checkpoint-reentrant",
                   "--micro-batches", "--model", "--compile", "--peak-tflops", "--configs", "torch_varlen",
                   "--ping-pong", "nearest half", "MFU", "--window", "--global-every", "Gemma-3"):
        assert option in text, option


def test_presets_and_defaults():
    big = parse_args(["--model", "llama3-8b", "--layers", "8", "--device", "cuda"])
    assert (big.hidden, big.heads, big.kv_heads, big.intermediate, big.vocab, big.layers) == \
        (4096, 32, 8, 14336, 128256, 8)
    assert big.parallel == "fsdp2" and big.dtype == "bf16" and big.peak_tflops == 989.0
    tiny = parse_args([])
    assert (tiny.hidden, tiny.heads, tiny.kv_heads, tiny.intermediate, tiny.layers) == (128, 4, 2, 384, 2)
    assert tiny.parallel == "ddp" and tiny.micro_batches == 1 and tiny.checkpointing == "none"
    # processes sharing a GPU (communicator host) average gradients over gloo: DDP
    assert parse_args(["--device", "cuda", "--communicator", "host"]).parallel == "ddp"


def test_bad_options_are_refused(capsys):
    err = _refused(capsys, ["--intermediate", "-1"])
    assert "--intermediate must be positive" in err and "got -1" in err
    assert "--profile-step must name one of the 3 steps (0..2), got 3" in \
        _refused(capsys, ["--steps", "3", "--profile-step", "3"])
    for configs, message in (("local,bogus+x", "'bogus+x' is not"), ("+pp", "'+pp' is not"),
                             ("local,,prefix_aware", "'' is not"), ("prefix_aware+pp+pp", "'prefix_aware+pp+pp' is not"),
                             ("local+dyn", "'local+dyn' is not"), ("prefix_aware+ctas65", "'prefix_aware+ctas65' is not"),
                             ("distca+ctas8+ctas4", "'distca+ctas8+ctas4' is not"),
                             ("local+hg2", "'local+hg2' is not"), ("prefix_aware+hg3", "'prefix_aware+hg3' is not"),
                             ("prefix_aware+hg0", "'prefix_aware+hg0' is not")):
        assert message in _refused(capsys, ["--configs", configs]), configs
    assert "must contain {config}" in _refused(capsys, ["--configs", "local", "--json-out", "x.json"])
    assert "applies to --checkpointing full only" in _refused(capsys, ["--checkpoint-reentrant"])
    assert "at least 1" in _refused(capsys, ["--micro-batches", "0"])
    assert "needs --ping-pong and an even --micro-batches, got --micro-batches 3" in \
        _refused(capsys, ["--ping-pong", "--ping-pong-nanos", "micro-batches", "--micro-batches", "3"])
    assert "got --micro-batches 2 without --ping-pong" in \
        _refused(capsys, ["--ping-pong-nanos", "micro-batches", "--micro-batches", "2"])
    for share in ("1", "-0.1"):
        assert f"--ping-pong-min-stall-share must be in [0, 1), got {float(share)}" in \
            _refused(capsys, ["--ping-pong-min-stall-share", share])
    assert "needs NCCL" in _refused(capsys, ["--device", "cuda", "--communicator", "host", "--parallel", "fsdp2"])
    assert "--cad-head-groups must be in [1, 64] and divide --heads (4) and --kv-heads (2), got 4" in \
        _refused(capsys, ["--cad-head-groups", "4"])
    assert "--window must be -1 (no window) or at least 0" in _refused(capsys, ["--window", "-2"])
    assert "--global-every needs --window" in _refused(capsys, ["--global-every", "6"])
    assert "--balancer-tolerance must be in [0, 10]" in _refused(capsys, ["--balancer-tolerance", "-0.1"])
    assert "--balancer-rate-table: /nonexistent.json is not a file" in \
        _refused(capsys, ["--configs", "prefix_aware+time", "--balancer-rate-table", "/nonexistent.json"])
    assert "--balancer-min-time-gain must be in [0, 1]" in _refused(capsys, ["--balancer-min-time-gain", "2"])
    for every in ("1", "0", "-3"):
        assert f"--global-every must be at least 2" in _refused(capsys, ["--window", "8", "--global-every", every])
    assert "--balanced-batches balances causal attention work" in \
        _refused(capsys, ["--balanced-batches", "--window", "8"])
    for configs in ("prefix_aware+pp+pp1", "local_balanced+pp", "distca+pp1+ppauto", "local+blocking",
                    "prefix_aware+blocking+blocking", "local+tol0.01", "per_doc_cp+tol0.01", "prefix_aware+tol",
                    "prefix_aware+tol11", "prefix_aware+tol0.1+tol0.2", "prefix_aware+tolx", "local+own",
                    "prefix_aware+res16", "prefix_aware+own+res65", "prefix_aware+own+res8+res16", "distca+time",
                    "local+time", "prefix_aware+time+time", "local+ce",
                    "local_balanced+ce", "prefix_aware+ce+ce", "prefix_aware+pp+ppmb", "prefix_aware+ppmb"):
        assert f"{configs!r} is not" in _refused(capsys, ["--configs", configs]), configs


def test_attention_timing_defaults_to_no_syncs_on_cuda():
    # the syncs slow an imbalanced step far more than a balanced one (bench/results/trainer_h200x2_2026-11-27_24bbc98{,_2}): step times
    # come without them unless asked for
    assert parse_args([]).sync_attention_timing == "on"  # CPU: nothing to wait for
    assert parse_args(["--device", "cuda"]).sync_attention_timing == "off"
    assert parse_args(["--device", "cuda", "--sync-attention-timing", "on"]).sync_attention_timing == "on"


def test_window_options():
    assert layer_windows(parse_args(["--layers", "4"])) == [-1] * 4  # no window: every layer global
    assert layer_windows(parse_args(["--layers", "3", "--window", "8"])) == [8, 8, 8]
    gemma = parse_args(["--layers", "12", "--window", "4096", "--global-every", "6"])
    assert layer_windows(gemma) == ([4096] * 5 + [-1]) * 2 and masks(gemma) == [(4096, 10), (-1, 2)]
    oss = parse_args(["--layers", "4", "--window", "127", "--global-every", "2"])
    assert layer_windows(oss) == [127, -1, 127, -1]


def test_list_configs_names_each_configurations_records(capsys):
    """--list-configs: each of --configs with the name its JSON gets (what tests/multi_gpu/run.sh looks for),
    training nothing; without --configs it is refused."""
    done = subprocess.run([sys.executable, str(TRAINER), "--configs",
                           "local,local_balanced,prefix_aware+own+res0+dyn,distca+pp+tol0.01,prefix_aware+now+ctas8",
                           "--list-configs"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [line.split("\t") for line in done.stdout.splitlines()] == [
        ["local", "local"], ["local_balanced", "local_balanced"],
        ["prefix_aware+own+res0+dyn", "prefix_aware_own_dyn_res0"], ["distca+pp+tol0.01", "distca_pingpong_tol0.01"],
        ["prefix_aware+now+ctas8", "prefix_aware_plannow_ctas8"]]
    # The refusal is parse_args' (before the script does anything): in process, as this file's other refusals.
    assert "give --configs" in _refused(capsys, ["--list-configs"])
