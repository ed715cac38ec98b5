#!/usr/bin/env python3
"""table.py -- the end-to-end tables of tests/multi_gpu/run.sh: per context (tokens per GPU and micro-batch),
one row per configuration from the trainer's --json-out files (train_<config>_<context>.json), as markdown.

    python3 tests/multi_gpu/table.py OUT_DIR [--steps-from 1]
    python3 tests/multi_gpu/table.py OUT_DIR OUT_DIR2 ... [--steps-from 1]

With several folders (runs of the same configurations, e.g. on different machines or days) it prints one table
pooled over them instead: per configuration its mean step over the runs (and the runs' min / max), and the
speedup and realised share of the pooled means (each run's faster local baseline and its local_balanced, the
measured ideal, averaged over the runs that have them), beside each run's own share. At 64K tokens per GPU on 2
H200s the same configuration's share moved from 0.64 to 0.84 between identical runs (bench/results/trainer_h200x2_2026-11-28_{c787de7,17590da*}): one run's share is not a number to quote there.

Every number is a mean over the steps from --steps-from on (step 0 warms up); the trainer's --profile-step run
is kept outside "steps" ("profiled_step") and so counts in none. Per step:
- step time: the slowest rank's wall time of the step (every micro-batch's forward and backward, the gradient
  reduction, the optimizer step); tokens/s: every rank's tokens over it; MFU: the trainer's (model FLOPs over
  step time x ranks x peak, see examples/train_llama.py); peak GiB: the largest rank's
  torch.cuda.max_memory_allocated since its configuration began;
- imbalance: the CAD plan's max/mean attention work over ranks (for local and torch_varlen: the colocated
  work of the batch, what each rank computes itself);
- baseline: the faster (lower mean step time) of the two local runs, `local` (the project's kernels) and
  `torch_varlen` (torch's varlen_attn); speedup = baseline step / this step;
- ideal speedup, from the baseline's measured parts: per step, the slowest rank's step with its attention time
  replaced by the mean rank's, i.e. attention work perfectly balanced over the ranks at no communication
  cost, everything else as measured. The ranks wait for each other at least once per micro-batch (FSDP2's
  reduce-scatter after its backward; within a micro-batch the same rank is the slow one at every layer), so
  the imbalance costs per micro-batch: ideal step = max_r(step_r) - sum over micro-batches m of
  (max_r(attn_r,m) - mean_r(attn_r,m)), from the trainer's attention_s_by_micro_batch (records without it: one
  term, max_r(attn_r) - mean_r(attn_r), which understates the gain when a different rank is slow in each
  micro-batch); ideal speedup = baseline step / ideal step (per-rank attention times are synchronised in the
  local runs);
- measured ideal: where the run has a `local_balanced` configuration (the trainer's --balanced-batches: local
  attention on every micro-batch made balanced -- each rank's tokens as equal-length documents whose causal
  work is the mean rank's), the ideal speedup is also given measured, baseline step / local_balanced step, as
  "computed / measured"; it includes what the computed one leaves out (the ranks' waits at every collective,
  not only per micro-batch), and the realised share is then given against both;
- realised share: (speedup - 1) / (ideal speedup - 1), the part of the possible gain a configuration got
  ("-" where the ideal speedup is below 1.01: nothing to gain);
- vs per_doc_cp: per_doc_cp's step / this step;
- attention max/mean: measured per-rank attention time (synchronised runs only: with ping-pong on CUDA the
  trainer times only the enqueue); for CAD runs it includes the exchanges, in which every rank waits for the
  slowest, so the plan's imbalance is given beside it;
- bytes: what the plans send per layer in the forward (Q, K/V prefixes; the backward sends about as much
  again), summed over ranks and the step's micro-batches, in MiB;
- ping-pong saved: the same configuration's step time without ping-pong minus with it;
- plan ms: the largest rank's host time in the balancer for the step's plans (plan stats' plan_ms), then " / "
  the largest rank's wall time of the whole collective makes (plan_make_ms: agreement, piece tables, balancer,
  device buffers, and waiting for the other ranks). Older runs lack some columns ("-").
A configuration the trainer skipped (torch_varlen where torch has no varlen_attn) is a row with its reason.
With --profile-step files beside them (train_<config>_<context>_profile_rank<R>.json), another table gives the
profiled step's GPU kernel time by family, the largest rank's. Records that carry pre_plan_ms add a table of the
plan make per rank and how far apart the ranks arrived at it. A step-by-step table pairs every configuration's
steps with the same steps (the same batches) of the baseline and of local_balanced: the speedup's min / median /
max, the steps slower than the baseline, and the distance to the measured ideal in ms (min / max).
The heading names the layer pattern of a windowed model (the trainer's --window, --global-every: window LEFT,
every N-th layer global); MFU and imbalance then count windowed layers with their windowed cost.
Losses are compared with the baseline's: the same batches and weights must give the same losses up to bf16
rounding (and the two local kernels' own differences), which the last-but-one column shows (max relative
difference over the steps).
"""
import argparse
import importlib.util
import json
import pathlib
import re
import statistics
import sys

# cad.train.share (pure Python, the one rule) loaded alone: importing the package `cad` would import torch (tens
# of seconds on a busy machine) for one function; registered under its name so that every importer shares it.
if "cad.train.share" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("cad.train.share", pathlib.Path(__file__).resolve().parents[2] /
                                                   "host_adapter" / "python" / "cad" / "train" / "share.py")
    sys.modules["cad.train.share"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["cad.train.share"])
realised_share = sys.modules["cad.train.share"].realised_share  # DESIGN's headline measure, one rule for every table

BASELINES = ["local", "torch_varlen"]
MEASURED_IDEAL = "local_balanced"  # local attention on the batches made balanced (the trainer's --balanced-batches)
LOCAL = BASELINES + [MEASURED_IDEAL]  # configurations without CAD
_NAMES = LOCAL + ["per_doc_cp", "distca", "prefix_aware", "colocated"]
ORDER = _NAMES + [n + suffix for suffix in ("_pingpong", "_pingpong1lane", "_autopingpong") for n in _NAMES]


def in_order(runs):
    """The (context, configuration) keys of `runs` by context, then in ORDER (unknown names last)."""
    return sorted(runs, key=lambda k: (k[0], ORDER.index(k[1]) if k[1] in ORDER else len(ORDER), k[1]))


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


def tokens_label(context):
    """64K for 65536; a context that is no multiple of 1024 as is (CPU dry runs)."""
    return f"{context // 1024}K" if context % 1024 == 0 else str(context)


def window_label(summary):
    """The layer pattern of a trainer summary (--window, --global-every), e.g. ", window 4096, every 6th layer
    global (5 of 6 windowed)"; "" without a window (and for records older than the option)."""
    window = summary.get("window", -1)
    if window is None or window < 0:
        return ""
    every, windowed = summary.get("global_every"), summary.get("windowed_layers")
    of = f" ({windowed} of {summary.get('layers', '?')} windowed)" if windowed is not None else ""
    if every:
        suffix = "th" if 10 <= every % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(every % 10, "th")
        return f", window {window}, every {every}{suffix} layer global{of}"
    return f", window {window}, every layer windowed"


def mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def step_time(step):
    return max(step["step_s"])


def trained(run):
    """A run that has steps (not skipped, not empty)."""
    return run is not None and not run["summary"].get("skipped") and run["steps"]


def mean_step(run, first):
    """A trained run's mean step time from step `first` on (seconds), or None."""
    steps = run["steps"][first:] if trained(run) else []
    return mean(step_time(s) for s in steps) if steps else None


def share_cell(speedup, ideal_speedup, name):
    """The realised share (speedup - 1) / (ideal speedup - 1), formatted; "-" where either is unknown, where the
    ideal gains under 1% (nothing to gain) and for the measured ideal itself."""
    share = None if name == MEASURED_IDEAL else realised_share(speedup, ideal_speedup, least_gain=0.01)
    return "-" if share is None else f"{share:.2f}"


def baseline_of(context, runs, first):
    """(name, run) of the faster local baseline of this context (lower mean step time), or (None, None)."""
    candidates = [(mean_step(runs.get((context, n)), first), n) for n in BASELINES
                  if mean_step(runs.get((context, n)), first) is not None]
    if not candidates:
        return None, None
    name = min(candidates)[1]
    return name, runs[(context, name)]


COLUMNS = ["tokens/GPU", "config", "layers", "step (ms)", "tokens/s (K)", "MFU (%)", "peak GiB (max rank)",
           "imbalance", "speedup vs baseline", "ideal speedup", "realised share", "vs per_doc_cp",
           "attention max/mean (measured)", "fwd MiB/layer (all ranks)", "ping-pong saved (ms)",
           "loss rel. diff vs baseline", "plan ms: balancer / whole make (max rank)"]


def imbalance_cost(step):
    """Seconds a step of local attention loses to attention imbalance (see the module doc: per micro-batch)."""
    parts = step.get("attention_s_by_micro_batch") or [step["attention_s"]]
    return sum(max(p) - mean(p) for p in parts)


def rows_for(context, runs, first):
    """The rows of one context's table (COLUMNS), in ORDER; a note first when there is no baseline."""
    base_name, base = baseline_of(context, runs, first)
    lines = []
    if base is None:
        lines.append(f"| {tokens_label(context)} | (no local or torch_varlen run: no baseline) |")
        t_base = ideal = None
    else:
        steps_base = base["steps"][first:]
        t_base = mean(step_time(s) for s in steps_base)
        t_ideal = mean(step_time(s) - imbalance_cost(s) for s in steps_base)
        ideal = t_base / t_ideal
    t_balanced = mean_step(runs.get((context, MEASURED_IDEAL)), first)
    measured_ideal = t_base / t_balanced if t_base and t_balanced is not None else None
    per_doc = runs.get((context, "per_doc_cp"))
    t_per_doc = mean(step_time(s) for s in per_doc["steps"][first:]) if trained(per_doc) else None
    for key in in_order({k: None for k in runs if k[0] == context}):
        name = key[1]
        run = runs[key]
        summary = run["summary"]
        if summary.get("skipped"):
            lines.append(f"| {tokens_label(context)} | {name} | skipped: {summary['skipped']} |")
            continue
        steps = run["steps"][first:]
        if not steps:
            lines.append(f"| {tokens_label(context)} | {name} | (no steps after step {first}) |")
            continue
        t = mean(step_time(s) for s in steps)
        tokens = mean(s["tokens_per_s"] for s in steps)
        mfu = f"{mean(s['mfu'] for s in steps) * 100:.1f}" if all("mfu" in s for s in steps) else "-"
        speedup = t_base / t if t_base else None
        share = share_cell(speedup, ideal, name)
        ideal_cell = "-" if ideal is None else f"{ideal:.3f}"
        if measured_ideal is not None:  # computed / measured
            ideal_cell += f" / {measured_ideal:.3f}"
            share += f" / {share_cell(speedup, measured_ideal, name)}"
        synced = summary.get("attention_timing", "synchronized") == "synchronized"
        measured = mean(max(s["attention_s"]) / mean(s["attention_s"]) for s in steps) \
            if synced and all(mean(s["attention_s"]) > 0 for s in steps) else None
        planned = mean(s["imbalance"] for s in steps)
        sent = [s.get("forward_bytes_sent_by_rank") for s in steps]
        layers = summary["layers"]
        mib = mean(sum(b) for b in sent if b) / 2**20 if any(sent) else 0.0
        saved = ""
        if "_pingpong" in name:  # ping-pong on two CAD lanes, or on one (_pingpong1lane)
            plain = runs.get((context, name.partition("_pingpong")[0]))
            if trained(plain):
                saved = f"{(mean(step_time(s) for s in plain['steps'][first:]) - t) * 1e3:.0f}"
        peak = mean(max(s["peak_memory_gib"]) for s in steps) if all("peak_memory_gib" in s for s in steps) else None
        plan_ms = mean(max(s["plan_ms"]) for s in steps) if all("plan_ms" in s for s in steps) else None
        make_ms = mean(max(s["plan_make_ms"]) for s in steps) if all("plan_make_ms" in s for s in steps) else None
        plan_cell = "-" if plan_ms is None or name.partition("_pingpong")[0] in LOCAL else f"{plan_ms:.2f}"
        if make_ms is not None and plan_cell != "-":
            plan_cell += f" / {make_ms:.1f}"
        loss_diff = "-"
        if base is not None:
            diff = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(run["steps"], base["steps"]))
            loss_diff = f"{diff:.1e}"
        cells = [f"{tokens_label(context)}", name, f"{layers}", f"{t * 1e3:.0f}", f"{tokens / 1e3:.0f}", mfu,
                 "-" if peak is None else f"{peak:.1f}", f"{planned:.3f}",
                 "-" if speedup is None else f"{speedup:.3f}", ideal_cell, share,
                 f"{t_per_doc / t:.3f}" if t_per_doc else "-", "-" if measured is None else f"{measured:.2f}",
                 f"{mib:.0f}", saved or "-", loss_diff, plan_cell]
        lines.append("| " + " | ".join(cells) + " |")
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
        cad = name.partition("_pingpong")[0] not in LOCAL
        lines.append(f"| {tokens_label(context)} | {name} | {f'{make_max:.1f}' if cad else '-'} | "
                     f"{f'{make_min:.1f}' if cad else '-'} | {f'{spread:.1f}' if cad else '-'} | {outside:.0f} | "
                     f"{gc_ms:.1f} | {full} |")
    return lines


def paired_rows(runs, first):
    """Per (context, configuration) other than the baseline, step by step against the same step (the same batches)
    of the baseline and of the measured ideal (local_balanced), over the steps from `first`: the speedup's min /
    median / max, on how many steps it was slower than the baseline, and its distance to the measured ideal in ms
    (min / max: a distance that stays put from batch to batch is a fixed cost of the configuration, one that
    follows the batch is balance not won). The means of the main table hide how much a ratio moves per step."""
    lines = []
    for context in sorted({c for c, _ in runs}):
        base_name, base = baseline_of(context, runs, first)
        if base is None:
            continue
        balanced = runs.get((context, MEASURED_IDEAL))
        ideal_steps = balanced["steps"][first:] if trained(balanced) else []
        for _, name in in_order({k: None for k in runs if k[0] == context}):
            run = runs[(context, name)]
            if name == base_name or not trained(run) or not run["steps"][first:]:
                continue
            pairs = list(zip(base["steps"][first:], run["steps"][first:]))
            ratios = sorted(step_time(b) / step_time(r) for b, r in pairs)
            slower = sum(x < 1 for x in ratios)
            median = statistics.median(ratios)
            gap = "-"
            if ideal_steps and name != MEASURED_IDEAL:
                gaps = [(step_time(r) - step_time(i)) * 1e3 for r, i in zip(run["steps"][first:], ideal_steps)]
                gap = f"{min(gaps):.0f} / {max(gaps):.0f}"
            lines.append(f"| {tokens_label(context)} | {name} | {base_name} | {len(ratios)} | {ratios[0]:.3f} / "
                         f"{median:.3f} / {ratios[-1]:.3f} | {slower} | {gap} |")
    return lines


def exchange_rows(runs, first):
    """Per CAD (context, configuration) whose records have exchange_stall_ms (CUDA, trainer since 2026-11-26),
    means over the steps from `first`: the GPU time of CAD's collectives per step and how long the calling
    streams stalled for them (largest rank), the stall's share of the step, the share of the collectives' time
    hidden (not stalled for: head groups join an exchange after the work beside it; an unsplit exchange is waited
    for whole), the stall's share of the slowest rank's attention time, plans' wait (plan_wait_ms: forwards
    waiting for plans made ahead), and --ping-pong-when worthwhile's decision. Under ping-pong a lane's stall
    includes the other lane's compute: no hidden share or attention share there."""
    lines = []
    for context, name in in_order(runs):
        run = runs[(context, name)]
        steps = run["steps"][first:]
        if not steps or not all("exchange_stall_ms" in s for s in steps) or \
                not any(max(s["exchange_comm_ms"]) > 0 for s in steps):
            continue
        comm = mean(max(s["exchange_comm_ms"]) for s in steps)
        stall = mean(max(s["exchange_stall_ms"]) for s in steps)
        step_ms = mean(max(s["step_s"]) for s in steps) * 1e3
        attention = mean(max(s["attention_s"]) for s in steps) * 1e3
        split = any(s.get("ping_pong") for s in steps)
        wait = mean(max(s.get("plan_wait_ms", [0.0])) for s in steps)
        decision = run["summary"].get("ping_pong_decision") or "-"
        timed = run["summary"].get("attention_timing", "synchronized") == "synchronized"  # else enqueue-only times
        hidden = f"{max(0.0, 1.0 - stall / comm):.0%}" if not split else "-"
        lines.append(f"| {tokens_label(context)} | {name} | {comm:.1f} | {stall:.1f} | {stall / step_ms:.1%} | "
                     f"{hidden} | {f'{stall / attention:.1%}' if timed and not split else '-'} | {wait:.1f} | "
                     f"{decision} |")
    return lines


def call_rows(runs, first):
    """Per CAD (context, configuration) whose records have call_*_server_ms (CUDA, trainer since 2026-11-28), means
    over the steps from `first`, from timing events on the calling streams: each rank's server compute per step
    (forward calls, recomputations included, and backward; slowest / fastest rank), the measured max/mean of the
    ranks' server compute beside the plan's predicted imbalance (its cost model), the slowest rank's compute above
    the mean rank's (what imbalance costs the ranks that wait for it, per step), the max/mean of each direction alone
    (the ranks meet at every call), and the calls' time beyond their server compute on the rank where it is largest
    (exchanges, packing, the waits for the other ranks)."""
    lines = []
    for context, name in in_order(runs):
        steps = runs[(context, name)]["steps"][first:]
        if not steps or not all("call_forward_server_ms" in s for s in steps) or \
                not any(max(s["call_forward_server_ms"]) > 0 for s in steps):
            continue
        fwd = [s["call_forward_server_ms"] for s in steps]
        bwd = [s["call_backward_server_ms"] for s in steps]
        total = [[f + b for f, b in zip(fs, bs)] for fs, bs in zip(fwd, bwd)]
        measured = mean(max(t) / mean(t) if mean(t) else 1.0 for t in total)
        # Each direction on its own: the ranks meet at every call, so a forward's imbalance is not made up by the
        # backward's (the step pays both maxima).
        by_direction = " / ".join(f"{mean(max(x) / mean(x) if mean(x) else 1.0 for x in d):.3f}" for d in (fwd, bwd))
        above = mean(max(t) - mean(t) for t in total)
        beyond = mean(max(cf + cb - t for cf, cb, t in zip(s["call_forward_ms"], s["call_backward_ms"], tot))
                      for s, tot in zip(steps, total))
        predicted = mean(s.get("imbalance", 1.0) for s in steps)
        lines.append(f"| {tokens_label(context)} | {name} | {mean(max(f) for f in fwd):.1f} / {mean(min(f) for f in fwd):.1f}"
                     f" | {mean(max(b) for b in bwd):.1f} / {mean(min(b) for b in bwd):.1f} | {measured:.3f} | "
                     f"{by_direction} | "
                     f"{predicted:.3f} | {above:.1f} | {beyond:.1f} |")
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
        lines.append(f"| {tokens_label(context)} | {name} | {profiles[0]['step']} | {len(profiles)} | {cells} |")
    return lines


POOLED_COLUMNS = ["tokens/GPU", "config", "runs", "step ms, mean (min / max)", "speedup vs baseline",
                  "measured ideal", "realised share (pooled)", "share per run"]


def pooled_rows(all_runs, first):
    """The pooled table's rows (POOLED_COLUMNS) over several folders' runs ({(context, name): run} each): per
    (context, configuration), its mean step over the folders that trained it; speedup and share from the means of
    the folders that have the configuration, a baseline and local_balanced (see the module doc)."""
    keys = in_order(set().union(*all_runs))
    lines = []
    for context, name in keys:
        own = [mean_step(runs.get((context, name)), first) for runs in all_runs]
        have = [t for t in own if t is not None]
        if not have:
            continue
        bases, ideals, mine, shares = [], [], [], []
        for runs, t in zip(all_runs, own):
            _, base = baseline_of(context, runs, first)
            b = mean_step(base, first) if base is not None else None
            i = mean_step(runs.get((context, MEASURED_IDEAL)), first)
            if t is None or b is None or i is None:
                shares.append("-")
                continue
            bases.append(b), ideals.append(i), mine.append(t)
            shares.append(share_cell(b / t, b / i, name))
        speedup = ideal = share = "-"
        if mine:
            b, i, t = mean(bases), mean(ideals), mean(mine)
            speedup, ideal, share = f"{b / t:.3f}", f"{b / i:.3f}", share_cell(b / t, b / i, name)
        cells = [tokens_label(context), name, str(len(have)),
                 f"{mean(have) * 1e3:.0f} ({min(have) * 1e3:.0f} / {max(have) * 1e3:.0f})", speedup, ideal, share,
                 " ".join(shares)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="+", help="the folder holding train_<config>_<context>.json (several: pooled)")
    parser.add_argument("--steps-from", type=int, default=1, help="first step counted (default 1: skip warm-up)")
    args = parser.parse_args()
    if len(args.out) > 1:
        all_runs = [load(out) for out in args.out]
        empty = [out for out, runs in zip(args.out, all_runs) if not runs]
        if empty:
            sys.exit(f"table.py: no train_<config>_<context>.json in {empty[0]}")
        print_table(pooled_rows(all_runs, args.steps_from),
                    f"Pooled over {len(args.out)} runs ({', '.join(args.out)}); steps from {args.steps_from}:",
                    POOLED_COLUMNS)
        return
    args.out = args.out[0]
    runs = load(args.out)
    if not runs:
        sys.exit(f"table.py: no train_<config>_<context>.json in {args.out}")
    for context in sorted({c for c, _ in runs}):
        base_name, _ = baseline_of(context, runs, args.steps_from)
        sample = next(r["summary"] for (c, _), r in runs.items() if c == context)
        print(f"\n### {tokens_label(context)} tokens per GPU and micro-batch ({sample.get('ranks', '?')} GPUs, "
              f"{sample.get('micro_batches', 1)} micro-batches, {sample.get('layers', '?')} layers"
              f"{window_label(sample)}; baseline: {base_name or 'none'}, the faster of {' and '.join(BASELINES)})\n")
        print("| " + " | ".join(COLUMNS) + " |")
        print("|" + " ---: |" * len(COLUMNS))
        print("\n".join(rows_for(context, runs, args.steps_from)))
        strays = {name: r["summary"]["ranks_with_contexts_on_other_gpus"] for (c, name), r in runs.items()
                  if c == context and r["summary"].get("ranks_with_contexts_on_other_gpus")}
        if strays:  # each such context takes about 0.5 GiB of a GPU that another rank trains on
            print(f"\nWarning: ranks holding a CUDA context on a GPU not their own: {strays}")
    print_table(arrival_rows(runs, args.steps_from),
                "Plan make and rank arrival, ms, mean over the steps (slowest / fastest rank's make; spread of the "
                "ranks' arrival at it; time outside the timed attention calls; GC pauses):",
                ["tokens/GPU", "config", "make, slowest rank", "make, fastest rank", "arrival spread",
                 "outside attention", "GC ms (max rank)", "full GCs"])
    print_table(paired_rows(runs, args.steps_from),
                "Step by step, the same batches (steps from --steps-from): speedup over the baseline min / median / "
                "max, steps slower than it, and ms behind the measured ideal (local_balanced) min / max:",
                ["tokens/GPU", "config", "baseline", "steps", "speedup min / median / max", "steps slower",
                 "ms behind the ideal, min / max"])
    print_table(exchange_rows(runs, args.steps_from),
                "CAD's exchanges on the GPU (timing events), ms per step, largest rank: the collectives' time and the "
                "calling streams' stall for them; the stall's share of the step, the share of the collectives' time "
                "hidden (not stalled for; head groups hide some) and (unsplit runs) the stall's share of attention; "
                "the forwards' wait for plans made ahead; the ping-pong decision (--ping-pong-when worthwhile):",
                ["tokens/GPU", "config", "comm ms", "stall ms", "stall / step", "hidden", "stall / attention",
                 "plan wait ms", "ping-pong decision"])
    print_table(call_rows(runs, args.steps_from),
                "CAD's calls on the GPU (timing events), ms per step: the ranks' server compute (slowest / fastest "
                "rank), its measured max/mean (over both directions, and each direction alone) beside the plan's "
                "predicted imbalance, the slowest rank's compute above "
                "the mean rank's, and the calls' time beyond their compute (exchanges, packing, waits; largest rank):",
                ["tokens/GPU", "config", "server fwd ms", "server bwd ms", "measured max/mean", "fwd / bwd max/mean",
                 "plan's max/mean",
                 "slowest above mean ms", "call beyond compute ms"])
    print_table(profile_rows(args.out, runs),
                "GPU kernel time of the profiled step, largest rank, ms (kernels on different streams overlap):",
                ["tokens/GPU", "config", "step", "ranks"] + list(FAMILIES))


def print_table(rows, title, header):
    """A titled markdown table of `rows` (already formatted lines); nothing where there are none."""
    if not rows:
        return
    print(f"\n{title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + " ---: |" * len(header))
    print("\n".join(rows))

if __name__ == "__main__":
    main()
