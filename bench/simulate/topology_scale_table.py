#!/usr/bin/env python3
"""The 64-1024-GPU table at TP 1 (nodes of 8 data-parallel ranks) re-predicted with the measured overlap and with
topology-aware plans: `cad simulate --json` per cell with prefix_aware blind (no node map) and aware
(`--ranks-per-node 8`), each with a GPU's cross-node bytes over its own NIC (`--nic-share gpu`) and rail-routed
(`--nic-share node`, NCCL's PXN); the step of prefix_aware against per_doc_cp (groups of one node, on NVLink)
and against colocated (data parallelism), in the ping-pong mode at the overlap fitted by fit_link.py.

usage: python3 bench/simulate/topology_scale_table.py [--cad build/bin/cad] [--dist FILE]
           [--out docs/simulate/network] [--models llama-8b,34b] [--gpus 64,128,512,1024]
           [--contexts 131072,524288] [--steps 4] [--gbps 400] [--overlap F (default: fit_link.json's)]
Writes OUT/topology_results.json (every run's --json and its command) and OUT/topology_table.md; exits non-zero
when a run fails.
"""
import argparse
import json
import os

from simulate_cli import ROOT, add_path_options, run, write

VARIANTS = [("blind", "gpu", []), ("aware", "gpu", ["--ranks-per-node", "8"]),
            ("blind", "node", []), ("aware", "node", ["--ranks-per-node", "8"])]


def fitted_overlap():
    path = os.path.join(ROOT, "docs", "simulate", "network", "fit_link.json")
    with open(path) as f:
        return json.load(f)["final"]["overlap"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_path_options(p, "network")
    p.add_argument("--models", default="llama-8b,34b")
    p.add_argument("--gpus", default="64,128,512,1024")
    p.add_argument("--contexts", default="131072,524288")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--gbps", default="400")
    p.add_argument("--overlap", type=float, default=None)
    a = p.parse_args()
    overlap = a.overlap if a.overlap is not None else round(fitted_overlap(), 2)
    results, rows = [], []
    for model in a.models.split(","):
        for gpus in a.gpus.split(","):
            for context in a.contexts.split(","):
                base = ["--model", model, "--gpus", gpus, "--gpus-per-node", "8", "--dist", a.dist, "--context", context,
                        "--steps", str(a.steps), "--link-gbps", a.gbps, "--overlap", str(overlap),
                        "--balancers", "colocated,per_doc_cp,prefix_aware"]
                cells = []
                for plan, nic, extra in VARIANTS:
                    r = run(a.cad, base + extra + ["--nic-share", nic])
                    r["variant"] = {"plan": plan, "nic_share": nic}
                    results.append(r)
                    b = {x["name"]: x for x in r["balancers"]}
                    pa = b["prefix_aware"]
                    cells.append((pa["on"]["speedup_vs_per_doc_cp"],
                                  b["colocated"]["on"]["mean_step_seconds"] / pa["on"]["mean_step_seconds"],
                                  pa["bytes_inter_node_per_layer"] / 1024.0 ** 3, pa["max_inter_node_sent_per_gpu"] / 1024.0 ** 3))
                rows.append("| %s | %s | %dK | %s | %.1f / %.1f | %.2f / %.2f / %.2f / %.2f |" % (
                    model, gpus, int(context) // 1024,
                    " | ".join("%.2f, %.2f" % (c[0], c[1]) for c in cells), cells[0][2], cells[1][2],
                    cells[0][3], cells[1][3], cells[2][3], cells[3][3]))
    header = ("| model | GPUs | tokens per GPU | own NIC, blind: vs per_doc_cp, vs colocated | own NIC, aware | "
              "rail-routed, blind | rail-routed, aware | prefix_aware inter-node GiB per layer, blind / aware | "
              "busiest NIC GiB per layer: own blind / own aware / rail blind / rail aware |")
    sep = "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    text = ("prefix_aware's step against per_doc_cp and colocated (mean step time ratios, ping-pong mode), TP 1, nodes "
            "of 8, %s Gb/s per GPU, overlap %s\n\n" % (a.gbps, overlap)) + "\n".join([header, sep] + rows) + "\n"
    write(a.out, "topology_results.json", results, "topology_table.md", text)
    print(text)


if __name__ == "__main__":
    main()
