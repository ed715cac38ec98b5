"""examples/train_llama.py under torchrun (2 CPU ranks, gloo): CAD and local attention give the same losses
step by step, --ping-pong gives the same losses and gradients as one nano-batch, and the trainer reports what
it promises (--help too)."""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TRAINER = REPO / "examples" / "train_llama.py"
DATA = pathlib.Path(os.environ.get("CAD_DATA", REPO.parent / "shared" / "data" / "doclen_pretrain.json"))


_RUNS = {}  # (attention, extra, steps) -> (JSON, stdout): the runs several tests compare with (each ~6 s)


def _run(tmp_path, attention, *extra, steps=3):
    """The trainer's JSON (summary and steps) and its stdout; a run with the same arguments is done once."""
    key = (attention, extra, steps)
    if key not in _RUNS:
        _RUNS[key] = _train(tmp_path, attention, *extra, steps=steps)
    return _RUNS[key]


def _train(tmp_path, attention, *extra, steps):
    out = tmp_path / f"{attention}{''.join(extra)}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(TRAINER),
           "--attention", attention, "--context", "512", "--layers", "2", "--steps", str(steps), "--hidden", "64",
           "--intermediate", "96",
           "--data", str(DATA), "--timeout-ms", "60000", "--json-out", str(out), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "summary " in done.stdout and done.stdout.count("\nstep ") + done.stdout.startswith("step ") >= steps
    result = json.loads(out.read_text())
    assert len(result["steps"]) == steps
    return result, done.stdout


@pytest.mark.skipif(not DATA.exists(), reason=f"no Pretrain data at {DATA}")
def test_cad_and_local_losses_agree(tmp_path):
    args = ("--balancer", "prefix_aware", "--seed", "1")  # as test_ping_pong_trains_the_same's first case
    (local, _), (cad, _) = _run(tmp_path, "local", *args), _run(tmp_path, "cad", *args)
    for a, b in zip(local["steps"], cad["steps"]):
        assert len(a["losses"]) == 2 and len(a["attention_s"]) == 2
        for x, y in zip(a["losses"], b["losses"]):
            assert abs(x - y) <= 1e-5 * abs(x), (a["losses"], b["losses"])
    # the recipe's buffers are unequal; CAD's plan is balanced
    assert cad["summary"]["mean_imbalance"] < 1.1 and cad["summary"]["balancer"] == "prefix_aware"
    assert cad["summary"]["intermediate"] == 96 and local["summary"]["intermediate"] == 96


def test_help():
    done = subprocess.run([sys.executable, str(TRAINER), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--attention" in done.stdout and "--balancer" in done.stdout
    assert "--ping-pong" in done.stdout and "nearest half" in done.stdout


def test_negative_mlp_width_is_refused():
    done = subprocess.run([sys.executable, str(TRAINER), "--intermediate", "-1"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "--intermediate must be positive" in done.stderr and "got -1" in done.stderr


# ---- --ping-pong ---------------------------------------------------------------------------------------------
def _trainer_module():
    spec = importlib.util.spec_from_file_location("train_llama", TRAINER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_split_at_the_document_boundary_nearest_half():
    t = _trainer_module()
    assert t.split_point([100, 10, 10, 100]) == 2             # 110 | 110
    assert t.split_point([300, 10, 200]) == 1                 # 300 | 210 is nearer half (255) than 310 | 200
    assert t.split_point([10, 20, 30, 300]) == 3              # the long last document alone
    assert t.split_point([5, 5]) == 1 and t.split_point([7]) is None and t.split_point([]) is None
    assert t.split_point([4, 2, 4]) == 1                      # 4 | 6 and 6 | 4 tie: the first boundary
    assert t.nano_batches([[3, 4, 5], [1, 9]], True) == [[[3, 4], [5]], [[1], [9]]]
    # one rank with one document: nobody splits (the plans are collective), the buffers stay whole
    assert t.nano_batches([[3, 4, 5], [12]], True) == [[[3, 4, 5]], [[12]]]
    assert t.nano_batches([[3, 4, 5], [1, 9]], False) == [[[3, 4, 5]], [[1, 9]]]


# fp32 on CPU: with and without ping-pong the same per-token terms are summed, in another order (two partial
# sums of the cross-entropy, linear layers over half-length inputs, other CAD plans), so each loss and gradient
# norm may differ by a few units in the last place (fp32 eps 1.2e-7; seen: 0 or 1 ulp, <= 7e-8 relative).
# 1e-6 is ~8 eps: a wrong weighting or a document cut between nano-batches moves them far more.
PING_PONG_RTOL = 1e-6


def _assert_same_training(plain, pp):
    for a, b in zip(plain["steps"], pp["steps"]):
        assert a["step"] == b["step"]
        for x, y in zip(a["losses"], b["losses"]):
            assert abs(x - y) <= PING_PONG_RTOL * abs(x), (a["step"], a["losses"], b["losses"])
        assert abs(a["grad_norm"] - b["grad_norm"]) <= PING_PONG_RTOL * a["grad_norm"], (a, b)


@pytest.mark.skipif(not DATA.exists(), reason=f"no Pretrain data at {DATA}")
@pytest.mark.parametrize("attention,balancer,seed", [("cad", "prefix_aware", "1"), ("cad", "colocated", "43"),
                                                     ("local", "prefix_aware", "1")])
def test_ping_pong_trains_the_same(tmp_path, attention, balancer, seed):
    """Seed 43's step 1 has a rank with one document (the recipe cut a long one to the buffer's length): that
    step runs unsplit, with a note; steps 0 and 2 are split. Seed 1's steps are all split."""
    args = ("--balancer", balancer, "--seed", seed)
    (plain, _), (pp, out) = _run(tmp_path, attention, *args), _run(tmp_path, attention, *args, "--ping-pong")
    _assert_same_training(plain, pp)
    unsplit = [1] if seed == "43" else []
    assert [r["step"] for r in pp["steps"] if not r["ping_pong"]] == unsplit
    assert not any(r["ping_pong"] for r in plain["steps"])
    summary = pp["summary"]
    assert summary["ping_pong"] is True and plain["summary"]["ping_pong"] is False
    if attention == "cad" and balancer == "prefix_aware":
        assert summary["mean_imbalance"] < 1.1  # each plan balances its nano-batch
    assert summary["ping_pong_steps"] == 3 - len(unsplit) and summary["attention_timing"] == "synchronized"
    for record in pp["steps"]:
        nanos = record["nano_tokens"]  # per rank: both nano-batches hold tokens and add up to the buffer
        assert len(nanos) == 2 and all(sum(n) == 512 and min(n) > 0 for n in nanos)
        assert all(len(n) == (2 if record["ping_pong"] else 1) for n in nanos)
        if attention == "cad":  # both plans' work added up per server: between 1 and the worse plan's
            assert len(record["nano_imbalance"]) == len(nanos[0])
            assert 1 <= record["imbalance"] <= max(record["nano_imbalance"]) + 1e-12
        if balancer == "colocated":  # every rank serves its own documents: the colocated cost of the buffers
            assert record["imbalance"] == pytest.approx(record["colocated_imbalance"], rel=1e-12)
    lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert [("ping-pong" in line and "off" not in line) for line in lines if "loss" in line] == \
        [r["ping_pong"] for r in pp["steps"]]
    if unsplit:
        assert any("ping-pong off for this step: rank(s) [0] hold one document" in line for line in lines), out


# ---- what every step records, and --profile-step -------------------------------------------------------------
def test_kernel_families():
    t = _trainer_module()
    assert t.kernel_family("void cad::kernels::detail::attention_bwd_sm90_ws_kernel<128, 2>(BwdParams)") == "attention"
    assert t.kernel_family("cudnn_generated_fort_native_sdpa_sm90_flash_fprop") == "attention"
    assert t.kernel_family("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)") == "nccl"
    assert t.kernel_family("void cad::kernels::copy_row_ranges_kernel(RowCopy const*, long)") == "cad data path"
    assert t.kernel_family("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64") == "gemm"
    assert t.kernel_family("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT") == "gemm"
    assert t.kernel_family("void at::native::vectorized_elementwise_kernel<4, ...>") == "other"


@pytest.mark.skipif(not DATA.exists(), reason=f"no Pretrain data at {DATA}")
def test_profiled_step_is_recorded_apart(tmp_path):
    """--profile-step 1: after the 3 timed steps, step 1's batch runs once more under the profiler; every rank
    writes its profile, the JSON keeps that run as "profiled_step" outside "steps", and the timed steps (and so
    the summary) are those of a run without profiling. Every record has each rank's step time, peak memory (0 on
    CPU) and plan time (CAD's plan is made in every step)."""
    args = ("--balancer", "prefix_aware", "--seed", "1")
    plain, _ = _run(tmp_path, "cad", *args)
    profiled, out = _run(tmp_path, "cad", *args, "--profile-step", "1")
    assert [r["profiled"] for r in profiled["steps"]] == [False, False, False]
    extra = profiled["profiled_step"]
    assert extra["step"] == 1 and extra["profiled"] is True
    assert extra["nano_tokens"] == profiled["steps"][1]["nano_tokens"]  # the same batch
    for a, b in zip(plain["steps"], profiled["steps"]):
        assert a["losses"] == pytest.approx(b["losses"], rel=1e-6)
    summary = profiled["summary"]
    timed = [max(r["step_s"]) for r in profiled["steps"][1:]]
    assert summary["mean_step_s_after_step0"] == pytest.approx(sum(timed) / len(timed), rel=1e-12)
    for record in profiled["steps"] + [extra]:
        assert len(record["step_s"]) == 2 and all(s > 0 for s in record["step_s"])
        assert record["peak_memory_gib"] == [0.0, 0.0]
        assert len(record["plan_ms"]) == 2 and all(ms > 0 for ms in record["plan_ms"]), record["plan_ms"]
        # The whole collective make contains the balancer's share; it starts after the step does.
        assert all(make >= ms for make, ms in zip(record["plan_make_ms"], record["plan_ms"])), record
        assert len(record["pre_plan_ms"]) == 2 and all(0 < t < 1e3 * s for t, s in
                                                       zip(record["pre_plan_ms"], record["step_s"])), record
        assert len(record["gc_ms"]) == 2 and all(ms >= 0 for ms in record["gc_ms"])
        assert all(isinstance(n, int) and n >= 0 for n in record["gc_full_collections"])
    json_out = next(tmp_path.glob("cad*--profile-step1.json"))
    for rank in (0, 1):
        profile = json.loads(json_out.with_name(f"{json_out.stem}_profile_rank{rank}.json").read_text())
        assert profile["rank"] == rank and profile["step"] == 1 and profile["step_s"] > 0
        assert isinstance(profile["families_ms"], dict) and isinstance(profile["kernels"], list)
    assert "profile of step 1 on rank 0" in out


@pytest.mark.skipif(not DATA.exists(), reason=f"no Pretrain data at {DATA}")
def test_configs_in_one_process_train_as_separate_runs(tmp_path):
    """--configs local,prefix_aware,prefix_aware+pp: one process trains the three configurations in turn, each
    from the same weights with its own CAD stack, and writes the JSON a separate run of each writes."""
    args = ("--balancer", "prefix_aware", "--seed", "1")
    separate = {"local": _run(tmp_path, "local", *args)[0], "prefix_aware": _run(tmp_path, "cad", *args)[0],
                "prefix_aware_pingpong": _run(tmp_path, "cad", *args, "--ping-pong")[0]}
    out = tmp_path / "sweep_{config}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(TRAINER),
           "--configs", "local,prefix_aware,prefix_aware+pp", "--context", "512", "--layers", "2", "--steps", "3",
           "--hidden", "64", "--intermediate", "96", "--seed", "1", "--data", str(DATA), "--timeout-ms", "60000",
           "--json-out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("==== configuration ") == 3
    for label, alone in separate.items():
        swept = json.loads((tmp_path / f"sweep_{label}.json").read_text())
        for key in ("attention", "balancer", "ping_pong", "layers", "context"):
            assert swept["summary"][key] == alone["summary"][key], (label, key)
        for a, b in zip(alone["steps"], swept["steps"]):
            assert a["losses"] == pytest.approx(b["losses"], rel=1e-6), (label, a["step"])
            assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-6), (label, a["step"])


@pytest.mark.skipif(not DATA.exists(), reason=f"no Pretrain data at {DATA}")
def test_gc_freeze_trains_the_same(tmp_path):
    """--gc freeze (the collector stops scanning the model) changes no loss; the records count the collector's
    pauses per rank either way."""
    args = ("--balancer", "prefix_aware", "--seed", "1")
    auto, _ = _run(tmp_path, "cad", *args)
    frozen, _ = _run(tmp_path, "cad", *args, "--gc", "freeze")
    assert auto["summary"]["gc"] == "auto" and frozen["summary"]["gc"] == "freeze"
    for a, b in zip(auto["steps"], frozen["steps"]):
        assert a["losses"] == pytest.approx(b["losses"], rel=1e-6)
        assert len(b["gc_ms"]) == 2 and len(b["gc_full_collections"]) == 2


@pytest.mark.skipif(not DATA.exists(), reason=f"no Pretrain data at {DATA}")
def test_plan_first_trains_the_same(tmp_path):
    """--plan-first makes the step's plan before the embedding (one nano-batch through the ping-pong path):
    the losses of the default run, where the first layer's attention call makes it, and a plan every step."""
    args = ("--balancer", "prefix_aware", "--seed", "1")
    at_layer, _ = _run(tmp_path, "cad", *args)
    first, _ = _run(tmp_path, "cad", *args, "--plan-first")
    assert first["summary"]["plan_first"] is True and at_layer["summary"]["plan_first"] is False
    for a, b in zip(at_layer["steps"], first["steps"]):
        assert a["losses"] == pytest.approx(b["losses"], rel=1e-5)
        assert b["imbalance"] == pytest.approx(a["imbalance"], rel=1e-9) and all(ms > 0 for ms in b["plan_make_ms"])


def test_configs_are_checked():
    done = subprocess.run([sys.executable, str(TRAINER), "--steps", "3", "--profile-step", "3"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "--profile-step must name one of the 3 steps (0..2), got 3" in done.stderr
    for configs, message in (("local,bogus+x", "'bogus+x' is not"), ("+pp", "'+pp' is not"),
                             ("local,,prefix_aware", "'' is not")):
        done = subprocess.run([sys.executable, str(TRAINER), "--configs", configs], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2 and message in done.stderr, (configs, done.stderr)
    done = subprocess.run([sys.executable, str(TRAINER), "--configs", "local", "--json-out", "x.json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "must contain {config}" in done.stderr


@pytest.mark.skipif(not DATA.exists(), reason=f"no Pretrain data at {DATA}")
def test_a_failed_rank_exits_at_once_with_its_traceback(tmp_path):
    """Under torchrun a rank whose training raises prints the traceback and leaves without the interpreter's
    teardown (which waits on NCCL peers); here every rank fails at its first plan (no such balancer plugin)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(TRAINER),
           "--attention", "cad", "--balancer", "no_such_balancer", "--context", "512", "--layers", "1", "--steps", "2",
           "--hidden", "64", "--intermediate", "96", "--data", str(DATA), "--timeout-ms", "60000"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode != 0
    assert "no_such_balancer" in done.stderr, done.stderr[-3000:]
    for rank in (0, 1):
        assert f"train_llama: rank {rank} failed; exiting without teardown" in done.stderr, done.stderr[-3000:]
