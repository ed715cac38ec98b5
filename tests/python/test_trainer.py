"""examples/train_llama.py under torchrun (2 CPU ranks, gloo): CAD and local attention give the same losses
step by step, and the trainer reports what it promises (--help too)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TRAINER = REPO / "examples" / "train_llama.py"
DATA = pathlib.Path(os.environ.get("CAD_DATA", REPO.parent / "shared" / "data" / "doclen_pretrain.json"))


def _run(tmp_path, attention):
    out = tmp_path / f"{attention}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(TRAINER),
           "--attention", attention, "--context", "512", "--layers", "2", "--steps", "2", "--hidden", "64",
           "--intermediate", "96",
           "--data", str(DATA), "--timeout-ms", "60000", "--json-out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "summary " in done.stdout and done.stdout.count("\nstep ") + done.stdout.startswith("step ") == 2
    return json.loads(out.read_text())


@pytest.mark.skipif(not DATA.exists(), reason=f"no Pretrain data at {DATA}")
def test_cad_and_local_losses_agree(tmp_path):
    local, cad = _run(tmp_path, "local"), _run(tmp_path, "cad")
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


def test_negative_mlp_width_is_refused():
    done = subprocess.run([sys.executable, str(TRAINER), "--intermediate", "-1"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "--intermediate must be positive" in done.stderr and "got -1" in done.stderr
