#!/usr/bin/env python3
"""The tables of bench/fa4/server_directions.sh from what its stages kept (build-srvdir/): per server call (medians of
the rounds, each choice over ours/ours) and the trainer's step time per configuration and round (the mean of the
steps after step 0, the slowest rank; each round ran the configurations in a rotated order).

    python3 bench/fa4/server_directions_table.py build-srvdir > table.md

Exits non-zero when nothing was measured."""
import json
import pathlib
import statistics
import sys

# The trainer's configurations (their JSON names) and what each one is.
CONFIGS = {"prefix_aware": "CAD, ours fwd / ours bwd", "prefix_aware_fa4srv": "CAD, FA4 fwd / FA4 bwd",
           "prefix_aware_fa4bwd": "CAD, ours fwd / FA4 bwd", "fa4": "local FA4 (no CAD)"}


def per_call(keep):
    lines = []
    for path in sorted(keep.glob("calls/bench_w1_r0_*.json")):
        r = json.loads(path.read_text())
        med, base = r["medians_ms"], "default"
        lines += [f"\nPer server call, {r['context']} tokens ({len(r['documents'])} documents), medians of "
                  f"{r['rounds']} rounds (ms; ratio to ours/ours):\n",
                  "| server_backend | forward | backward | whole call |", "|---|---:|---:|---:|"]
        for b, m in med.items():
            cells = []
            for key in ("forward_server_ms", "backward_server_ms", "call_ms"):
                ratio = m[key] / med[base][key] if b != base and med[base][key] else None
                cells.append(f"{m[key]:.2f}" + (f" ({ratio:.2f}x)" if ratio else ""))
            lines.append(f"| `{b}` | " + " | ".join(cells) + " |")
    return lines


def trainer(keep):
    by = {}  # (context, config) -> {round: (mean step ms, steps ms, server fwd/bwd ms, loss)}
    for path in sorted(keep.glob("train_*_r*/*.json")):
        context, round_ = path.parent.name.split("_")[1], int(path.parent.name.split("_r")[-1])
        r = json.loads(path.read_text())
        steps = r.get("steps", [])
        tail = [1000 * max(s["step_s"]) for s in steps[1:] if s.get("step_s")]
        if not tail:
            continue
        server = [tuple(max((x or 0) for x in (s.get(k) or [0]))
                        for k in ("call_forward_server_ms", "call_backward_server_ms")) for s in steps[1:]]
        by.setdefault((int(context), path.stem), {})[round_] = (statistics.mean(tail), tail, server,
                                                                 steps[-1].get("loss"))
    if not by:
        return []
    lines = ["\nTrainer, one H200 (Llama-3-8B shape, 8 layers, full checkpointing, 2 micro-batches): mean step ms "
             "after step 0 per round, the mean over rounds, and that over the local FA4 baseline's:\n",
             "| tokens | configuration | rounds (ms) | mean ms | vs local FA4 | server fwd / bwd ms (mean) | last loss |",
             "|---:|---|---|---:|---:|---|---:|"]
    for context in sorted({c for c, _ in by}):
        base = by.get((context, "fa4"))
        base_mean = statistics.mean(v[0] for v in base.values()) if base else None
        for name, what in CONFIGS.items():
            rounds = by.get((context, name))
            if not rounds:
                continue
            mean = statistics.mean(v[0] for v in rounds.values())
            server = [s for v in rounds.values() for s in v[2]]
            fwd, bwd = statistics.mean(s[0] for s in server), statistics.mean(s[1] for s in server)
            cells = ", ".join(f"r{k}: {v[0]:.0f}" for k, v in sorted(rounds.items()))
            vs = f"{mean / base_mean:.3f}x" if base_mean else "-"
            srv = f"{fwd:.0f} / {bwd:.0f}" if fwd or bwd else "-"
            loss = next(iter(rounds.values()))[3]
            loss = f"{loss:.4f}" if isinstance(loss, (int, float)) else "-"
            lines.append(f"| {context} | {what} (`{name}`) | {cells} | {mean:.0f} | {vs} | {srv} | {loss} |")
    return lines


def main():
    keep = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "build-srvdir")
    lines = per_call(keep) + trainer(keep)
    if not lines:
        print(f"server_directions_table.py: nothing measured under {keep}", file=sys.stderr)
        return 1
    print("\n".join(lines).lstrip("\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
