#!/usr/bin/env python3
"""The balance/bytes/memory tables of docs/long_documents.md: `cad plan --max-doc-len --tokens-per-rank` on steps
whose documents are longer than one rank, every balancer, at 128K tokens per rank on 8-64 ranks.

    bench/balancers/long_docs_table.py [--cad build/bin/cad] [--dist ../shared/data/doclen_pretrain.json]

Two kinds of step per longest document (512K, 1M tokens): "recipe", DistCA's recipe over the Pretrain lengths
with the lengths scaled to the longest document (seed 1), and "uniform", every document that long. A cell is
"max/mean / GiB moved / K/V GiB held / GiB received": attention cost max/mean over servers, forward bytes
moved, and the fullest server's K/V rows (one copy of each document prefix it needs) and Q/K/V/O bytes received.
A model: the plan model's costs and bytes (cad plan), no GPU. Prints markdown on stdout."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BALANCERS = ["colocated", "per_doc_cp", "distca", "prefix_aware"]
GIB = float(1 << 30)


def plan(cad, source, max_doc_len, tokens_per_rank, ranks):
    args = [cad, "plan", *source, "--max-doc-len", str(max_doc_len), "--tokens-per-rank", str(tokens_per_rank),
            "--ranks", str(ranks), "--json"]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)} exited {done.returncode}: {done.stderr}")
    return json.loads(done.stdout)


def cell(b):
    if b["status"] != "OK":
        return "error: " + b["error"]
    return (f"{b['imbalance']:.3f} / {b['bytes_total'] / GIB:.1f} / {b['max_kv_bytes'] / GIB:.1f} / "
            f"{b['max_memory_received'] / GIB:.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cad", default=os.path.join(ROOT, "build", "bin", "cad"))
    parser.add_argument("--dist", default=os.path.join(ROOT, "..", "shared", "data", "doclen_pretrain.json"))
    parser.add_argument("--tokens-per-rank", type=int, default=131072)
    parser.add_argument("--ranks", default="8,16,32,64")
    parser.add_argument("--max-doc-lens", default="524288,1048576")
    a = parser.parse_args()
    ranks_list = [int(r) for r in a.ranks.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        print("| step | longest doc | ranks | documents (widest span) | before | " + " | ".join(BALANCERS) + " |")
        print("|---|---:|---:|---:|---:|" + "---:|" * len(BALANCERS))
        for max_doc_len in [int(m) for m in a.max_doc_lens.split(",")]:
            for kind in ("recipe", "uniform"):
                for ranks in ranks_list:
                    if kind == "recipe":
                        source = ["--dist", a.dist, "--seed", "1"]
                    else:
                        path = os.path.join(tmp, f"uniform_{max_doc_len}.json")
                        count = -(-ranks * a.tokens_per_rank // max_doc_len)
                        with open(path, "w") as f:
                            json.dump([max_doc_len] * count, f)
                        source = ["--lengths", path]
                    rep = plan(a.cad, source, max_doc_len, a.tokens_per_rank, ranks)
                    batch = rep["batch"]
                    cells = {b["name"]: cell(b) for b in rep["balancers"]}
                    print(f"| {kind} | {max_doc_len // 1024}K | {ranks} | {batch['documents']} ({batch['widest_span']}) "
                          f"| {rep['imbalance_before']:.3f} | " + " | ".join(cells[n] for n in BALANCERS) + " |")


if __name__ == "__main__":
    main()
