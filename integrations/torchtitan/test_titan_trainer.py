"""TorchTitan's real trainer (torchtitan.train via train_titan_cad.py) on 2 gloo ranks on the CPU: a 2-layer
debugmodel Llama 3 on the no-download packed-document data, FSDP2 and selective AC as TorchTitan configures them.
CAD with a plan per micro-batch gives the same losses, step by step, as CAD's local attention (no plan); the same
holds with TorchTitan's per-block torch.compile (aot_eager backend: no C++ compiler needed). Skipped where
torchtitan (and what it imports) is not installed; see docs/integrations.md for the packages."""
import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

pytest.importorskip("torchtitan.trainer", reason="torchtitan is not installed (pip install torchtitan)",
                    exc_type=ImportError)

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(tmp_path, config, *extra):
    out = tmp_path / f"{config}.json"
    env = dict(os.environ, CAD_TT_DEVICE="cpu", CAD_TT_JSON=str(out), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO / "host_adapter" / "python"), str(HERE),
                                           os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_port()),
           str(HERE / "train_titan_cad.py"), "--module", "train_titan_cad", "--config", config,
           "--dump_folder", str(tmp_path / "dump"), "--debug.seed", "7", "--training.steps", "3", *extra]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    return json.loads(out.read_text())


def _losses(summary):
    return [r["loss"] for r in summary["steps"]]


def test_cad_plans_match_local_attention_in_torchtitans_trainer(tmp_path):
    cad = _train(tmp_path, "llama3_debug_cad")
    local = _train(tmp_path, "llama3_debug_local")
    assert cad["attention"] == local["attention"] == "CadVarlenAttention"
    assert cad["world"] == 2 and cad["activation_checkpoint"] == "SelectiveAC.Config"
    assert len(cad["steps"]) == 3
    assert _losses(cad) == pytest.approx(_losses(local), rel=1e-5)


def test_cad_under_torchtitans_compile(tmp_path):
    local = _train(tmp_path, "llama3_debug_local")
    compiled = _train(tmp_path, "llama3_debug_cad", "--compile.enable", "--compile.backend", "aot_eager")
    assert compiled["compile"] is True
    assert _losses(compiled) == pytest.approx(_losses(local), rel=1e-5)
