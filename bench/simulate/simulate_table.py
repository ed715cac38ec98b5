#!/usr/bin/env python3
"""The table and plots of docs/simulate.md: `cad simulate --json` over model shapes, GPU counts and
context lengths, then predicted speedup of CAD's balancers over colocated (plain data parallelism) and
over per_doc_cp (per-document context parallelism), next to DistCA's published figures.

usage: python3 bench/simulate/simulate_table.py [--cad build/bin/cad] [--dist FILE] [--out docs/simulate]
           [--models llama-8b,34b] [--gpus 8,32,128,512,1024] [--contexts 131072,262144,524288]
           [--steps 4] [--tp 1] [--extra "ARGS"] [--no-plot]
Writes OUT/results.json (every run's --json), OUT/table.md and, with matplotlib, OUT/speedup_<model>.png.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time

BALANCERS = ["distca", "prefix_aware"]


def run(cad, dist, model, gpus, context, steps, tp, extra):
    cmd = [cad, "simulate", "--model", model, "--gpus", str(gpus), "--tp", str(tp), "--dist", dist,
           "--context", str(context), "--steps", str(steps), "--json", "--quiet"] + shlex.split(extra)
    start = time.time()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    result = json.loads(out)
    result["command"] = " ".join(cmd)
    result["seconds"] = time.time() - start
    return result


def by_name(result):
    return {b["name"]: b for b in result["balancers"]}


def table(results):
    lines = ["| model | GPUs | tokens per DP rank | imbalance: colocated / per_doc_cp / distca / prefix_aware | step colocated (s) | "
             "distca vs colocated | prefix_aware vs colocated | distca vs per_doc_cp | prefix_aware vs per_doc_cp | "
             "prefix_aware, no ping-pong, vs per_doc_cp |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        b = by_name(r)
        lines.append("| %s | %d | %dK | %.2f / %.2f / %.2f / %.2f | %.1f | %.2f | %.2f | %.2f | %.2f | %.2f |" % (
            r["model"]["name"], r["layout"]["gpus"], r["workload"]["context"] // 1024,
            b["colocated"]["attention_imbalance"], b["per_doc_cp"]["attention_imbalance"],
            b["distca"]["attention_imbalance"], b["prefix_aware"]["attention_imbalance"],
            b["colocated"]["on"]["mean_step_seconds"],
            b["distca"]["on"]["speedup_vs_colocated"], b["prefix_aware"]["on"]["speedup_vs_colocated"],
            b["distca"]["on"]["speedup_vs_per_doc_cp"], b["prefix_aware"]["on"]["speedup_vs_per_doc_cp"],
            b["prefix_aware"]["off"]["speedup_vs_per_doc_cp"]))
    return "\n".join(lines)


def plot(results, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = sorted({r["model"]["name"] for r in results})
    for model in models:
        rs = [r for r in results if r["model"]["name"] == model]
        contexts = sorted({r["workload"]["context"] for r in rs})
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=False)
        for ax, base in zip(axes, ["colocated", "per_doc_cp"]):
            for ctx in contexts:
                pts = sorted((r["layout"]["gpus"], by_name(r)["prefix_aware"]["on"]["speedup_vs_" + base])
                             for r in rs if r["workload"]["context"] == ctx)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label="prefix_aware, %dK" % (ctx // 1024))
                pts = sorted((r["layout"]["gpus"], by_name(r)["distca"]["on"]["speedup_vs_" + base])
                             for r in rs if r["workload"]["context"] == ctx)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="x", linestyle="--", alpha=0.6,
                        label="distca, %dK" % (ctx // 1024))
            ax.axhspan(1.07, 1.20, color="grey", alpha=0.2, label="DistCA paper, Pretrain, no PP: 1.07-1.20x")
            ax.plot([512], [1.35], marker="*", markersize=14, color="black", linestyle="none",
                    label="DistCA paper: up to 1.35x at 512 GPUs")
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("GPUs")
            ax.set_ylabel("predicted step speedup")
            ax.set_title("%s: over %s (ping-pong on)" % (model, base))
            ax.grid(True, alpha=0.3)
        axes[1].legend(fontsize=7, loc="upper left")
        fig.tight_layout()
        path = os.path.join(out, "speedup_%s.png" % model)
        fig.savefig(path, dpi=110)
        print("wrote", path, file=sys.stderr)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cad", default=os.path.join(root, "build", "bin", "cad"))
    p.add_argument("--dist", default=os.path.join(root, "..", "shared", "data", "doclen_pretrain.json"))
    p.add_argument("--out", default=os.path.join(root, "docs", "simulate"))
    p.add_argument("--models", default="llama-8b,34b")
    p.add_argument("--gpus", default="8,32,128,512,1024")
    p.add_argument("--contexts", default="131072,262144,524288")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--extra", default="", help="more `cad simulate` arguments, e.g. \"--net-gbps 200\"")
    p.add_argument("--no-plot", action="store_true")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    results = []
    for model in a.models.split(","):
        for gpus in [int(g) for g in a.gpus.split(",")]:
            for ctx in [int(c) for c in a.contexts.split(",")]:
                r = run(a.cad, a.dist, model, gpus, ctx, a.steps, a.tp, a.extra)
                r["model"]["name"] = model
                print("%s %5d GPUs %4dK: %.2f s" % (model, gpus, ctx // 1024, r["seconds"]), file=sys.stderr)
                results.append(r)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    md = table(results)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    if not a.no_plot:
        plot(results, a.out)


if __name__ == "__main__":
    main()
