#!/usr/bin/env python3
"""docs/simulate.md's TP 8 scale table re-predicted with the network term named: `cad simulate --json` at
64-1024 GPUs (TP 8, per_doc_cp in groups of 8 data-parallel ranks) for each link bandwidth and overlap, and
prefix_aware's speedup over per_doc_cp in each. The overlap is the share of each pass's exchange hidden
(`--overlap`); 1 is the old unmeasured assumption, 0.24 what head groups hid on the slow stand-in
(bench/results/trainer_h200x2_2026-11-28_6fc2a34_{4,5}, fitted by bench/simulate/fit_link.py), 0 no overlap (ping-pong has not been faster than unsplit on any machine).

usage: python3 bench/simulate/network_table.py [--cad build/bin/cad] [--dist FILE] [--out docs/simulate/network]
           [--models llama-8b,34b] [--gpus 64,128,512,1024] [--contexts 131072,524288] [--steps 4]
           [--gbps 200,400,800] [--overlap 0.24] [--extra "ARGS"]
Writes OUT/results.json (every run's --json and its command) and OUT/table.md. Exits non-zero when a run fails.
"""
import argparse
import shlex

from simulate_cli import add_path_options, run, write


def speedup(result, mode):
    b = {x["name"]: x for x in result["balancers"]}
    return b["prefix_aware"][mode]["speedup_vs_per_doc_cp"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_path_options(p, "network")
    p.add_argument("--models", default="llama-8b,34b")
    p.add_argument("--gpus", default="64,128,512,1024")
    p.add_argument("--contexts", default="131072,524288")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--gbps", default="200,400,800")
    p.add_argument("--overlap", default="0.24", help="the measured overlap (the old assumption, 1, runs too)")
    p.add_argument("--extra", default="", help="more `cad simulate` arguments")
    a = p.parse_args()
    gbps = a.gbps.split(",")
    results, rows = [], []
    for model in a.models.split(","):
        for gpus in a.gpus.split(","):
            for context in a.contexts.split(","):
                base = ["--model", model, "--gpus", gpus, "--tp", "8", "--cp-size", "8", "--dist", a.dist,
                        "--context", context, "--steps", str(a.steps)] + shlex.split(a.extra)
                old = run(a.cad, base + ["--link-gbps", "400", "--overlap", "1"])
                measured = {g: run(a.cad, base + ["--link-gbps", g, "--overlap", a.overlap]) for g in gbps}
                results += [old] + list(measured.values())
                ref = measured.get("400", old)
                b = {x["name"]: x for x in ref["balancers"]}
                gib = 1024.0 ** 3
                rows.append("| %s | %s (%d) | %dK | %.2f | %s | %.2f | %.2f / %.2f |" % (
                    model, gpus, ref["layout"]["dp"], int(context) // 1024, speedup(old, "on"),
                    " | ".join("%.2f" % speedup(measured[g], "on") for g in gbps), speedup(ref, "off"),
                    b["per_doc_cp"]["bytes_inter_node_per_layer"] / gib,
                    b["prefix_aware"]["bytes_inter_node_per_layer"] / gib))
    header = ("| model | GPUs (DP ranks) | tokens per DP rank | old: 400 Gb/s, overlap 1 | " +
              " | ".join("%s Gb/s, overlap %s" % (g, a.overlap) for g in gbps) +
              " | 400 Gb/s, overlap 0 | inter-node GiB per layer, per_doc_cp / prefix_aware |")
    sep = "|---|---:|---:|---:|" + "---:|" * len(gbps) + "---:|---:|"
    text = "prefix_aware vs per_doc_cp (mean step time ratio, ping-pong mode at the overlap named)\n\n" + \
        "\n".join([header, sep] + rows) + "\n"
    write(a.out, "results.json", results, "table.md", text)
    print(text)


if __name__ == "__main__":
    main()
