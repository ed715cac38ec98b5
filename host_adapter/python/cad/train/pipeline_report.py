"""What the pipeline trainer records and reports: per tick and rank (tick_record), per step over every rank
(step_record), the summary over steps, and the comparison table of --configs (speedup, ideal, realised share:
cad.train.share)."""
import time

from .attention import AttentionClock
from .flops import causal_cost, model_flops
from .share import realised_share


CONFIGS = {  # --configs name -> (attention, pool, schedule: None = --schedule's); in the comparison table's order
    "local": ("local", None, None), "torch_varlen": ("torch_varlen", None, None), "cad_tick": ("cad", "tick", None),
    "cad_stage": ("cad", "stage", None), "cad_bubble": ("cad", "bubble", None),
    "local_balanced": ("local", None, None),
    "1f1b_local": ("local", None, "1f1b"), "1f1b_torch_varlen": ("torch_varlen", None, "1f1b"),
    "1f1b_cad_tick": ("cad", "tick", "1f1b"), "1f1b_cad_stage": ("cad", "stage", "1f1b"),
    "1f1b_cad_bubble": ("cad", "bubble", "1f1b"),  # needs --checkpointing full (parse_args)
    "1f1b_local_balanced": ("local", None, "1f1b"),
}


# The measured ideal (--balanced-batches): local attention on the step's buffers made equal in attention work (every
# tick's attention at the mean, at no communication cost), not an alternative a user has.
BALANCED = ("local_balanced", "1f1b_local_balanced")


def baseline_name(config):
    """The local-attention configuration a configuration's speedup is measured against: the same schedule's."""
    return "1f1b_local" if config.startswith("1f1b_") else "local"


def balanced_name(config):
    """The configuration that measures the ideal of a configuration's schedule (local attention, balanced buffers)."""
    return "1f1b_local_balanced" if config.startswith("1f1b_") else "local_balanced"


def base_makes():
    """Collective plan makes so far in this process (cad's counter)."""
    import cad._plan
    return cad._plan.makes_so_far()


def tick_record(phase, tick, m, tick_start, plan, asked_at, docs, layout, use_cad):
    """What one rank measured in one tick (attention time since the last take, the tick's time) and its costs."""
    import cad
    now = time.perf_counter()
    own = docs[m][layout.replica] if m is not None else []
    record = {"phase": phase, "tick": tick, "micro_batch": -1 if m is None else m, "started_at": tick_start,
              "tick_s": now - tick_start,
              "attention_s": cad.attention_time(reset=True) + AttentionClock.take(),
              "colocated_pairs": float(causal_cost(own))}
    if use_cad and plan is not None:
        record["plan_id"], record["plan_tag"] = plan.id, plan.tag
        if asked_at is not None:
            record["asked_ms"] = (asked_at - tick_start) * 1e3  # negative: asked before the tick began
        stats = plan.stats
        if stats:
            me = stats.get("rank")
            servers = stats.get("servers") or []
            if me is not None and me < len(servers):
                record["planned_flops"] = float(servers[me]["forward_flops"])
            record["plan_imbalance"] = stats["imbalance"]
    return record


# Attention work of a call by direction, in forwards (a backward's matmuls are 2.5 forwards'): in a 1F1B tick some
# stages run forwards while others run backwards, so a tick's imbalance weighs them (a recomputation is a forward).
ATTENTION_WORK = {"forward": 1.0, "backward": 2.5, "idle": 0.0}


def planned_share(plan):
    """This rank's forward FLOPs as a server of `plan` (its stats), or 0."""
    stats = plan.stats or {}
    me, servers = stats.get("rank"), stats.get("servers") or []
    return float(servers[me]["forward_flops"]) if me is not None and me < len(servers) else 0.0


def _imbalance(values):
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else 1.0


def step_record(args, step, gathered, records, matmul_params, docs, layout, flops_documents=None):
    """One step over every rank: the scalars, then per tick the ranks' attention and tick times and costs.
    flops_documents: the documents the model FLOPs count, per micro-batch and replica (default `docs`; with
    --max-doc-len the whole documents, of which `docs` holds each replica's pieces)."""
    world = len(gathered)
    last = [g for g in gathered if g[1] == 1.0]
    step_s = max(g[2] for g in gathered)
    per_tick = []
    saved = 0.0
    for i, r in enumerate(records):
        at = 8 + 4 * i
        attention = [g[at] for g in gathered]
        tick_s = [g[at + 1] for g in gathered]
        colocated = [g[at + 2] for g in gathered]
        planned = [g[at + 3] for g in gathered]
        mean = sum(attention) / world
        saved += max(attention) - mean
        entry = {"phase": r["phase"], "tick": r["tick"], "attention_s": attention, "tick_s": tick_s,
                 "imbalance": _imbalance(attention), "colocated_imbalance": _imbalance(colocated),
                 "micro_batch_on_rank0": r["micro_batch"]}
        if any(planned):
            entry["planned_imbalance"] = _imbalance(planned)
        if "plan_imbalance" in r:
            entry["plan_imbalance"] = r["plan_imbalance"]  # the balancer's max/mean over its group's servers
        per_tick.append(entry)
    tokens = sum(g[3] for g in gathered)
    flops = model_flops(args, matmul_params, docs if flops_documents is None else flops_documents)
    return {"step": step, "loss": sum(g[0] for g in last) / len(last), "losses": [g[0] for g in last],
            "grad_norm": sum(g[7] for g in gathered[::layout.dp]) ** 0.5,
            "step_s": [g[2] for g in gathered], "step_ms": step_s * 1e3,
            "ideal_step_ms": (step_s - saved) * 1e3, "tokens_per_s": tokens / step_s,
            "model_tflop": flops / 1e12, "mfu": flops / (step_s * world * args.peak_tflops * 1e12),
            "peak_memory_gib": [g[4] for g in gathered], "plan_wait_ms": [g[5] for g in gathered],
            "plans_made": [int(g[6]) for g in gathered],
            "mean_tick_imbalance": sum(e["imbalance"] for e in per_tick) / len(per_tick),
            "mean_colocated_imbalance": sum(e["colocated_imbalance"] for e in per_tick) / len(per_tick),
            "mean_planned_imbalance": sum(e.get("planned_imbalance", e["colocated_imbalance"]) for e in per_tick)
            / len(per_tick),
            "ticks": per_tick}


def summarise(history):
    """Means over the steps after the first (a warm-up), or over the one step there is."""
    tail = history[1:] or history

    def mean(key):
        return sum(r[key] for r in tail) / len(tail)

    return {"first_loss": history[0]["loss"], "last_loss": history[-1]["loss"],
            "mean_step_ms_after_step0": mean("step_ms"), "mean_ideal_step_ms_after_step0": mean("ideal_step_ms"),
            "mean_tokens_per_s_after_step0": mean("tokens_per_s"), "mean_mfu_after_step0": mean("mfu"),
            "mean_tick_imbalance": mean("mean_tick_imbalance"),
            "mean_planned_imbalance": mean("mean_planned_imbalance"),
            "mean_colocated_imbalance": mean("mean_colocated_imbalance"),
            "mean_plan_wait_ms": sum(max(r["plan_wait_ms"]) for r in tail) / len(tail),
            "peak_memory_gib": max(max(r["peak_memory_gib"]) for r in history)}


def comparison(summaries):
    """Rows of the table from each configuration's summary (name -> summary); speedups over the local attention of
    the same schedule ("local", or "1f1b_local" for the 1f1b_ configurations)."""
    rows = []
    # Attention times without CUDA waits around the calls (--sync-attention-timing off) count only the enqueue:
    # no ideal and no measured tick imbalance from them.
    timed = lambda s: s.get("sync_attention_timing", "on") == "on"  # noqa: E731
    # The best alternative a user has: the fastest run with local attention (ours or torch's varlen, either
    # schedule; lockstep 1F1B can be slower than GPipe, so its own local alone would flatter CAD under 1F1B).
    local_steps = [s["mean_step_ms_after_step0"] for n, s in summaries.items()
                   if CONFIGS.get(n, ("",))[0] in ("local", "torch_varlen") and n not in BALANCED
                   and "skipped" not in s]
    fastest_local = min(local_steps) if local_steps else None
    for name, s in summaries.items():
        local = summaries.get(baseline_name(name))
        ideal = None
        balanced = summaries.get(balanced_name(name))
        if local and "skipped" not in local and balanced and "skipped" not in balanced:
            # measured: the same schedule's local attention on balanced buffers (preferred: no timing syncs needed)
            ideal = local["mean_step_ms_after_step0"] / balanced["mean_step_ms_after_step0"]
        elif local and "skipped" not in local and timed(local):
            ideal = local["mean_step_ms_after_step0"] / local["mean_ideal_step_ms_after_step0"]
        if "skipped" in s:
            rows.append({"config": name, "skipped": s["skipped"]})
            continue
        row = {"config": name, "step_ms": s["mean_step_ms_after_step0"], "ideal_step_ms":
               s["mean_ideal_step_ms_after_step0"], "tokens_per_s": s["mean_tokens_per_s_after_step0"],
               "tick_imbalance": s["mean_tick_imbalance"] if timed(s) else None,
               "planned_imbalance": s["mean_planned_imbalance"],
               "colocated_imbalance": s["mean_colocated_imbalance"], "peak_memory_gib": s["peak_memory_gib"]}
        if local and "skipped" not in local:
            row["speedup"] = local["mean_step_ms_after_step0"] / s["mean_step_ms_after_step0"]
            row["ideal"] = ideal
            row["realised_share"] = realised_share(row["speedup"], ideal)
        if fastest_local is not None:
            row["speedup_vs_fastest_local"] = fastest_local / s["mean_step_ms_after_step0"]
        rows.append(row)
    return rows


def comparison_table(summaries):
    """The table as markdown text."""
    lines = ["| config | step ms | tokens/s | speedup vs local (same schedule) | ideal | realised share | "
             "tick imbalance measured | planned (after) | colocated (before) | peak GiB | speedup vs fastest local |",
             "|" + "---|" * 11]
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    for row in comparison(summaries):
        if "skipped" in row:
            lines.append(f"| {row['config']} | skipped: {row['skipped']} |" + " |" * 9)
            continue
        lines.append(f"| {row['config']} | {row['step_ms']:.1f} | {row['tokens_per_s']:.0f} | "
                     f"{fmt(row.get('speedup'), '.3f')} | {fmt(row.get('ideal'), '.3f')} | "
                     f"{fmt(row.get('realised_share'), '.2f')} | {fmt(row['tick_imbalance'], '.3f')} | "
                     f"{row['planned_imbalance']:.3f} | {row['colocated_imbalance']:.3f} | "
                     f"{row['peak_memory_gib']:.1f} | {fmt(row.get('speedup_vs_fastest_local'), '.3f')} |")
    return "\n".join(lines)
