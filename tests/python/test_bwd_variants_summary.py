"""bench/kernels/bwd_variants_summary.py: medians over rounds and medians of per-round ratios to the first
variant, for the backward and the forward apart, from cad_bwd_variant_bench's CSVs (a line cut short skipped)."""
import csv
import pathlib

from script_module import load_script

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "kernels" / "bwd_variants_summary.py"


def load():
    return load_script(SCRIPT)


def write(log, variant, rnd, fwd, bwd, cut=False):
    text = "case,d,fwd_ms,bwd_ms,fwd_tflops,bwd_tflops\n" + f"dense_16k,128,1,1,{fwd},{bwd}\n"
    if cut:
        text += "dense_64k,128,1"  # a timeout cut the line
    (log / f"bench_v{variant}_r{rnd}.csv").write_text(text)


def test_medians_and_per_round_ratios_both_directions(tmp_path):
    m = load()
    log = tmp_path / "logs"
    log.mkdir()
    # Round 2 is slow for both variants: per-round ratios see through it, medians of rates do not.
    for rnd, (fa, ba, fb, bb) in enumerate([(600, 500, 570, 550), (300, 250, 290, 270), (610, 505, 580, 560)], 1):
        write(log, "a", rnd, fa, ba, cut=rnd == 3)
        write(log, "b", rnd, fb, bb)
    assert m.main(["x", str(log), str(tmp_path), "a", "b"]) == 0
    rows = {r["variant"]: r for r in csv.DictReader(open(tmp_path / "summary.csv"))}
    assert set(rows) == {"a", "b"} and rows["a"]["rounds"] == "3"
    assert float(rows["b"]["bwd_tflops"]) == 550.0 and float(rows["b"]["fwd_tflops"]) == 570.0
    assert float(rows["b"]["bwd_ratio_to_first"]) == round(sorted([550 / 500, 270 / 250, 560 / 505])[1], 4)
    assert float(rows["b"]["fwd_ratio_to_first"]) == round(sorted([570 / 600, 290 / 300, 580 / 610])[1], 4)
    assert (rows["b"]["fwd_min"], rows["b"]["fwd_max"]) == ("290.0", "580.0")
    md = (tmp_path / "summary.md").read_text()
    assert md.index("Backward TFLOP/s") < md.index("Forward TFLOP/s")
    fwd_row = md.split("Forward TFLOP/s")[1]
    assert "| dense_16k | 128 | 600.0 (300.0-610.0, 3 r) | 1.0 | 570.0 (290.0-580.0, 3 r) | 0.9508 |" in fwd_row


def test_no_result_at_all_fails(tmp_path):
    m = load()
    (tmp_path / "logs").mkdir()
    assert m.main(["x", str(tmp_path / "logs"), str(tmp_path), "a"]) == 1
