#!/usr/bin/env python3
"""Writes docs/results.md and its plots (docs/results/*.png) from the run records in bench/results/.

    python3 bench/results/make_results.py            # after a new record: regenerate the page and its plots
    python3 bench/results/make_results.py --out DIR  # write results.md and the plots under DIR instead

No number on the page is typed in: every table and plot is computed here from the records' files, with the
trainer tables' own rules (tests/multi_gpu/table.py: the faster local baseline, the measured ideal
`local_balanced`, means from step 1) and the realised share of cad.train.share. What is chosen by hand is which
records are current (the lists below): a newer record replaces an older one there, and the older one stays in
bench/results/ (and in git) as history. Every section names the records it read (date, commit, machine from
each record's README.md, through index.py), and the script fails if one is missing.

Predicted against measured runs `cad simulate` (bench/simulate/trainer_check.py's pricing of the same batches);
it needs the `cad` binary (--cad, default build/bin/cad) and the document-length distribution (--dist, or
CAD_DATA). Plots need matplotlib (Agg); `--no-plots` writes the page without them (the CPU test uses it).
"""
import argparse
import importlib.util
import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import index  # noqa: E402 -- the records' README fields (date, commit, machine)


def _module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# tests/multi_gpu/table.py's rules, with the realised share's (cad.train.share, which it loads alone: importing the
# package `cad` would import torch for one function).
table = _module(REPO / "tests" / "multi_gpu" / "table.py", "multi_gpu_table")
realised_share = table.realised_share

# ---- which records are current -------------------------------------------------------------------------------
# The example trainer (examples/train_llama.py: Llama-3-8B shape, FSDP2, full checkpointing, 2 micro-batches,
# plans made ahead, no timing syncs). Folders holding train_<config>_<context>.json; several folders of one
# context are rounds of the same configurations and are pooled (the mean of their speedups).
STEP_RECORDS = {
    2: ["trainer_h200x2_2026-11-28_76d405a_4/a/round1", "trainer_h200x2_2026-11-28_76d405a_4/a/round2",
        "trainer_h200x2_2026-11-28_76d405a_5/a", "trainer_h200x2_2026-11-28_76d405a_2/a",
        "trainer_h200x2_2026-11-28_3c8dbea_3/k256"],
    4: ["trainer_h200x4_2026-11-27_00fd4de", "trainer_h200x4_2026-11-27_00fd4de/256k"],
}
CAD_CONFIGS = ["prefix_aware", "distca", "per_doc_cp"]  # the rows of the step tables, where a record has them
KERNEL_RECORD = "fa_anchors_h200x1_2026-12-04_6ce0c32/fa_anchor_bench.json"
SERVER_RECORD = "cad_server_bench_h200/cad_server_bench_h200.json"
FIRST_STEP = 1  # step 0 warms up


def record_of(path):
    """The record folder (first path part) of a path under bench/results/."""
    return str(path).split("/")[0]


def cite(records):
    """'record (date, commit, machine)' for each record, as links from docs/results.md; fails if one is missing."""
    out = []
    for name in sorted(set(records)):
        f = index.read_record(name)  # raises ValueError naming a missing record or field
        if f["Commit"].startswith("not recorded"):  # "... added in <sha>, so the code measured is at or before it"
            commit = "at or before " + f["Commit"].split("added in ")[1].split(",")[0]
        else:
            commit = f["Commit"].split()[0].rstrip(",.;")
        out.append(f"[{name}](../bench/results/{name}/) ({f['Date'].split()[0]}, commit {commit}, "
                   f"{f['Machine'].split(' (')[0]})")
    return "; ".join(out)


# ---- the step tables -----------------------------------------------------------------------------------------
def step_rows(gpus):
    """Per context: the pooled speedups and shares of CAD_CONFIGS over the faster local baseline."""
    per = {}  # (context, config) -> lists over rounds
    for folder in STEP_RECORDS[gpus]:
        path = HERE / folder
        if not path.is_dir():
            raise ValueError(f"bench/results/{folder}: no such folder (make_results.py's STEP_RECORDS)")
        runs = table.load(path)
        if not runs:
            raise ValueError(f"bench/results/{folder}: no train_<config>_<context>.json files")
        for context in sorted({k[0] for k in runs}):
            base_name, base = table.baseline_of(context, runs, FIRST_STEP)
            if base is None:
                continue
            t_base = table.mean_step(base, FIRST_STEP)
            t_ideal = table.mean_step(runs.get((context, table.MEASURED_IDEAL)), FIRST_STEP)
            ideal = t_base / t_ideal if t_ideal else None
            for name in CAD_CONFIGS:
                t = table.mean_step(runs.get((context, name)), FIRST_STEP)
                if t is None:
                    continue
                run = runs[(context, name)]
                steps = run["steps"][FIRST_STEP:]
                peak = max(max(s["peak_memory_gib"]) for s in steps) if all("peak_memory_gib" in s for s in steps) \
                    else None
                base_steps = base["steps"][FIRST_STEP:]
                base_peak = max(max(s["peak_memory_gib"]) for s in base_steps) \
                    if all("peak_memory_gib" in s for s in base_steps) else None
                e = per.setdefault((context, name), {"speedup": [], "ideal": [], "t": [], "t_base": [],
                                                     "peak": [], "base_peak": [], "folders": [],
                                                     "layers": run["summary"]["layers"], "baseline": base_name})
                e["speedup"].append(t_base / t)
                e["t"].append(t)
                e["t_base"].append(t_base)
                if ideal is not None:
                    e["ideal"].append(ideal)
                if peak is not None and base_peak is not None:
                    e["peak"].append(peak)
                    e["base_peak"].append(base_peak)
                e["folders"].append(folder)
    rows = []
    for (context, name), e in sorted(per.items(), key=lambda kv: (kv[0][0], CAD_CONFIGS.index(kv[0][1]))):
        speedup = table.mean(e["speedup"])
        ideal = table.mean(e["ideal"]) if e["ideal"] else None
        share = realised_share(speedup, ideal, least_gain=0.01) if ideal else None
        rows.append({"context": context, "config": name, "speedup": speedup, "ideal": ideal, "share": share,
                     "rounds": len(e["speedup"]), "t": table.mean(e["t"]), "t_base": table.mean(e["t_base"]),
                     "layers": e["layers"], "baseline": e["baseline"], "folders": e["folders"],
                     "peak": max(e["peak"]) if e["peak"] else None,
                     "base_peak": max(e["base_peak"]) if e["base_peak"] else None})
    return rows


def fmt(x, spec, none="-"):
    return none if x is None else format(x, spec)


def step_table(rows):
    out = ["| tokens/GPU | config | layers | rounds | local step (ms) | CAD step (ms) | speedup | measured ideal | "
           "realised share |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {table.tokens_label(r['context'])} | {r['config']} | {r['layers']} | {r['rounds']} | "
                   f"{r['t_base'] * 1e3:.0f} | {r['t'] * 1e3:.0f} | {r['speedup']:.3f} | {fmt(r['ideal'], '.3f')} | "
                   f"{fmt(r['share'], '.2f')} |")
    return out


def memory_table(rows):
    out = ["| GPUs | tokens/GPU | config | peak GiB, largest rank (local) | peak GiB, largest rank (CAD) | CAD / local |",
           "|---:|---:|---|---:|---:|---:|"]
    for gpus, r in rows:
        if r["peak"] is None or r["config"] != "prefix_aware":
            continue
        out.append(f"| {gpus} | {table.tokens_label(r['context'])} | {r['config']} | {r['base_peak']:.1f} | "
                   f"{r['peak']:.1f} | {r['peak'] / r['base_peak']:.3f} |")
    return out


# ---- kernels against the anchors ------------------------------------------------------------------------------
def kernel_table():
    import json
    data = json.loads((HERE / KERNEL_RECORD).read_text())
    # The implementations the record timed (a run may time a subset: --impls), in the bench's order.
    others = [o for o in ("fa4", "fa3", "torch", "cudnn", "flex")
              if any((row["impls"].get(o) or {}).get("fwd_ratio") is not None for row in data["rows"])]
    out = ["| D | case | ours fwd / bwd TFLOP/s | " + " | ".join(f"{o} time / ours (fwd / bwd)" for o in others) + " |",
           "|---:|---|---:|" + "---:|" * len(others)]
    bars = []
    for row in data["rows"]:
        ours = row["impls"].get("ours")
        if not ours or ours.get("fwd_tflops") is None:
            continue
        cells = []
        for o in others:
            impl = row["impls"].get(o) or {}
            if impl.get("fwd_ratio") is None or impl.get("bwd_ratio") is None:
                cells.append("-")
            else:
                cells.append(f"{impl['fwd_ratio']:.2f} / {impl['bwd_ratio']:.2f}")
        out.append(f"| {row['d']} | {row['case']} | {ours['fwd_tflops']:.0f} / {ours['bwd_tflops']:.0f} | "
                   + " | ".join(cells) + " |")
        bars.append((f"D{row['d']} {row['case']}", {o: (row["impls"].get(o) or {}).get("both_ratio") for o in others}))
    return out, bars


# ---- per-rank attention before and after ----------------------------------------------------------------------
def server_case():
    """The per-rank server times (fwd + bwd, ms) of one measured batch, colocated against prefix_aware."""
    import json
    data = json.loads((HERE / SERVER_RECORD).read_text())
    pick = {}
    for c in data["cases"]:
        if c["ranks"] == 8 and c["balancer"] in ("colocated", "prefix_aware") and c["balancer"] not in pick:
            pick[c["balancer"]] = c
    if len(pick) != 2 or pick["colocated"]["context"] != pick["prefix_aware"]["context"]:
        raise ValueError(f"bench/results/{SERVER_RECORD}: no 8-rank colocated and prefix_aware case of one context")
    times = {b: [r["forward_ms"] + r["backward_ms"] for r in c["ranks_detail"]] for b, c in pick.items()}
    return pick["colocated"]["context"], times, data["gpu"]


# ---- predicted against measured -------------------------------------------------------------------------------
def predicted(args):
    """(config label, measured s, predicted s) of every configuration of STEP_RECORDS that cad simulate prices."""
    check = _module(REPO / "bench" / "simulate" / "trainer_check.py", "trainer_check")
    out = []
    folders = [f for fs in STEP_RECORDS.values() for f in fs]
    for c in check.measured_configs(folders):
        if c["pingpong"]:
            continue
        res, _ = check.simulate(args, c, check.CALIBRATION)
        out.append((f"{c['ranks']} GPUs {table.tokens_label(c['context'])} {c['config']}", c["step_s"],
                    res["off"]["mean_step_seconds"], record_of(c["run"])))
    return out


# ---- the plots ------------------------------------------------------------------------------------------------
def plots(outdir, steps, bars, server, pred):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    outdir.mkdir(parents=True, exist_ok=True)
    files = []

    fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
    for gpus, marker in ((2, "o"), (4, "s")):
        rows = [r for r in steps[gpus] if r["config"] == "prefix_aware"]
        xs = [r["context"] // 1024 for r in rows]
        ax[0].plot(xs, [r["speedup"] for r in rows], marker=marker, label=f"{gpus} GPUs: CAD")
        ax[0].plot(xs, [r["ideal"] or float("nan") for r in rows], marker=marker, linestyle=":",
                   label=f"{gpus} GPUs: measured ideal")
        ax[1].plot(xs, [r["share"] if r["share"] is not None else float("nan") for r in rows], marker=marker,
                   label=f"{gpus} GPUs")
    ticks = sorted({r["context"] // 1024 for g in steps for r in steps[g]})
    for a, title in ((ax[0], "step speedup over local attention"), (ax[1], "realised share of the ideal gain")):
        a.set_xscale("log", base=2)
        a.set_xticks(ticks, [str(t) for t in ticks])
        a.set_xlabel("tokens per GPU (K)")
        a.set_title(title, fontsize=10)
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    ax[1].set_ylim(0, 1.1)
    fig.tight_layout()
    fig.savefig(outdir / "speedup.png", dpi=80)
    plt.close(fig)
    files.append("speedup.png")

    fig, ax = plt.subplots(figsize=(9, 3.2))
    labels = [b[0] for b in bars]
    names = list(bars[0][1]) if bars else []
    width = 0.8 / max(len(names), 1)
    for i, o in enumerate(names):
        ax.bar([x + (i - (len(names) - 1) / 2) * width for x in range(len(bars))],
               [b[1][o] if b[1][o] is not None else 0 for b in bars], width, label=o)
    ax.axhline(1.0, color="k", linewidth=0.8)
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=6)
    ax.set_ylabel("fwd+bwd time / ours")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(outdir / "kernels.png", dpi=80)
    plt.close(fig)
    files.append("kernels.png")

    context, times, gpu = server
    fig, ax = plt.subplots(figsize=(6, 3))
    ranks = range(len(times["colocated"]))
    ax.bar([r - 0.2 for r in ranks], times["colocated"], 0.4, label="before: each rank its own documents")
    ax.bar([r + 0.2 for r in ranks], times["prefix_aware"], 0.4, label="after: CAD (prefix_aware)")
    ax.set_xlabel("rank")
    ax.set_ylabel("attention fwd+bwd (ms)")
    ax.set_title(f"per-rank attention, 8 ranks x {context // 1024}K tokens ({gpu})", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(outdir / "per_rank.png", dpi=80)
    plt.close(fig)
    files.append("per_rank.png")

    if pred:
        fig, ax = plt.subplots(figsize=(4, 4))
        ms = [m * 1e3 for _, m, _, _ in pred]
        ps = [p * 1e3 for _, _, p, _ in pred]
        ax.scatter(ms, ps, s=12)
        lo, hi = min(ms + ps) * 0.9, max(ms + ps) * 1.1
        ax.plot([lo, hi], [lo, hi], "k:", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured step (ms)")
        ax.set_ylabel("cad simulate (ms)")
        fig.tight_layout()
        fig.savefig(outdir / "predicted.png", dpi=80)
        plt.close(fig)
        files.append("predicted.png")
    return files


# ---- the README's headline table --------------------------------------------------------------------------------
HEADLINE_BEGIN, HEADLINE_END = "<!-- results-table:begin -->", "<!-- results-table:end -->"


def headline(steps):
    """The README's table: CAD (prefix_aware) per GPU count and context, each row with its machine, date, record."""
    out = ["| GPUs | tokens/GPU | step speedup over local attention | realised share of the ideal gain | machine, date |"
           " record |", "|---:|---:|---:|---:|---|---|"]
    for gpus in sorted(steps):
        for r in steps[gpus]:
            if r["config"] != "prefix_aware":
                continue
            names = sorted({record_of(folder) for folder in r["folders"]})
            fields = [index.read_record(n) for n in names]
            dates = sorted({f["Date"].split()[0] for f in fields})
            out.append(f"| {gpus} | {table.tokens_label(r['context'])} | {r['speedup']:.3f} | {fmt(r['share'], '.2f')} | "
                       f"{fields[0]['Machine'].split(' (')[0]}, {', '.join(dates)} | "
                       + ", ".join(f"[{n}](bench/results/{n}/)" for n in names) + " |")
    return out


def replace_headline(text, lines):
    """text with the lines between the README's headline markers replaced; fails if the markers are missing."""
    if HEADLINE_BEGIN not in text or HEADLINE_END not in text:
        raise ValueError(f"README.md: no {HEADLINE_BEGIN} ... {HEADLINE_END} markers for the headline table")
    head, rest = text.split(HEADLINE_BEGIN, 1)
    _, tail = rest.split(HEADLINE_END, 1)
    return head + HEADLINE_BEGIN + "\n" + "\n".join(lines) + "\n" + HEADLINE_END + tail


# ---- the page -------------------------------------------------------------------------------------------------
def page(steps, kernels, server, pred, with_plots):
    context, times, gpu = server
    lines = [
        "# Results",
        "",
        "Made by `python3 bench/results/make_results.py` (with `build/bin/cad` built and `CAD_DATA` naming "
        "doclen_pretrain.json, for the predicted section) from the run records in [bench/results/](../bench/results/)",
        "(do not edit by hand: change the records or the script, then run it again). Each section names the records",
        "it read. How to run the trainer yourself: [multi_gpu.md](multi_gpu.md).",
        "",
        "## Per-rank attention before and after",
        "",
        f"Each rank's measured attention server time (forward + backward) for one batch of 8 ranks x "
        f"{context // 1024}K tokens: max/mean {max(times['colocated']) / table.mean(times['colocated']):.2f} with "
        f"each rank's own documents, {max(times['prefix_aware']) / table.mean(times['prefix_aware']):.2f} with CAD. "
        f"Record: {cite([record_of(SERVER_RECORD)])}.",
        "",
    ]
    if with_plots:
        lines += ["![per-rank attention](results/per_rank.png)", ""]
    lines += ["## Training step: speedup and realised share", "",
              "`examples/train_llama.py` (Llama-3-8B shape, FSDP2, full activation checkpointing, 2 micro-batches). "
              "Speedup: the faster local baseline's step over CAD's; measured ideal: the same over `local_balanced` "
              "(local attention on batches made balanced); realised share: (speedup - 1) / (ideal - 1). "
              "Means from step 1; rounds pooled. The local baseline of these runs is the project's kernel "
              "(`local`): FlashAttention-4, the fastest local kernel on an H200, was not installed on the "
              "multi-GPU machines that ran them. On one H200 FA4's local step is 2.9% faster than `local` at 64K "
              "(record trainer_fa4_h200x1_ff1afce), so over FA4 these speedups would be smaller by about that; "
              "CAD against local FA4 at world size 1: [kernels_fa4.md](kernels_fa4.md).", ""]
    if with_plots:
        lines += ["![speedup](results/speedup.png)", ""]
    for gpus in sorted(steps):
        lines += [f"### {gpus} GPUs", "", *step_table(steps[gpus]), "",
                  f"Records: {cite(record_of(f) for f in STEP_RECORDS[gpus])}.", ""]
    lines += ["## Memory", "", "Peak memory of the largest rank (torch.cuda.max_memory_allocated) in the same runs.", "",
              *memory_table([(g, r) for g in sorted(steps) for r in steps[g]]), "",
              f"Records: {cite(record_of(f) for fs in STEP_RECORDS.values() for f in fs)}.", ""]
    ktable, _ = kernels
    lines += ["## Kernels against FlashAttention and PyTorch's FlexAttention", "",
              "Our kernels' TFLOP/s, and each other implementation's time relative to ours (below 1: faster than "
              "ours), bf16, causal, Hq 32 / Hkv 8 (bench/kernels/fa_anchor_bench.py).", ""]
    if with_plots:
        lines += ["![kernels](results/kernels.png)", ""]
    lines += [*ktable, "", f"Record: {cite([record_of(KERNEL_RECORD)])}. More, and torch's `varlen_attn` and cuDNN "
              "beside an earlier build of our kernels: [kernels_fa4.md](kernels_fa4.md).", ""]
    lines += ["## Predicted against measured", ""]
    if pred:
        errs = [p / m - 1 for _, m, p, _ in pred]
        lines += [f"`cad simulate` (calibration docs/simulate/trainer_h200.json) on the very batches of the step "
                  f"records above: mean |error| {table.mean(abs(e) for e in errs) * 100:.1f}%, "
                  f"{sum(abs(e) <= 0.10 for e in errs)} of {len(errs)} within 10%. All records: "
                  f"[simulate/trainer_check.md](simulate/trainer_check.md); the model: [simulate.md](simulate.md).", ""]
        if with_plots:
            lines += ["![predicted](results/predicted.png)", ""]
        lines += ["| record | configuration | measured (ms) | predicted (ms) | error |", "|---|---|---:|---:|---:|"]
        lines += [f"| {r} | {n} | {m * 1e3:.0f} | {p * 1e3:.0f} | {(p / m - 1) * 100:+.1f}% |" for n, m, p, r in pred]
        lines += ["", f"Records: {cite(r for *_, r in pred)}.", ""]
    else:
        lines += ["Not made in this run of the script (no `cad` binary or no document-length data); see "
                  "[simulate.md](simulate.md).", ""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(REPO / "docs"), help="where results.md and results/*.png go (default docs/)")
    ap.add_argument("--no-plots", action="store_true", help="write the page without plots (no matplotlib needed)")
    ap.add_argument("--cad", default=None, help="the cad binary for `cad simulate` (default build/bin/cad)")
    ap.add_argument("--dist", default=os.environ.get("CAD_DATA", str(REPO.parent / "shared" / "data" /
                                                                      "doclen_pretrain.json")),
                    help="the document-length distribution the trainer sampled (doclen_pretrain.json)")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    try:
        steps = {g: step_rows(g) for g in STEP_RECORDS}
        kernels = kernel_table()
        server = server_case()
        cad = args.cad or str(REPO / "build" / "bin" / "cad")
        pred = predicted(args) if os.path.exists(cad) and os.path.exists(args.dist) else []
        text = page(steps, kernels, server, pred, not args.no_plots)
    except (ValueError, OSError, KeyError) as e:
        print(f"make_results.py: {e}", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(text + "\n")
    # The README's headline table: in README.md itself when writing docs/, else beside the page (for comparing).
    readme = REPO / "README.md"
    try:
        if out.resolve() == (REPO / "docs").resolve():
            readme.write_text(replace_headline(readme.read_text(), headline(steps)))
        else:
            (out / "headline.md").write_text("\n".join(headline(steps)) + "\n")
    except ValueError as e:
        print(f"make_results.py: {e}", file=sys.stderr)
        return 1
    written = [] if args.no_plots else plots(out / "results", steps, kernels[1], server, pred)
    print(f"make_results.py: wrote {out / 'results.md'}" + (f" and {len(written)} plots under {out / 'results'}"
                                                               if written else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
