#!/usr/bin/env python3
"""What ping-pong's nano-batch split costs in bytes: the forward bytes of prefix_aware's plans for the unsplit
micro-batches against the plans of their two nano-batches (a benchmark of the planner, no GPU).

The batches are the trainer's (cad.train.recipe; examples/train_llama.py --seed 1: micro-batch m of step s sampled
with seed 1 + 1000 s + m). Each plan comes from the `cad plan` CLI on one batch (--lengths: documents packed in
order into the ranks' buffers); a rank whose nano-batch is shorter than the longest is padded with one-token
documents, whose attention costs nothing and which no balancer moves. Splits compared, per rank:
  halves          at the document boundary nearest half the tokens, in buffer order (the trainer before cca4780);
  heavier_first   the trainer's --ping-pong (nano_batches): the same halves, each rank's heavier (causal attention
                  work) as nano-batch 0;
  window          split points with 30-70% of the tokens in the first, the pairing across ranks that minimises
                  the sum over nano-batches of the heaviest rank's work (2 ranks: every combination tried).

    python3 bench/balancers/nano_split_bytes.py [--context 65536] [--ranks 2] [--steps 5] [--micro-batches 2]
"""
import argparse
import itertools
import json
import os
import pathlib
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "host_adapter" / "python"))
from cad.train import flops, nano, recipe  # noqa: E402  (the trainer's batches and split)


def plan_mib(cad, plugins, docs_by_rank, balancer):
    """Forward bytes (MiB) of `balancer`'s plan for one batch, given per rank (padded to the longest)."""
    context = max(sum(d) for d in docs_by_rank)
    flat = [n for d in docs_by_rank for n in list(d) + [1] * (context - sum(d))]
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write("\n".join(map(str, flat)))
        f.flush()
        out = subprocess.run([cad, "plan", "--lengths", f.name, "--ranks", str(len(docs_by_rank)), "--context",
                              str(context), "--balancer", balancer, "--json", "--path", plugins],
                             capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"nano_split_bytes: cad plan failed: {out.stderr.strip()}")
    return json.loads(out.stdout)["balancers"][0]["bytes_total"] / 2**20


def halves(docs):
    k = nano.split_point(docs)
    return [docs[:k], docs[k:]]


def heavier_first(docs):
    return nano.nano_batches([docs], True)[0]


def window_candidates(docs, lo=0.3, hi=0.7):
    total, prefix, out = sum(docs), 0, []
    for k in range(1, len(docs)):
        prefix += docs[k - 1]
        if lo * total <= prefix <= hi * total:
            out += [(docs[:k], docs[k:]), (docs[k:], docs[:k])]
    return out or [tuple(halves(docs))]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--context", type=int, default=65536, help="tokens per rank and micro-batch")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--micro-batches", type=int, default=2)
    p.add_argument("--balancer", default="prefix_aware")
    p.add_argument("--data", default=os.environ.get("CAD_DATA", str(REPO.parent / "shared" / "data" /
                                                                    "doclen_pretrain.json")))
    p.add_argument("--cad", default=str(REPO / "build" / "bin" / "cad"), help="the cad CLI")
    p.add_argument("--plugins", default=str(REPO / "build" / "lib" / "cad" / "plugins"))
    args = p.parse_args()
    if not pathlib.Path(args.cad).is_file():
        sys.exit(f"nano_split_bytes: no cad CLI at {args.cad} (build first, or --cad PATH)")
    lengths = json.loads(pathlib.Path(args.data).read_text())
    totals = {"unsplit": 0.0, "halves": 0.0, "heavier_first": 0.0}
    if args.ranks == 2:
        totals["window"] = 0.0
    for step in range(args.steps):
        for mb in range(args.micro_batches):
            docs = [d for d in recipe.sample_batch(lengths, args.context, args.ranks, 1 + 1000 * step + mb)]
            if any(len(d) < 2 for d in docs):
                continue  # a rank with one document cannot be split (the trainer runs it unsplit)
            totals["unsplit"] += plan_mib(args.cad, args.plugins, docs, args.balancer)
            for name, split in (("halves", halves), ("heavier_first", heavier_first)):
                nanos = [split(d) for d in docs]
                totals[name] += sum(plan_mib(args.cad, args.plugins, [n[k] for n in nanos], args.balancer)
                                    for k in range(2))
            if args.ranks == 2:
                best = min(itertools.product(*[window_candidates(d) for d in docs]),
                           key=lambda c: sum(max(flops.causal_cost(x[k]) for x in c) for k in range(2)))
                totals["window"] += sum(plan_mib(args.cad, args.plugins, [x[k] for x in best], args.balancer)
                                        for k in range(2))
            print(f"step {step} micro-batch {mb}: " + ", ".join(f"{k} {v:.0f}" for k, v in totals.items()),
                  flush=True)
    print(f"forward MiB over the batches ({args.balancer}, {args.ranks} ranks x {args.context} tokens): " +
          ", ".join(f"{k} {v:.0f} ({v / totals['unsplit']:.2f}x)" for k, v in totals.items() if totals["unsplit"]))


if __name__ == "__main__":
    main()
