#!/usr/bin/env python3
"""time_balance_summary.py -- FLOP- vs time-balanced prefix_aware in cad_server_bench's JSON.

For every case (ranks x context x seed) of each file: the measured forward + backward max/mean over the
ranks of `prefix_aware` and `prefix_aware_time` (each rank's time the median of its interleaved rounds),
the same computed per round (median over the rounds), and in how many rounds the time-balanced plan's
max/mean was lower. Then the mean over the file's cases and the cases where time balancing won.
A benchmark analysis, not a test. Needs files written by the interleaved bench (forward_ms_rounds).

usage: time_balance_summary.py FILE.json [FILE.json ...]
"""
import json
import statistics
import sys


def max_over_mean(values):
    return max(values) / (sum(values) / len(values))


def summarize(path):
    doc = json.load(open(path))
    cases = {}
    for c in doc["cases"]:
        ranks = c["ranks_detail"]
        if "forward_ms_rounds" not in ranks[0]:
            raise SystemExit(f"{path}: no forward_ms_rounds (written by the sequential bench, before interleaving)")
        rounds = len(ranks[0]["forward_ms_rounds"])
        per_round = [max_over_mean([r["forward_ms_rounds"][k] + r["backward_ms_rounds"][k] for r in ranks])
                     for k in range(rounds)]
        key = (c["ranks"], c["context"], c["seed"])
        cases.setdefault(key, {})[c["balancer"]] = (c["total_imbalance"], per_round)
    print(f"{path}\n| ranks x context | seed | FLOP-balanced | time-balanced | per-round median FLOP -> time | "
          f"time lower in rounds |\n|---|---|---|---|---|---|")
    pairs = []
    for (ranks, context, seed), b in sorted(cases.items()):
        if "prefix_aware" not in b or "prefix_aware_time" not in b:
            continue
        (f, fr), (t, tr) = b["prefix_aware"], b["prefix_aware_time"]
        wins = sum(1 for x, y in zip(fr, tr) if y < x)
        pairs.append((f, t))
        print(f"| {ranks} x {context // 1024}K | {seed} | {f:.3f} | {t:.3f} | {statistics.median(fr):.3f} -> "
              f"{statistics.median(tr):.3f} | {wins}/{len(fr)} |")
    if pairs:
        better = sum(1 for f, t in pairs if t < f)
        print(f"mean over {len(pairs)} cases: {statistics.mean(f for f, _ in pairs):.4f} -> "
              f"{statistics.mean(t for _, t in pairs):.4f}; time-balanced lower in {better}/{len(pairs)} cases\n")


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    for path in argv:
        summarize(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
