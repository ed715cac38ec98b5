#!/usr/bin/env python3
"""pair_plans.py -- do time-balanced plans change when the rate table prices the backward by tile pairs?

For each batch (Pretrain 8 x 64K seeds 1-6, 8 x 128K seeds 1-3, the given mix batch: the batches of
bench/results/time_balance_h200/time_balance_random_*_h200.json), runs `cad plan --balancer prefix_aware --json --tasks` three
ways -- FLOP-balanced, time-balanced with the table-only table (--table), time-balanced with the
table + pairs table (--pairs) -- and prints whether the two time plans' tasks are identical, and the
max/mean of predicted forward + backward time per server of each plan under both tables (cad plan's
server_seconds: the plan's tasks, not CAD's layout segments). A benchmark tool, not a test.

usage: pair_plans.py [--cad build/bin/cad] [--table FILE] [--pairs FILE] [--dist FILE]
"""
import argparse
import json
import subprocess


def plan(cad, batch, price_with, plan_with):
    """One prefix_aware plan of `batch`, made with table `plan_with` (None: FLOPs), priced with `price_with`."""
    cmd = [cad, "plan", *batch, "--balancer", "prefix_aware", "--rate-table", price_with, "--json", "--tasks"]
    if plan_with:
        cmd += ["--config", json.dumps({"rate_table": plan_with})]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    b = out["balancers"][0]
    return b["time_imbalance"], b["task_list"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cad", default="build/bin/cad")
    ap.add_argument("--table", default="bench/results/rate_table_h200/rate_table_h200_units.json")
    ap.add_argument("--pairs", default="bench/results/rate_table_h200/rate_table_h200_units_pairs.json")
    ap.add_argument("--dist", default="/work/shared/data/doclen_pretrain.json")
    ap.add_argument("--mix", default="bench/balancers/time_mix_8x64k.json")
    a = ap.parse_args()
    batches = [(f"8x64K seed {s}", ["--dist", a.dist, "--context", "65536", "--ranks", "8", "--seed", str(s)])
               for s in range(1, 7)]
    batches += [(f"8x128K seed {s}", ["--dist", a.dist, "--context", "131072", "--ranks", "8", "--seed", str(s)])
                for s in range(1, 4)]
    batches += [("8x64K mix (given)", ["--lengths", a.mix, "--context", "65536", "--ranks", "8"])]
    print("| batch | time plans identical? | tasks moved between servers | predicted max/mean, table only: FLOP / "
          "time(table) / time(pairs) | table + pairs: FLOP / time(table) / time(pairs) |")
    print("|---|---|---|---|---|")
    for name, batch in batches:
        cells = {}
        for price in (a.table, a.pairs):
            for plan_with in (None, a.table, a.pairs):
                cells[(price, plan_with)] = plan(a.cad, batch, price, plan_with)
        t_table, t_pairs = cells[(a.table, a.table)][1], cells[(a.table, a.pairs)][1]
        same = t_table == t_pairs
        moved = len({json.dumps(t) for t in t_table} ^ {json.dumps(t) for t in t_pairs})
        row = lambda price: " / ".join(f"{cells[(price, p)][0]:.3f}" for p in (None, a.table, a.pairs))
        print(f"| {name} | {'yes' if same else 'no'} | {moved} | {row(a.table)} | {row(a.pairs)} |")


if __name__ == "__main__":
    main()
