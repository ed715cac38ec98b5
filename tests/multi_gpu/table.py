#!/usr/bin/env python3
"""table.py -- the end-to-end table of tests/multi_gpu/run.sh: one row per (context, configuration) from the
trainer's --json-out files (train_<config>_<context>.json), as markdown.

    python3 tests/multi_gpu/table.py OUT_DIR [--steps-from 1]

Every number is a mean over the steps from --steps-from on (step 0 warms up); the trainer's --profile-step run
is kept outside "steps" ("profiled_step") and so counts in none. Per step:
- step time: the slowest rank's wall time of forward + backward + gradient all-reduce + optimizer step;
- the ideal step (from the `local` run of the same context, whose per-rank attention times are synchronised):
  the slowest rank's step with its attention time replaced by the mean rank's, i.e. attention perfectly
  balanced and no communication: max_r(step) - max_r(attn) + mean_r(attn). Ideal speedup = local / ideal;
- share of ideal: speedup / ideal speedup (the issue's target is >= 0.90);
- attention max/mean: measured per-rank attention time (synchronised runs only: with ping-pong on CUDA the
  trainer times only the enqueue); for CAD runs it includes the exchanges, in which every rank waits for the
  slowest, so the plan's predicted imbalance is given beside it;
- bytes: what the plan sends per layer in the forward (Q, K/V prefixes; the backward sends about as much
  again), summed over ranks, in MiB;
- ping-pong saved: the same balancer's step time without ping-pong minus with it.
- peak GiB: the largest rank's torch.cuda.max_memory_allocated over the step; plan ms: the largest rank's host
  time in the balancer for the step's plan(s) (plan stats' plan_ms), then " / " the largest rank's wall time of
  the whole collective make (plan_make_ms: agreement, piece tables, balancer, device buffers, and waiting for
  the other ranks); both are outside the timed attention calls. Older runs lack them.
With --profile-step files beside them (train_<config>_<context>_profile_rank<R>.json), another table gives the
profiled step's GPU kernel time by family, the largest rank's. Records that carry pre_plan_ms (the trainer since
2026-11-26) add a table of the plan make per rank and how far apart the ranks arrived at it.
Losses are compared with the local run's: the same batches and weights must give the same losses up to bf16
rounding, which the last column shows (max relative difference over the steps).
"""
import argparse
import json
import pathlib
import re
import sys

ORDER = ["local", "per_doc_cp", "distca", "prefix_aware", "distca_pingpong", "prefix_aware_pingpong"]


def in_order(runs):
    """The (context, configuration) keys of `runs` by context, then in ORDER (unknown names last)."""
    return sorted(runs, key=lambda k: (k[0], ORDER.index(k[1]) if k[1] in ORDER else len(ORDER)))


def load(out):
    runs = {}
    for path in sorted(pathlib.Path(out).glob("train_*.json")):
        m = re.fullmatch(r"train_(.+)_(\d+)\.json", path.name)
        if not m:
            continue
        try:
            runs[(int(m.group(2)), m.group(1))] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            print(f"table.py: skipping {path}: {e}", file=sys.stderr)
    return runs


def mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def step_time(step):
    return max(step["step_s"])


def rows_for(context, runs, first):
    local = runs.get((context, "local"))
    if local is None:
        return [f"| {context // 1024}K | (no local run: no baseline) |"]
    steps_local = local["steps"][first:]
    t_local = mean(step_time(s) for s in steps_local)
    t_ideal = mean(step_time(s) - max(s["attention_s"]) + mean(s["attention_s"]) for s in steps_local)
    ideal = t_local / t_ideal
    per_doc = runs.get((context, "per_doc_cp"))
    t_per_doc = mean(step_time(s) for s in per_doc["steps"][first:]) if per_doc else None
    lines = []
    for name in ORDER:
        run = runs.get((context, name))
        if run is None:
            continue
        summary, steps = run["summary"], run["steps"][first:]
        t = mean(step_time(s) for s in steps)
        tokens = mean(s["tokens_per_s"] for s in steps)
        speedup = t_local / t
        synced = summary.get("attention_timing", "synchronized") == "synchronized"
        measured = mean(max(s["attention_s"]) / mean(s["attention_s"]) for s in steps) if synced else None
        planned = mean(s["imbalance"] for s in steps)
        sent = [s.get("forward_bytes_sent_by_rank") for s in steps]
        mib = mean(sum(b) for b in sent if b) / 2**20 if any(sent) else 0.0
        saved = ""
        if name.endswith("_pingpong"):
            plain = runs.get((context, name[: -len("_pingpong")]))
            if plain:
                saved = f"{(mean(step_time(s) for s in plain['steps'][first:]) - t) * 1e3:.0f}"
        peak = mean(max(s["peak_memory_gib"]) for s in steps) if all("peak_memory_gib" in s for s in steps) else None
        plan_ms = mean(max(s["plan_ms"]) for s in steps) if all("plan_ms" in s for s in steps) else None
        make_ms = mean(max(s["plan_make_ms"]) for s in steps) if all("plan_make_ms" in s for s in steps) else None
        plan_cell = "-" if plan_ms is None or name == "local" else f"{plan_ms:.2f}"
        if make_ms is not None and plan_cell != "-":
            plan_cell += f" / {make_ms:.1f}"
        loss_diff = max(abs(a["loss"] - b["loss"]) / abs(b["loss"])
                        for a, b in zip(run["steps"], local["steps"]))
        lines.append(
            f"| {context // 1024}K | {name} | {summary['layers']} | {t * 1e3:.0f} | {tokens / 1e3:.0f} | "
            f"{speedup:.3f} | {ideal:.3f} | {speedup / ideal:.2f} | "
            f"{(f'{t_per_doc / t:.3f}' if t_per_doc else '-')} | "
            f"{('-' if measured is None else f'{measured:.2f}')} | {planned:.3f} | {mib:.0f} | {saved or '-'} | "
            f"{loss_diff:.1e} | {'-' if peak is None else f'{peak:.1f}'} | "
            f"{plan_cell} |")
    return lines


def arrival_rows(runs, first):
    """Per (context, configuration) whose records have pre_plan_ms (trainer since 2026-11-26), means over the
    steps from `first`: the plan make's wall time on its slowest and fastest rank (the fastest is the last to
    arrive, the others wait for it), how far apart the ranks reached it (pre_plan_ms, latest - earliest), the
    outside-attention time (slowest step - slowest attention), and the garbage collector's pauses (largest
    rank's ms per step, full collections over all ranks and steps)."""
    lines = []
    for context, name in in_order(runs):
        steps = runs[(context, name)]["steps"][first:]
        if not steps or not all("pre_plan_ms" in s and "gc_ms" in s for s in steps):
            continue
        make_max = mean(max(s["plan_make_ms"]) for s in steps)
        make_min = mean(min(s["plan_make_ms"]) for s in steps)
        spread = mean(max(s["pre_plan_ms"]) - min(s["pre_plan_ms"]) for s in steps)
        outside = mean(max(s["step_s"]) - max(s["attention_s"]) for s in steps) * 1e3
        gc_ms = mean(max(s["gc_ms"]) for s in steps)
        full = sum(sum(s["gc_full_collections"]) for s in steps)
        cad = name != "local"
        lines.append(f"| {context // 1024}K | {name} | {f'{make_max:.1f}' if cad else '-'} | "
                     f"{f'{make_min:.1f}' if cad else '-'} | {f'{spread:.1f}' if cad else '-'} | {outside:.0f} | "
                     f"{gc_ms:.1f} | {full} |")
    return lines


FAMILIES = ("attention", "cad data path", "nccl", "gemm", "other")


def profile_rows(out, runs):
    """Per (context, configuration) with profiles (--profile-step): the largest rank's kernel ms per family."""
    lines = []
    for context, name in in_order(runs):
        files = sorted(pathlib.Path(out).glob(f"train_{name}_{context}_profile_rank*.json"))
        if not files:
            continue
        profiles = [json.loads(f.read_text()) for f in files]
        cells = " | ".join(f"{max(p['families_ms'].get(f, 0.0) for p in profiles):.0f}" for f in FAMILIES)
        lines.append(f"| {context // 1024}K | {name} | {profiles[0]['step']} | {len(profiles)} | {cells} |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="the folder holding train_<config>_<context>.json")
    parser.add_argument("--steps-from", type=int, default=1, help="first step counted (default 1: skip warm-up)")
    args = parser.parse_args()
    runs = load(args.out)
    if not runs:
        sys.exit(f"table.py: no train_<config>_<context>.json in {args.out}")
    print("| tokens/GPU | config | layers | step (ms) | tokens/s (K) | speedup vs local | ideal speedup | "
          "share of ideal | vs per_doc_cp | attention max/mean (measured) | plan imbalance | "
          "fwd MiB/layer (all ranks) | ping-pong saved (ms) | loss rel. diff vs local | peak GiB (max rank) | "
          "plan ms: balancer / whole make (max rank) |")
    print("|" + " ---: |" * 16)
    for context in sorted({c for c, _ in runs}):
        print("\n".join(rows_for(context, runs, args.steps_from)))
    arrivals = arrival_rows(runs, args.steps_from)
    if arrivals:
        print("\nPlan make and rank arrival, ms, mean over the steps (slowest / fastest rank's make; spread of the "
              "ranks' arrival at it; time outside the timed attention calls; GC pauses):\n")
        print("| tokens/GPU | config | make, slowest rank | make, fastest rank | arrival spread | outside attention | "
              "GC ms (max rank) | full GCs |")
        print("|" + " ---: |" * 8)
        print("\n".join(arrivals))
    profiled = profile_rows(args.out, runs)
    if profiled:
        print("\nGPU kernel time of the profiled step, largest rank, ms (kernels on different streams overlap):\n")
        print("| tokens/GPU | config | step | ranks | " + " | ".join(FAMILIES) + " |")
        print("|" + " ---: |" * (4 + len(FAMILIES)))
        print("\n".join(profiled))


if __name__ == "__main__":
    main()
