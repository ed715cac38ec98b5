"""tests/multi_gpu/run.sh's train stage on the CPU (a stand-in nvidia-smi, the trainer's --device cpu through
TRAINER_ARGS, two processes over gloo): ROUNDS=2 trains the contexts twice into round1/round2, the second round's
configurations rotated by one, and pools them (table_pooled.md); every configuration's records are found under the name the trainer gives them, options after
the base included (+dyn), so none is retrained or reported missing."""
import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
DATA = pathlib.Path(os.environ.get("CAD_DATA", REPO.parent / "shared" / "data" / "doclen_pretrain.json"))
HOST = os.environ.get("CAD_HOST_LIBRARY")


@pytest.mark.torchrun
@pytest.mark.skipif(not DATA.exists(), reason=f"no Pretrain data at {DATA}")
@pytest.mark.skipif(not HOST, reason="CAD_HOST_LIBRARY names no built libcad_host")
def test_rounds_train_twice_and_pool(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: stand-in'\necho 'GPU 1: stand-in'\n")
    (fake / "nvidia-smi").chmod(0o755)
    build = pathlib.Path(HOST).resolve().parents[1]  # <build>/lib/libcad_host.so
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", NGPU="2", ONLY="train", BUILD=str(build),
               OUT=str(out), CONTEXTS="256", LAYERS="256:1", STEPS="2", ROUNDS="2", TRAIN_BUDGET_S="400",
               CONFIGS="local,local_balanced,prefix_aware+dyn", CAD_DATA=str(DATA),
               TRAINER_ARGS="--device cpu --dtype fp32 --parallel ddp --hidden 64 --intermediate 96 --heads 4 "
                            "--kv-heads 2 --vocab 256 --timeout-ms 20000")
    done = subprocess.run(["bash", str(REPO / "tests" / "multi_gpu" / "run.sh")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for round_dir in ("round1", "round2"):
        names = sorted(p.name for p in (out / round_dir).glob("train_*_256.json"))
        assert names == ["train_local_256.json", "train_local_balanced_256.json", "train_prefix_aware_dyn_256.json"]
    summary = (out / "summary.txt").read_text()
    assert summary.count("(one process, round 1): passed") == 1 and summary.count("(one process, round 2): passed") == 1
    assert "alone (missing" not in summary and "not run" not in summary
    # Round 2 trains the configurations rotated by one: no configuration always first.
    assert "train local,local_balanced,prefix_aware+dyn at 256 " in summary
    assert "train local_balanced,prefix_aware+dyn,local at 256 " in summary
    assert '"cad_forward_walk": "dynamic"' in summary  # +dyn's own summary, not the base configuration's
    pooled = (out / "table_pooled.md").read_text()
    assert "Pooled over 2 runs" in pooled
    rows = [line for line in pooled.splitlines() if line.startswith("| 256 |")]
    assert [r.split("|")[2].strip() for r in rows] == ["local", "local_balanced", "prefix_aware_dyn"]
    assert all(r.split("|")[3].strip() == "2" for r in rows)  # each configuration in both rounds
    # A ROUNDS that is no positive whole number is refused before anything trains, naming it.
    env.update(ROUNDS="0", OUT=str(tmp_path / "refused"))
    (tmp_path / "refused").mkdir()
    done = subprocess.run(["bash", str(REPO / "tests" / "multi_gpu" / "run.sh")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "ROUNDS=0 is not a positive whole number" in done.stdout
    assert not list((tmp_path / "refused").glob("round*")) and not list((tmp_path / "refused").glob("train_*"))
