#!/usr/bin/env python3
"""fit_rank_model.py -- which simple model explains the measured per-rank server time (issue 14 sec. 2).

Reads the per-rank tables that `cad_simulate_server_check --per-rank` and `cad_simulate_diet_check
--per-batch` print (one markdown row per server batch: label, rank, measured and table-predicted fwd/bwd ms,
then the features of tile_features.h), fits each model by least squares per direction on the --train
files' rows, and prints for every file: predicted/measured min / median / max, the same divided by its
case's median ("within case": what matters for balance, a uniform bias does not), its standard deviation,
and per case the measured vs predicted max/mean. A diet file (one batch per row, a different timing
protocol) counts as one case. A benchmark analysis, not a test.

usage: fit_rank_model.py --train FILE [FILE...] --test FILE [FILE...] [--cases]
"""
import argparse
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", nargs="+", required=True)
    ap.add_argument("--test", nargs="+", default=[])
    ap.add_argument("--cases", action="store_true", help="print measured vs predicted max/mean per case")
    a = ap.parse_args()
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
