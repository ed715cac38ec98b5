#!/usr/bin/env python3
"""docs/simulate.md's long-document table: `cad simulate --max-doc-len L --tokens-per-rank T --json` at 8-1024
GPUs (documents up to L tokens laid whole over the ranks as cad.pack_documents lays them, per_doc_cp and
colocated in groups of the ranks the longest document needs), with balance, bytes and memory per server of each
balancer and prefix_aware's predicted step against per_doc_cp.

usage: python3 bench/simulate/long_docs_table.py [--cad build/bin/cad] [--dist FILE] [--out docs/simulate/long_docs]
           [--model llama-8b] [--max-doc-len 1048576] [--tokens-per-rank 131072] [--layouts 1:8,1:32,...,8:1024]
           [--steps 2] [--extra "--overlap 0.25"]
--layouts lists TP:GPUS pairs. Writes OUT/results.json (every run's --json and its command) and OUT/table.md.
Exits non-zero when a run fails.
"""
import argparse
import shlex

from simulate_cli import add_path_options, run, write

GIB = 1024.0 ** 3


def row(r):
    b = {x["name"]: x for x in r["balancers"]}
    names = ["colocated", "per_doc_cp", "distca", "prefix_aware"]
    w = r["workload"]
    return "| %d | %d (%d) | %d | %.1f / %d | %s | %s | %s | %s | %.1f | %.2f / %.2f | %.2f |" % (
        r["layout"]["tp"], r["layout"]["gpus"], r["layout"]["dp"], w["document_group"],
        w["documents_per_micro_batch"], w["widest_span_ranks"],
        " / ".join("%.2f" % b[n]["attention_imbalance"] for n in names),
        " / ".join("%.1f" % (b[n]["bytes_inter_node_per_layer"] / GIB) for n in names),
        " / ".join("%.1f" % (b[n]["bytes_per_layer"] / GIB) for n in names),
        " / ".join("%.1f" % (b[n]["memory"]["max_kv_bytes"] / GIB) for n in names),
        b["per_doc_cp"]["on"]["mean_step_seconds"],
        b["prefix_aware"]["on"]["speedup_vs_per_doc_cp"], b["prefix_aware"]["off"]["speedup_vs_per_doc_cp"],
        b["colocated"]["on"]["speedup_vs_per_doc_cp"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_path_options(p, "long_docs")
    p.add_argument("--model", default="llama-8b")
    p.add_argument("--max-doc-len", default="1048576")
    p.add_argument("--tokens-per-rank", default="131072")
    p.add_argument("--layouts", default="1:8,1:32,1:128,1:512,1:1024,8:64,8:128,8:512,8:1024")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--extra", default="--link-gbps 400 --overlap 0.25", help="more `cad simulate` arguments")
    a = p.parse_args()
    results = []
    for layout in a.layouts.split(","):
        tp, gpus = layout.split(":")
        results.append(run(a.cad, ["--model", a.model, "--gpus", gpus, "--tp", tp, "--dist", a.dist,
                                   "--max-doc-len", a.max_doc_len, "--tokens-per-rank", a.tokens_per_rank,
                                   "--steps", str(a.steps)] + shlex.split(a.extra)))
    header = ("| TP | GPUs (DP ranks) | document group | documents per micro-batch / widest span (ranks) | "
              "max/mean attention: colocated / per_doc_cp / distca / prefix_aware | inter-node GiB per layer | "
              "all GiB per layer | most K/V GiB one server holds (per layer) | per_doc_cp step (s) | "
              "prefix_aware vs per_doc_cp: ping-pong mode / no overlap | colocated (all-gather CP) vs per_doc_cp |")
    sep = "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    text = "\n".join([header, sep] + [row(r) for r in results]) + "\n"
    write(a.out, "results.json", results, "table.md", text)
    print(text)


if __name__ == "__main__":
    main()
