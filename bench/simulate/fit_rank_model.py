#!/usr/bin/env python3
"""fit_rank_model.py -- which simple model explains the measured per-rank server time.

Reads the per-rank tables that `cad_simulate_server_check --per-rank` and `cad_simulate_diet_check
--per-batch` print (one markdown row per server batch: label, rank, measured and table-predicted fwd/bwd ms,
then the features of tile_features.h), fits each model by least squares per direction on the --train
files' rows, and prints for every file: predicted/measured min / median / max, the same divided by its
case's median ("within case": what matters for balance, a uniform bias does not), its standard deviation,
and per case the measured vs predicted max/mean. A diet file (one batch per row, a different timing
protocol) counts as one case. A benchmark analysis, not a test.

With --write-table IN OUT it also writes a copy of rate table IN with the "backward_tiles" key
(planning/rate_table.h) set from the backward "full + partial pairs" fit on the --train rows:
microseconds per full / partial (128-key tile, 64-query step) pair of ONE query head (the rows count
pairs per head; --heads is the query heads the benchmark ran, 32 for cad_server_bench's files).

With --evaluate FILE [FILE...] (no fit) it prints, per case of those per-rank files, what the C++
prediction printed in them (the fwd / bwd pred ms columns: the table given to the check, with or
without "backward_tiles") says: backward pred/meas within the case (min / max, sd) and the measured vs
predicted forward + backward max/mean.

usage: fit_rank_model.py --train FILE [FILE...] --test FILE [FILE...] [--cases]
                         [--write-table IN OUT --heads N --source TEXT]
       fit_rank_model.py --evaluate FILE [FILE...]
"""
import argparse
import json
import numpy as np

COLS = ("meas_f meas_b pred_f pred_b seg q_rows kv_rows gflop share128 share1024 largest q_tiles f_full f_part "
        "b_ktiles b_full b_part makespan mean_load splits streams").split()


def read_rows(path):
    rows = []
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 + len(COLS):
            continue
        try:
            values = [float(c) for c in cells[2:]]
        except ValueError:
            continue  # a header row
        label = cells[0]
        if " " not in label:  # a diet batch's name (server_check's labels have spaces): the file is one case
            label = "diet"
        rows.append((label, dict(zip(COLS, values))))
    if not rows:
        raise SystemExit(f"{path}: no per-rank rows (run the check with --per-rank / --per-batch)")
    return rows


# Each model: name -> per direction a function of the row giving the regressors.
MODELS = {
    "table x k": {"f": lambda r: [r["pred_f"]], "b": lambda r: [r["pred_b"]]},
    "FLOPs": {"f": lambda r: [r["gflop"]], "b": lambda r: [r["gflop"]]},
    "full + partial pairs": {"f": lambda r: [r["f_full"], r["f_part"]], "b": lambda r: [r["b_full"], r["b_part"]]},
    "pairs + tiles": {"f": lambda r: [r["f_full"], r["f_part"], r["q_tiles"]],
                      "b": lambda r: [r["b_full"], r["b_part"], r["b_ktiles"]]},
    "fwd schedule makespan": {"f": lambda r: [r["makespan"]], "b": lambda r: [r["b_full"], r["b_part"]]},
}


def stats(labels, meas, pred):
    ratio = pred / meas
    within = np.empty_like(ratio)
    for lab in set(labels):
        m = np.array([x == lab for x in labels])
        within[m] = ratio[m] / np.median(ratio[m])
    return ratio, within


def write_table(src, dst, coef_ms, heads, source):
    """Copy of rate table `src` with "backward_tiles" from the backward pairs fit (ms per per-head pair
    summed over a batch, all `heads` query heads run): us per pair of one query head."""
    if coef_ms[0] <= 0 or coef_ms[1] <= 0:
        raise SystemExit(f"the backward pairs fit gave a coefficient <= 0 ({coef_ms}); not writing {dst}")
    table = json.load(open(src))
    table["backward_tiles"] = {
        "block_m": 64, "block_n": 128,
        "full_pair_us": round(float(coef_ms[0]) * 1e3 / heads, 6),
        "partial_pair_us": round(float(coef_ms[1]) * 1e3 / heads, 6),
        "source": source,
    }
    with open(dst, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
    print(f"wrote {dst}: backward_tiles {table['backward_tiles']}")


def evaluate(files):
    """Per case of per-rank files: the printed C++ prediction against the measurement."""
    print("| file | case | bwd pred/meas within case min / max (sd) | fwd+bwd max/mean measured | predicted | error |")
    print("|---|---|---|---|---|---|")
    for path in files:
        rows = read_rows(path)
        labels = [lab for lab, _ in rows]
        sds, errs = [], []
        for lab in dict.fromkeys(labels):
            sel = [r for l, r in rows if l == lab]
            rb = np.array([r["pred_b"] / r["meas_b"] for r in sel])
            w = rb / np.median(rb)
            meas = np.array([r["meas_f"] + r["meas_b"] for r in sel])
            pred = np.array([r["pred_f"] + r["pred_b"] for r in sel])
            mm, pm = meas.max() / meas.mean(), pred.max() / pred.mean()
            sds.append(w.std())
            errs.append(pm - mm)
            print(f"| {path} | {lab} | {w.min():.3f} / {w.max():.3f} ({w.std():.4f}) | {mm:.3f} | {pm:.3f} | "
                  f"{pm - mm:+.3f} |")
        print(f"| {path} | all cases: mean sd / mean abs error / max abs error | {np.mean(sds):.4f} | | | "
              f"{np.mean(np.abs(errs)):.3f} / {np.max(np.abs(errs)):.3f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", nargs="+")
    ap.add_argument("--test", nargs="+", default=[])
    ap.add_argument("--cases", action="store_true", help="print measured vs predicted max/mean per case")
    ap.add_argument("--write-table", nargs=2, metavar=("IN", "OUT"),
                    help="write a copy of rate table IN with backward_tiles from the fit to OUT")
    ap.add_argument("--heads", type=int, default=32, help="query heads the benchmark ran (default 32)")
    ap.add_argument("--source", default="", help="the backward_tiles source text (default: the command line)")
    ap.add_argument("--evaluate", nargs="+", help="per-rank files: print their C++ prediction per case")
    a = ap.parse_args()
    if a.evaluate:
        evaluate(a.evaluate)
        return
    if not a.train:
        ap.error("--train is required (or --evaluate)")
    train = [row for f in a.train for row in read_rows(f)]
    # Held out: the train files' rows are only used to fit; a test file's rows never are.
    sets = [("train", train)] + [(f, read_rows(f)) for f in a.test]
    fitted = {}
    for d, name in (("f", "forward"), ("b", "backward")):
        print(f"## {name}\n")
        print("| model | rows | coefficients | pred/meas min / median / max | within case min / max (sd) |")
        print("|---|---|---|---|---|")
        for model, fn in MODELS.items():
            x = np.array([fn[d](r) for _, r in train])
            y = np.array([r["meas_" + d] for _, r in train])
            coef, *_ = np.linalg.lstsq(x, y, rcond=None)
            for set_name, rows in sets:
                labels = [lab for lab, _ in rows]
                meas = np.array([r["meas_" + d] for _, r in rows])
                pred = np.array([fn[d](r) for _, r in rows]) @ coef
                ratio, within = stats(labels, meas, pred)
                print(f"| {model} | {set_name} | {' '.join(f'{c:.3g}' for c in coef)} | {ratio.min():.3f} / "
                      f"{np.median(ratio):.3f} / {ratio.max():.3f} | {within.min():.3f} / {within.max():.3f} "
                      f"({within.std():.3f}) |")
            fitted[(model, d)] = coef
        print()
    if a.write_table:
        import sys
        source = a.source or "fit: bench/simulate/fit_rank_model.py " + " ".join(sys.argv[1:])
        write_table(a.write_table[0], a.write_table[1], fitted[("full + partial pairs", "b")], a.heads, source)
    if a.cases:
        # Forward + backward per rank, the sum the balancer balances: measured vs each model's max/mean.
        names = list(MODELS)
        print("| rows | case | measured fwd+bwd max/mean | " + " | ".join(names) + " |")
        print("|---|---|---|" + "---|" * len(names))
        errors = {m: [] for m in names}
        for set_name, rows in sets[1:]:
            labels = [lab for lab, _ in rows]
            for lab in dict.fromkeys(labels):
                if lab == "diet":
                    continue  # batches of different runs and sizes: their max/mean means nothing
                sel = [r for l, r in rows if l == lab]
                meas = np.array([r["meas_f"] + r["meas_b"] for r in sel])
                cells = []
                for model in names:
                    pred = sum(np.array([MODELS[model][d](r) for r in sel]) @ fitted[(model, d)] for d in "fb")
                    cells.append(f"{pred.max() / pred.mean():.3f}")
                    errors[model].append(pred.max() / pred.mean() - meas.max() / meas.mean())
                print(f"| {set_name} | {lab} | {meas.max() / meas.mean():.3f} | " + " | ".join(cells) + " |")
        print("| held out | mean / max abs error of max/mean | | " +
              " | ".join(f"{np.mean(np.abs(e)):.3f} / {np.max(np.abs(e)):.3f}" for e in errors.values()) + " |")


if __name__ == "__main__":
    main()
