"""cad.train.share: the realised share (speedup - 1) / (ideal - 1) and when there is none; the pipeline trainer's
comparison table and tests/multi_gpu/table.py give it by this rule."""
import importlib
import pathlib
import sys

import pytest

from cad.train.pipeline_report import comparison
from cad.train.share import realised_share, report, speedup

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_speedup_ideal_and_share():
    assert speedup(120.0, 100.0) == pytest.approx(1.2)
    got = report(baseline_step=120.0, step=100.0, ideal_step=80.0)
    assert got["speedup"] == pytest.approx(1.2) and got["ideal"] == pytest.approx(1.5)
    assert got["share"] == pytest.approx(0.2 / 0.5)
    assert report(100.0, 110.0, 90.0)["share"] < 0  # slower than the baseline: a negative share


def test_no_share_without_something_to_gain():
    assert realised_share(1.1, None) is None and realised_share(None, 1.3) is None
    assert realised_share(1.0, 1.0) is None  # the ideal gains nothing: no division by zero
    assert realised_share(1.004, 1.005, least_gain=0.01) is None and realised_share(1.01, 1.02, 0.01) is not None
    assert speedup(None, 1.0) is None and speedup(1.0, 0.0) is None


def _summary(step, ideal):
    return {"mean_step_ms_after_step0": step, "mean_ideal_step_ms_after_step0": ideal,
            "mean_tokens_per_s_after_step0": 1.0, "mean_tick_imbalance": 1.0, "mean_planned_imbalance": 1.0,
            "mean_colocated_imbalance": 1.0, "peak_memory_gib": 0.0, "sync_attention_timing": "on"}


def test_pipeline_comparison_uses_the_rule():
    rows = {r["config"]: r for r in comparison({"local": _summary(120.0, 90.0), "local_balanced": _summary(80.0, 80.0),
                                                "cad_tick": _summary(100.0, 95.0)})}
    assert rows["cad_tick"]["ideal"] == pytest.approx(1.5)  # measured: local / local_balanced
    assert rows["cad_tick"]["realised_share"] == pytest.approx(realised_share(1.2, 1.5))
    assert rows["local"]["realised_share"] == pytest.approx(0.0)


def test_multi_gpu_table_uses_the_rule():
    sys.path.insert(0, str(REPO / "tests" / "multi_gpu"))
    try:
        table = importlib.import_module("table")
    finally:
        sys.path.pop(0)
    assert table.share_cell(1.2, 1.5, "prefix_aware") == f"{realised_share(1.2, 1.5):.2f}"
    assert table.share_cell(1.2, 1.005, "prefix_aware") == "-"  # the ideal gains under 1%
    assert table.share_cell(1.5, 1.5, table.MEASURED_IDEAL) == "-"
