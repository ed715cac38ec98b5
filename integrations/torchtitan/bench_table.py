"""The table of bench_gpu.sh's runs: python3 bench_table.py DIR, where DIR holds one CAD_TT_JSON file per
configuration (<config>.json, as bench_gpu.sh names them). Markdown on stdout.

Steps: the mean over steps 3 and later (the first two warm up: the first compiles and plans, the second still
allocates), every configuration on the same batches. Baseline: the fastest configuration without CAD's plans
(local, torch_varlen, flex, titan_varlen). Ideal: local / local_balanced, the same kernels on rows whose attention
work is every rank's mean (the measured ideal of examples/train_llama.py). Realised share: (speedup - 1) / (ideal - 1).
Per-step speedups (min-max) compare the same step, i.e. the same batch, of CAD and the baseline."""
import importlib.util
import json
import pathlib
import sys

# cad.train.share (pure Python, the one rule) loaded alone: importing the package `cad` would import torch (tens
# of seconds on a busy machine) for one function; registered under its name so that every importer shares it.
if "cad.train.share" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("cad.train.share", pathlib.Path(__file__).resolve().parents[2] /
                                                   "host_adapter" / "python" / "cad" / "train" / "share.py")
    sys.modules["cad.train.share"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["cad.train.share"])
realised_share = sys.modules["cad.train.share"].realised_share  # DESIGN's headline measure, one rule for every table

BASELINES = ("local", "torch_varlen", "flex", "titan_varlen")
SKIP = 2


def steady(run):
    steps = [r["step_s"] for r in run["steps"]]
    return steps[SKIP:] if len(steps) > SKIP else steps[-1:]


def mean(xs):
    return sum(xs) / len(xs)


def table(runs):
    """runs: {config: the JSON summary}; the markdown lines."""
    step = {c: mean(steady(r)) for c, r in runs.items()}
    baselines = [c for c in BASELINES if c in step]
    base = min(baselines, key=step.get) if baselines else None
    ideal = step["local"] / step["local_balanced"] if {"local", "local_balanced"} <= step.keys() else None
    any_run = next(iter(runs.values()))
    lines = [f"{any_run['world']} GPUs, {any_run['layers']} layers, {any_run['seq_len'] // 1024}K tokens per GPU, "
             f"steps {SKIP + 1}-{len(any_run['steps'])}; baseline: {base or 'none'} (the fastest without CAD's plans); "
             f"ideal (local / local_balanced): {f'{ideal:.3f}' if ideal else '-'}", "",
             "| config | model / flavor | step s | tokens/s (K) | peak GiB | speedup vs baseline | per-step speedup "
             "min-max | realised share | attention calls/step | plan wait ms/step | last loss |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c, r in runs.items():
        # K tokens/s; under CP and TP a row spans a CP group and a TP group shares one (tokens_per_step)
        tokens = r.get("tokens_per_step", r["seq_len"] * r["world"]) / step[c] / 1e3
        peak = max((s.get("peak_gib", 0) for s in r["steps"]), default=0)
        speedup = share = spread = "-"
        if base:
            speedup = f"{step[base] / step[c]:.3f}"
            per_step = [b / x for b, x in zip(steady(runs[base]), steady(r))]
            spread = f"{min(per_step):.3f}-{max(per_step):.3f}"
            realised = realised_share(step[base] / step[c], ideal) if c != "local_balanced" else None
            if realised is not None:
                share = f"{realised:.2f}"
        calls = r["steps"][-1].get("attention_calls", "-")
        waits = [x["plan_wait_ms"] for x in r["steps"][SKIP:] if "plan_wait_ms" in x]
        wait = f"{mean(waits):.1f}" if waits else "-"
        lines.append(f"| {c} | {r['model']} / {r['flavor']}{' (balanced rows)' if 'balanced' in r.get('dataset', '') else ''}"
                     f" | {step[c]:.3f} | {tokens:.1f} | {peak:.1f} | {speedup} | {spread} | {share} | {calls} | {wait} | "
                     f"{r['steps'][-1]['loss']:.5f} |")
    return lines


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) == 2 else 2
    runs = {}
    for path in sorted(pathlib.Path(argv[1]).glob("*.json")):
        try:
            runs[path.stem] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            print(f"bench_table: {path}: not a run summary ({e})", file=sys.stderr)
    if not runs:
        print(f"bench_table: no <config>.json in {argv[1]}", file=sys.stderr)
        return 1
    order = [c for c in ("cad", "local", "local_balanced", "torch_varlen", "flex", "titan_varlen") if c in runs]
    print("\n".join(table({c: runs[c] for c in order + sorted(set(runs) - set(order))})))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
