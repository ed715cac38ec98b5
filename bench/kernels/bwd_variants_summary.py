#!/usr/bin/env python3
"""The tables of bench/kernels/bwd_variants.sh: per case and head dim, each variant's median backward and
forward TFLOP/s over the rounds of cad_bwd_variant_bench, their ranges, and the medians over rounds of their
ratios to the first variant's in the same round (backward, then forward: a variant may change either).

usage: bwd_variants_summary.py LOG_DIR OUT_DIR VARIANT... (reads LOG_DIR/bench_v<V>_r<R>.csv; writes
OUT_DIR/summary.csv and OUT_DIR/summary.md and prints the markdown). Exits 1 when no round has any result."""
import csv
import glob
import os
import re
import statistics
import sys


def load(log_dir, variants):
    """{(case, d): {variant: {round: (fwd_tflops, bwd_tflops)}}}"""
    out = {}
    for path in sorted(glob.glob(os.path.join(log_dir, "bench_v*_r*.csv"))):
        m = re.search(r"bench_v(\w+)_r(\d+)\.csv$", path)
        v, r = m.group(1), int(m.group(2))
        if v not in variants:
            continue
        with open(path) as f:
            for row in csv.DictReader(f):
                try:
                    key = (row["case"], int(row["d"]))
                    out.setdefault(key, {}).setdefault(v, {})[r] = (float(row["fwd_tflops"]), float(row["bwd_tflops"]))
                except (KeyError, TypeError, ValueError):
                    continue  # a line cut short by a timeout
    return out


def summarize(data, variants):
    rows = []
    base = variants[0]
    for (case, d), per in data.items():
        for v in variants:
            rounds = per.get(v, {})
            if not rounds:
                continue
            bwd = [b for _, b in rounds.values()]
            fwd = [f for f, _ in rounds.values()]
            def ratios(i):
                return [rounds[r][i] / per[base][r][i] for r in rounds if r in per.get(base, {}) and per[base][r][i] > 0]
            bwd_ratios, fwd_ratios = ratios(1), ratios(0)
            rows.append({"case": case, "d": d, "variant": v, "rounds": len(bwd),
                         "bwd_tflops": round(statistics.median(bwd), 1), "bwd_min": round(min(bwd), 1),
                         "bwd_max": round(max(bwd), 1), "fwd_tflops": round(statistics.median(fwd), 1),
                         "bwd_ratio_to_first": round(statistics.median(bwd_ratios), 4) if bwd_ratios else "",
                         "fwd_min": round(min(fwd), 1), "fwd_max": round(max(fwd), 1),
                         "fwd_ratio_to_first": round(statistics.median(fwd_ratios), 4) if fwd_ratios else ""})
    rows.sort(key=lambda x: (-x["d"], x["case"], variants.index(x["variant"])))
    return rows


def markdown(rows, variants):
    keys = []
    for x in rows:
        if (x["case"], x["d"]) not in keys:
            keys.append((x["case"], x["d"]))
    lines = []
    for direction, title in (("bwd", "Backward"), ("fwd", "Forward")):
        head = "| case | D | " + " | ".join(f"v{v} {direction} TFLOP/s (range) | v{v}/v{variants[0]}" for v in variants) + " |"
        lines += [f"{title} TFLOP/s per variant, median over rounds (ratio: median of per-round ratios to v{variants[0]})",
                  "", head, "|---|---:|" + "---:|---:|" * len(variants)]
        for case, d in keys:
            cells = []
            for v in variants:
                x = next((y for y in rows if y["case"] == case and y["d"] == d and y["variant"] == v), None)
                if x is None:
                    cells += ["n/a", ""]
                else:
                    cells += [f'{x[direction + "_tflops"]} ({x[direction + "_min"]}-{x[direction + "_max"]}, {x["rounds"]} r)',
                              f'{x[direction + "_ratio_to_first"]}']
            lines.append(f"| {case} | {d} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv):
    if len(argv) < 4:
        print(__doc__)
        return 2
    log_dir, out_dir, variants = argv[1], argv[2], argv[3:]
    rows = summarize(load(log_dir, variants), variants)
    with open(os.path.join(out_dir, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["case", "d", "variant", "rounds", "bwd_tflops", "bwd_min", "bwd_max",
                                          "fwd_tflops", "bwd_ratio_to_first", "fwd_min", "fwd_max",
                                          "fwd_ratio_to_first"])
        w.writeheader()
        w.writerows(rows)
    md = markdown(rows, variants)
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
