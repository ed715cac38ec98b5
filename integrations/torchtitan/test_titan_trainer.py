"""TorchTitan's real trainer on 2 gloo ranks on the CPU: a 2-layer debugmodel Llama 3 on the no-download
packed-document data, FSDP2 and selective AC as TorchTitan configures them. CAD with a plan per micro-batch gives
the losses of CAD's local attention (no plan), step by step, also under TorchTitan's per-block torch.compile
(aot_eager backend: no C++ compiler needed). torchtitan 0.3 runs train_titan_cad.py, 0.2.x titan_cad_spec.py with
llama3_cad.toml. Skipped where torchtitan (and what it imports) is not installed;
see docs/integrations.md for the packages."""
import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import titan_common  # noqa: E402

titan_common.stub_missing_modules()  # as the launchers do: tensorboard and `datasets` are imported, never used here
torchtitan = pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install torchtitan)")
V03 = not str(getattr(torchtitan, "__version__", "0.3")).startswith(("0.1", "0.2"))
pytest.importorskip("torchtitan.trainer" if V03 else "torchtitan.train", exc_type=ImportError,
                    reason="torchtitan's trainer does not import here (its packages: docs/integrations.md)")

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
if titan_common.default_data_path() is None:
    pytest.skip("no Pretrain data (doclen_pretrain.json: set CAD_DATA, or ../shared/data beside the checkout)",
                allow_module_level=True)


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(tmp_path, config, *extra, name=None, **environ):
    out = tmp_path / f"{name or config}.json"
    env = dict(os.environ, CAD_TT_DEVICE="cpu", CAD_TT_JSON=str(out), OMP_NUM_THREADS="1", **environ,
               PYTHONPATH=os.pathsep.join([str(REPO / "host_adapter" / "python"), str(HERE),
                                           os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_port())]
    if V03:
        cmd += [str(HERE / "train_titan_cad.py"), "--module", "train_titan_cad", "--config", f"llama3_debug_{config}",
                "--dump_folder", str(tmp_path / "dump")]
    else:
        cmd += [str(HERE / "titan_cad_spec.py"), "--job.config_file", str(HERE / "llama3_cad.toml"),
                "--model.name", {"cad": "llama3_cad", "local": "llama3_cad_local"}[config], "--model.flavor",
                "debugmodel", "--training.seq_len", "1024", "--job.dump_folder", str(tmp_path / f"dump_{name or config}")]
        env["CAD_TT_LAYERS"] = "2"
    cmd += ["--debug.seed", "7", "--training.steps", "3", *extra]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    return json.loads(out.read_text())


def _losses(summary):
    return [r["loss"] for r in summary["steps"]]


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """TorchTitan's trainer with the local attention, default options: the reference of two tests (trained once)."""
    return _train(tmp_path_factory.mktemp("local"), "local")


def test_cad_plans_match_local_attention_in_torchtitans_trainer(tmp_path, local_run):
    cad = _train(tmp_path, "cad")
    local = local_run
    assert cad["world"] == 2 and len(cad["steps"]) == 3
    if V03:
        assert cad["attention"] == local["attention"] == "CadVarlenAttention.Config"
        # CAD's forward saved by selective AC as TorchTitan's own attention is (train_titan_cad.CadSelectiveAC):
        # per layer and step one forward and one backward ran, no recomputed forward.
        assert cad["activation_checkpoint"] == local["activation_checkpoint"] == "CadSelectiveAC.Config"
        assert [r["attention_calls"] for r in cad["steps"]] == [2 * cad["layers"]] * 3
    else:
        assert (cad["model"], local["model"]) == ("llama3_cad", "llama3_cad_local")
        assert cad["activation_checkpoint"] == "selective"
    assert _losses(cad) == pytest.approx(_losses(local), rel=1e-4)


@pytest.mark.skipif(V03, reason="plans made at load time: the 0.2.x launcher's trainer (titan_cad_spec.py)")
def test_plans_are_made_when_micro_batches_load(tmp_path):
    # Two micro-batches per step (global batch 4 over 2 ranks of local batch 1): each asked for when it loads, one
    # micro-batch ahead of TorchTitan (PlanOneAhead), and used in that order; losses as local's. So from the second
    # step on, the step's first micro-batch was loaded, and its plan asked for, while the step before computed.
    extra = ("--training.global_batch_size", "4")
    cad, local = _train(tmp_path, "cad", *extra), _train(tmp_path, "local", *extra)
    assert [r["micro_batches_planned_ahead"] for r in cad["steps"]] == [2, 2, 2]
    assert [r["planned_in_an_earlier_step"] for r in cad["steps"]] == [0, 1, 1]
    assert all(r["plan_wait_ms"] >= 0 for r in cad["steps"])
    assert all("micro_batches_planned_ahead" not in r for r in local["steps"])
    # The TOML's per-op selective AC saves CAD's forward as TorchTitan saves its own attention's: per layer and
    # micro-batch one forward and one backward ran (2 layers x 2 micro-batches), no recomputed forward (that is 12).
    assert [r["attention_calls"] for r in cad["steps"]] == [8, 8, 8]
    assert [r["attention_calls"] for r in local["steps"]] == [8, 8, 8]
    assert _losses(cad) == pytest.approx(_losses(local), rel=1e-4)


def test_cad_under_torchtitans_compile(tmp_path, local_run):
    local = local_run
    compiled = _train(tmp_path, "cad", "--compile.enable", "--compile.backend", "aot_eager")
    assert compiled["compile"] is True
    assert _losses(compiled) == pytest.approx(_losses(local), rel=1e-5)


def test_balanced_dataset_gives_every_rank_the_mean_attention_work():
    """dataset "pretrain_synthetic_balanced" (the measured ideal's rows): every rank keeps a full row of tokens, its
    documents become equal lengths whose causal work is the mean rank's; the real batch is far from that."""
    lengths = json.loads(pathlib.Path(titan_common.default_data_path()).read_text())
    seq_len, ranks = 16384, 2

    def rows(dataset):
        out = []
        for rank in range(ranks):
            data = titan_common.packed_documents(dataset, lengths, seq_len, 1000, rank, ranks, seed=7)
            docs = data.documents(0)
            sample, labels = next(iter(data))
            assert sum(docs) == seq_len and sample["input"].shape == (seq_len,) and labels.shape == (seq_len,)
            starts = torch.nonzero(sample["positions"] == 0).flatten().tolist()
            assert len(starts) == len(docs)  # positions restart at every document
            out.append(docs)
        return out

    def work(docs):
        return sum(n * (n + 1) // 2 for n in docs)

    real, balanced = rows("pretrain_synthetic"), rows("pretrain_synthetic_balanced")
    real_work, balanced_work = [work(d) for d in real], [work(d) for d in balanced]
    mean = sum(real_work) / ranks
    assert max(real_work) / mean > 1.05, real_work  # this batch is imbalanced ...
    assert max(abs(w - mean) for w in balanced_work) / mean < 0.02, balanced_work  # ... its balanced rows are not
    with pytest.raises(ValueError, match="'pretrain_other'.*pretrain_synthetic_balanced"):
        titan_common.packed_documents("pretrain_other", lengths, seq_len, 1000, 0, ranks, seed=7)


@pytest.mark.skipif(V03, reason="the 0.2.x launcher's trainer (titan_cad_spec.py)")
def test_plan_one_ahead_plans_each_micro_batch_as_it_loads_one_ahead():
    import titan_cad_spec
    planned = []

    def plan(batch):
        planned.append(batch)
        return f"plan {batch}"
    ahead = titan_cad_spec.PlanOneAhead(iter(range(5)), plan)
    ahead.begin_step(1)
    assert next(ahead) == 0 and planned == [0, 1]  # the first waits for its own plan; the next is asked for now
    assert ahead.take_plans() == ["plan 0"] and ahead.take_plans() == []  # the plans of what was taken, once
    ahead.begin_step(2)
    assert next(ahead) == 1 and planned == [0, 1, 2] and ahead.planned_in_an_earlier_step == 1
    assert [next(ahead), next(ahead), next(ahead)] == [2, 3, 4] and planned == [0, 1, 2, 3, 4]
    assert ahead.take_plans() == ["plan 1", "plan 2", "plan 3", "plan 4"]
    with pytest.raises(StopIteration):  # the end of the data reaches the trainer when it gets there
        next(ahead)

    def failing():
        yield "a"
        raise RuntimeError("the dataset broke")
    ahead = titan_cad_spec.PlanOneAhead(failing(), lambda batch: None)
    assert next(ahead) == "a"  # the failure was met while looking ahead, and is raised when its turn comes
    with pytest.raises(RuntimeError, match="the dataset broke"):
        next(ahead)
    # without looking ahead (checkpoints saved: the data's state must count only what trained) each micro-batch
    # is loaded and planned when asked for
    planned = []
    source = iter(range(3))
    ahead = titan_cad_spec.PlanOneAhead(source, plan, look_ahead=False)
    assert next(ahead) == 0 and planned == [0] and next(source) == 1 and ahead.take_plans() == ["plan 0"]


@pytest.mark.skipif(V03, reason="the 0.2.x launcher's trainer (titan_cad_spec.py)")
def test_plan_one_ahead_close_waits_for_and_gives_back_the_plan_loaded_ahead():
    """After the last step one micro-batch is loaded ahead and its plan is being made on every rank: close() (the
    trainer's, before TorchTitan destroys the process groups) waits for it and releases it; a plan that failed
    is released too, without raising over the run's own outcome."""
    import titan_cad_spec

    class FakePlan:
        def __init__(self, fail=False):
            self.fail, self.events = fail, []

        def wait(self):
            self.events.append("wait")
            if self.fail:
                raise RuntimeError("planning failed")

        def release(self):
            self.events.append("release")

    plans = [FakePlan(), FakePlan(), FakePlan(fail=True)]
    ahead = titan_cad_spec.PlanOneAhead(iter(range(3)), lambda batch: plans[batch])
    assert next(ahead) == 0 and plans[1].events == []  # micro-batch 1 loaded ahead, its plan outstanding
    ahead.close()
    assert plans[1].events == ["wait", "release"] and plans[0].events == []
    ahead.close()  # nothing left: a second close does nothing
    assert plans[1].events == ["wait", "release"]
    ahead = titan_cad_spec.PlanOneAhead(iter(range(3)), lambda batch: plans[batch])
    next(ahead), next(ahead)  # micro-batch 2 (whose plan fails) loaded ahead
    ahead.close()
    assert plans[2].events == ["wait", "release"]


@pytest.mark.skipif(V03, reason="the 0.2.x launcher's trainer (titan_cad_spec.py)")
def test_plan_one_ahead_hands_back_the_micro_batch_loaded_ahead_at_close_and_then_stops():
    """close() with micro-batch 1 loaded ahead hands it back (it was not trained) and loads nothing more; next()
    after close raises instead of going on with micro-batch 2, which would skip micro-batch 1 without a word."""
    import titan_cad_spec

    class FakePlan:
        def wait(self):
            pass

        def release(self):
            pass

    loaded = []
    ahead = titan_cad_spec.PlanOneAhead(iter(range(5)), lambda batch: loaded.append(batch) or FakePlan())
    assert next(ahead) == 0 and loaded == [0, 1]
    assert ahead.close() == 1  # the micro-batch loaded ahead, handed back
    with pytest.raises(RuntimeError, match=r"next\(\) on a PlanOneAhead after close\(\)"):
        next(ahead)
    assert loaded == [0, 1] and ahead.close() is None  # nothing loaded after close; nothing left to hand back
    # without looking ahead nothing is held, and next() after close raises all the same
    ahead = titan_cad_spec.PlanOneAhead(iter(range(5)), lambda batch: None, look_ahead=False)
    assert next(ahead) == 0 and ahead.close() is None
    with pytest.raises(RuntimeError, match="after close"):
        next(ahead)
    # the end of the data met while looking ahead: nothing is held, close hands back nothing
    ahead = titan_cad_spec.PlanOneAhead(iter([0]), lambda batch: None)
    assert next(ahead) == 0 and ahead.close() is None


@pytest.mark.skipif(V03, reason="the 0.2.x launcher's trainer (titan_cad_spec.py)")
def test_plan_one_ahead_a_plan_that_fails_ahead_loses_no_micro_batch():
    """Asking for micro-batch 1's plan fails while micro-batch 0 is taken: micro-batch 0 (planned) still trains,
    and the failure is raised when the trainer reaches micro-batch 1."""
    import titan_cad_spec

    def plan(batch):
        if batch == 1:
            raise RuntimeError("the plan of micro-batch 1 failed")
        return f"plan {batch}"
    ahead = titan_cad_spec.PlanOneAhead(iter(range(3)), plan)
    assert next(ahead) == 0 and ahead.take_plans() == ["plan 0"]
    with pytest.raises(RuntimeError, match="the plan of micro-batch 1 failed"):
        next(ahead)


@pytest.mark.skipif(V03, reason="the 0.2.x launcher's trainer (titan_cad_spec.py)")
def test_plan_one_ahead_for_another_source_refuses_to_drop_the_micro_batch_loaded_ahead():
    """The trainer keeps one PlanOneAhead per data iterator (PlanOneAhead.for_source): the same iterator keeps it;
    another, while a micro-batch of the first is loaded ahead, is refused naming the loss; once nothing is held
    (the data ended) a new one starts."""
    import titan_cad_spec

    class Plan(str):  # what plan_ahead returns, as far as close() goes: wait() and release()
        def wait(self):
            pass

        def release(self):
            pass
    plan = Plan
    first = titan_cad_spec.PlanOneAhead(iter(range(3)), plan)
    assert next(first) == 0
    assert titan_cad_spec.PlanOneAhead.for_source(first, first.source, plan) is first
    with pytest.raises(RuntimeError, match="another data iterator.*would never train"):
        titan_cad_spec.PlanOneAhead.for_source(first, iter(range(3)), plan)
    ended = titan_cad_spec.PlanOneAhead(iter([0]), plan)
    assert next(ended) == 0
    fresh = titan_cad_spec.PlanOneAhead.for_source(ended, iter(["a", "b"]), plan)
    assert fresh is not ended and next(fresh) == "a" and fresh.take_plans() == ["a"]


@pytest.mark.skipif(V03, reason="context parallelism through CAD: the 0.2.x spec (titan_cad_spec.py, titan_parallel.py)")
def test_context_parallel_degree_trains_through_cad_as_the_same_pieces_over_data_ranks(tmp_path):
    """TorchTitan's trainer with parallelism.context_parallel_degree 2 (varlen attention, which TorchTitan's own CP
    refuses) on dataset pretrain_stream: both ranks get their CP group's 1024-token row and keep their half, a
    document spans the two, positions continuous. The same stream over 2 data-parallel ranks of 512 tokens gives
    every rank the same pieces: losses of every step and the first step's gradients equal (fp32)."""
    stream = titan_common.PackedStream(json.loads(pathlib.Path(titan_common.default_data_path()).read_text()),
                                       1024, 32768, 0, 1, 2, 7)
    docs = [{p[0] for p in layout.pieces} for layout in stream.layouts(0)]
    assert docs[0] & docs[1]  # a document cut across the two ranks
    common = ("--training.dataset", "pretrain_stream", "--training.mixed_precision_param", "float32",
              "--training.steps", "2")
    longest = {"CAD_TT_MAX_DOC_LEN": "1024"}  # the same documents in both (the default is seq_len)
    cp = _train(tmp_path, "cad", *common, "--parallelism.context_parallel_degree", "2", name="cp2",
                CAD_TT_GRADS=str(tmp_path / "cp2.pt"), **longest)
    dp = _train(tmp_path, "cad", *common, "--training.seq_len", "512", name="dp2",
                CAD_TT_GRADS=str(tmp_path / "dp2.pt"), **longest)
    assert _losses(cp) == pytest.approx(_losses(dp), rel=1e-5)
    cp_grads, dp_grads = torch.load(tmp_path / "cp2.pt"), torch.load(tmp_path / "dp2.pt")
    assert cp_grads.keys() == dp_grads.keys()
    for name, g in dp_grads.items():
        torch.testing.assert_close(cp_grads[name], g, rtol=1e-4, atol=1e-7, msg=name)
