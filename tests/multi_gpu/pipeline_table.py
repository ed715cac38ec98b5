#!/usr/bin/env python3
"""pipeline_table.py -- the tables of tests/multi_gpu/pipeline.sh: per (tokens per micro-batch, micro-batches), one
row per configuration of examples/train_pipeline.py from its --json-out files
pipe_<context>_<micro-batches>_<config>.json, as markdown (the trainer's own comparison_table: means over the
steps after step 0).

    python3 tests/multi_gpu/pipeline_table.py OUT_DIR

Columns: step ms (slowest rank), tokens/s, speedup = local's step / this step (the local attention of the row's
schedule: local, or 1f1b_local for the 1f1b_ rows), ideal = local's step / the same schedule's local_balanced step
(measured: every buffer of the step made equal in attention work) where that ran, else local's step / local's
computed ideal step (every tick's attention at the ranks' mean instead of their max; needs synchronised timing),
realised share = (speedup - 1) / (ideal - 1), the mean
per-tick attention imbalance measured (max/mean over ranks of each tick's attention time), planned (the cost
model's, after CAD's plans; local: the colocated one) and colocated (before: each rank's own documents),
peak GiB, and the speedup over the fastest run with local attention (ours or torch's varlen, either schedule): the
best alternative a user has."""
import json
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.append(str(REPO / "host_adapter" / "python"))  # the package from the checkout, if not installed
from cad.train.pipeline_report import CONFIGS, comparison_table  # noqa: E402 -- the trainer's order and table

NAME = re.compile(r"pipe_(\d+)_(\d+)_(.+)\.json$")


def tables(out_dir):
    """{(context, micro-batches): {config: summary}} from the JSON files in out_dir, in the trainer's order."""
    found = {}
    order = list(CONFIGS)
    for path in sorted(pathlib.Path(out_dir).glob("pipe_*_*_*.json")):
        match = NAME.search(path.name)
        if not match:
            continue
        context, micro_batches, config = int(match[1]), int(match[2]), match[3]
        found.setdefault((context, micro_batches), {})[config] = json.loads(path.read_text())["summary"]
    return {key: dict(sorted(runs.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))
            for key, runs in sorted(found.items())}


def main(argv):
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    found = tables(argv[0])
    if not found:
        print(f"no pipe_<context>_<micro-batches>_<config>.json in {argv[0]}")
        return 1
    for (context, micro_batches), summaries in found.items():
        any_run = next(iter(summaries.values()))
        print(f"\n### {context} tokens per micro-batch and replica, {micro_batches} micro-batches, "
              f"PP={any_run['pp']} x DP={any_run['dp']}, {any_run['layers']} layers ({any_run['model']}), "
              f"{any_run['device']}\n")
        print(comparison_table(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
