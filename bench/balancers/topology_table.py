#!/usr/bin/env python3
"""topology_table.py -- the table of bench/results/topology_bytes_cpu_2026-12-02_233039a (summarised on
docs/slow_links.md): inter-node bytes of topology-aware prefix_aware against topology-blind
prefix_aware and distca, from `cad plan --ranks-per-node` on Pretrain-recipe batches.

For each (ranks, context, seed) it runs, on the same batch:
  prefix_aware blind   --config '{"ranks_per_node": RANKS}' (one node: the plan before the node map)
  prefix_aware aware   the node map of --ranks-per-node (nodes of 8 by default)
  distca               the node map too (distca accounts for it but does not plan by it)
and prints a Markdown table of max/mean and forward GiB (total / across nodes) per balancer, and the share of
inter-node bytes the aware plan saves against each. Exits 1 when a plan fails, when the aware plan's max/mean
exceeds --max-imbalance, or (with --check) when it moves more inter-node bytes than the blind plan.

  bench/balancers/topology_table.py [--cad build/bin/cad] [--dist ../shared/data/doclen_pretrain.json]
      [--ranks 16,32,64,128,256,512] [--contexts 65536,131072] [--seeds 1] [--ranks-per-node 8]
      [--path build/lib/cad/plugins] [--json OUT.json] [--check]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def default_dist():
    # ../shared beside the checkout (a worktree may sit one level deeper: wt/<branch>).
    for up in ("..", "../.."):
        path = os.path.normpath(os.path.join(ROOT, up, "shared/data/doclen_pretrain.json"))
        if os.path.exists(path):
            return path
    return os.path.normpath(os.path.join(ROOT, "../shared/data/doclen_pretrain.json"))


def plan(args, ranks, context, seed, balancer, config=None):
    cmd = [args.cad, "plan", "--dist", args.dist, "--context", str(context), "--ranks", str(ranks), "--seed",
           str(seed), "--balancer", balancer, "--ranks-per-node", str(args.ranks_per_node), "--json"]
    if args.path:
        cmd += ["--path", args.path]
    if config is not None:
        cmd += ["--config", json.dumps(config)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    b = json.loads(done.stdout)["balancers"][0]
    if b["status"] != "OK":
        raise RuntimeError(f"{balancer} at {ranks} ranks x {context}: {b['status']}: {b.get('error')}")
    return b


def gib(x):
    return x / 2**30


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cad", default=os.path.join(ROOT, "build/bin/cad"))
    p.add_argument("--dist", default=default_dist())
    p.add_argument("--ranks", default="16,32,64,128,256,512")
    p.add_argument("--contexts", default="65536,131072")
    p.add_argument("--seeds", default="1")
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--path", default=os.path.join(ROOT, "build/lib/cad/plugins"))
    p.add_argument("--max-imbalance", type=float, default=1.05)
    p.add_argument("--json", help="also write every row as JSON here")
    p.add_argument("--check", action="store_true", help="fail if the aware plan moves more inter-node bytes")
    args = p.parse_args()
    rows, failures = [], []
    print("| ranks | nodes | context | seed | prefix_aware blind: max/mean, GiB / inter | prefix_aware aware: "
          "max/mean, GiB / inter | distca: max/mean, GiB / inter | inter saved vs blind | vs distca |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for ranks in [int(x) for x in args.ranks.split(",")]:
        for context in [int(x) for x in args.contexts.split(",")]:
            for seed in [int(x) for x in args.seeds.split(",")]:
                try:
                    blind = plan(args, ranks, context, seed, "prefix_aware", {"ranks_per_node": ranks})
                    aware = plan(args, ranks, context, seed, "prefix_aware")
                    distca = plan(args, ranks, context, seed, "distca")
                except RuntimeError as e:
                    failures.append(str(e))
                    print(f"| {ranks} | | {context // 1024}K | {seed} | error (below) |")
                    continue
                cell = lambda b: (f"{b['imbalance']:.3f}, {gib(b['bytes_total']):.2f} / "
                                  f"{gib(b['inter_node_bytes']):.2f}")
                saved = lambda other: 1 - aware["inter_node_bytes"] / max(1, other["inter_node_bytes"])
                nodes = ranks // args.ranks_per_node
                print(f"| {ranks} | {nodes} | {context // 1024}K | {seed} | {cell(blind)} | {cell(aware)} | "
                      f"{cell(distca)} | {100 * saved(blind):.1f}% | {100 * saved(distca):.1f}% |", flush=True)
                row = {"ranks": ranks, "nodes": nodes, "context": context, "seed": seed}
                for name, b in (("blind", blind), ("aware", aware), ("distca", distca)):
                    row[name] = {k: b[k] for k in ("imbalance", "bytes_total", "intra_node_bytes", "inter_node_bytes")}
                rows.append(row)
                if aware["imbalance"] > args.max_imbalance:
                    failures.append(f"{ranks} x {context} seed {seed}: aware max/mean {aware['imbalance']:.4f} > "
                                    f"{args.max_imbalance}")
                if args.check and aware["inter_node_bytes"] > blind["inter_node_bytes"]:
                    failures.append(f"{ranks} x {context} seed {seed}: aware moves more inter-node bytes than blind")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    for f in failures:
        print("FAIL: " + f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
