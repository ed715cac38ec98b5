#!/usr/bin/env python3
"""Two or more builds of our kernels, A/B on the same GPU in one process (a benchmark, not a test).

Each --lib NAME=PATH is a libcad_kernel_timer.so (build_timer.sh builds one per checkout; an older commit's
from a `git worktree`). Every round, per head dim and per case (dense causal cases, then the diet batches
that match --filter), each library times the case in turn, the order rotating by round so that neither
side always runs first. Reports, per case, each library's forward and backward TFLOP/s (median over the
rounds) and its ratio to the first library, per round and median; per head dim and direction, the
min / median / max of the per-batch median ratios. cuDNN is not run: this compares builds, not us with
cuDNN (diet_bench.py does that).

usage: ab_bench.py --lib base=A.so --lib new=B.so [--rounds 2] [--head-dims 64,128] [--dense 4096,16384,65536]
                   [--filter TEXT]... [--no-diet] [--reps 3] [--warmups 1] [--json OUT.json] [--md OUT.md]

The loop, summary and table take any timer (tests/kernel_diet/test_ab_bench.py drives them with fakes)."""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import diet_bench  # noqa: E402  (parse_batches, FLOPs, KernelLibrary, SkipCase: one definition each)


def is_dense(name):
    return name.startswith("dense_causal_")  # diet_bench.dense_case's names


def run_ab(cases, head_dims, rounds, timers, hq, reps, warmups, deadline_s=None, clock=time.monotonic, log=print,
           on_round=None):
    """rounds x head dims x cases x libraries. timers: [(name, timer)], timer.ours(case, d, warmups, reps)
    -> (fwd_ms, bwd_ms), SkipCase where it cannot run. Returns {"rounds": [...]}, each round
    {d: {case: {lib: {"fwd_tflops", "bwd_tflops"} or {"skipped": why}}}}. A round that would end past
    deadline_s (the longest so far as the guess) is not started; on_round(result so far) after each round."""
    out, start, longest = [], clock(), 0.0
    for r in range(rounds):
        now = clock()
        if deadline_s is not None and r > 0 and (now - start) + longest > deadline_s:
            log(f"stopping after {r} rounds: another (~{longest:.0f} s) would pass the {deadline_s:.0f} s deadline")
            break
        order = timers[r % len(timers):] + timers[:r % len(timers)]
        rnd = {}
        for d in head_dims:
            res = rnd.setdefault(str(d), {})
            for case in cases:
                fl = diet_bench.forward_flops(case["segments"], d, hq)
                w, n = diet_bench.dense_repeats(case["tq"]) if is_dense(case["name"]) else (warmups, reps)
                for name, timer in order:
                    try:
                        f, b = timer.ours(case, d, w, n)
                    except diet_bench.SkipCase as e:
                        res.setdefault(case["name"], {})[name] = {"skipped": str(e)}
                        continue
                    res.setdefault(case["name"], {})[name] = {"fwd_tflops": diet_bench.tflops(fl, f),
                                                              "bwd_tflops": diet_bench.tflops(2.5 * fl, b)}
        out.append(rnd)
        longest = max(longest, clock() - now)
        log(f"round {r + 1} done in {clock() - now:.1f} s")
        if on_round:
            on_round({"rounds": out})
    return {"rounds": out}


def _rate(rnd, d, case, name, direction):
    """A round's TFLOP/s of one library on one case; None where it skipped the case (or never ran it)."""
    return rnd[d][case].get(name, {}).get(f"{direction}_tflops")


def summarize(result, names):
    """Per head dim and case: each library's median TFLOP/s over rounds and, for every library after the
    first, its ratio to the first per round and the median of those; per head dim and direction, the
    spread over the diet batches (cases not named dense_*) of those median ratios."""
    rounds = result["rounds"]
    base = names[0]
    cases, spreads = {}, {}
    for d in (rounds[0].keys() if rounds else []):
        for case in rounds[0][d]:
            row = {}
            for name in names:
                for direction in ("fwd", "bwd"):
                    rates = [x for x in (_rate(rnd, d, case, name, direction) for rnd in rounds) if x is not None]
                    row[f"{name}_{direction}"] = statistics.median(rates) if rates else None
                    if name == base:
                        continue
                    pairs = [(_rate(rnd, d, case, base, direction), _rate(rnd, d, case, name, direction))
                             for rnd in rounds]
                    ratios = [b / a for a, b in pairs if a and b is not None]
                    row[f"{name}_{direction}_ratios"] = ratios
                    row[f"{name}_{direction}_ratio"] = statistics.median(ratios) if ratios else None
            cases.setdefault(d, {})[case] = row
        for name in names[1:]:
            for direction in ("fwd", "bwd"):
                v = [row[f"{name}_{direction}_ratio"] for case, row in cases[d].items()
                     if not is_dense(case) and row[f"{name}_{direction}_ratio"] is not None]
                spreads[f"{d}/{name}/{direction}"] = diet_bench.spread(v)
    return {"cases": cases, "diet_spread": spreads}


def render_markdown(summary, names, meta):
    libs = ", ".join(f"{n} = {meta.get('libs', {}).get(n, '?')}" for n in names)
    lines = [f"GPU: {meta.get('gpu', '?')}; libraries: {libs}", f"Command: `{meta.get('command', '')}`", ""]
    fmt = lambda x: "-" if x is None else f"{x:.0f}"  # noqa: E731
    rat = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    for d, rows in summary["cases"].items():
        head = ["case"] + [f"{n} fwd" for n in names] + [f"{n} bwd" for n in names]
        head += [f"{n}/{names[0]} fwd (per round; median)" for n in names[1:]]
        head += [f"{n}/{names[0]} bwd (per round; median)" for n in names[1:]]
        lines += [f"D={d}, TFLOP/s (median over rounds):", "", "| " + " | ".join(head) + " |",
                  "|" + "---|" * len(head)]
        for case, row in rows.items():
            cells = [case] + [fmt(row[f"{n}_fwd"]) for n in names] + [fmt(row[f"{n}_bwd"]) for n in names]
            for direction in ("fwd", "bwd"):
                for n in names[1:]:
                    per = " ".join(f"{x:.3f}" for x in row[f"{n}_{direction}_ratios"])
                    cells.append(f"{per}; {rat(row[f'{n}_{direction}_ratio'])}")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines.append("Diet batches, each batch's median ratio to the first library: min / median / max")
    lines.append("")
    for key, sp in summary["diet_spread"].items():
        lines.append(f"- {key}: " + ("no batches" if sp is None else
                                     f"{sp['min']:.3f} / {sp['median']:.3f} / {sp['max']:.3f}"))
    return "\n".join(lines)


def parse_lib(text):
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--lib {text!r}: expected NAME=PATH")
    return name, path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", action="append", type=parse_lib, required=True,
                    help="NAME=libcad_kernel_timer.so, two or more; ratios are against the first")
    ap.add_argument("--batches", default=os.path.join(HERE, "diet_batches.txt"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--dense", default="4096,16384,65536", help="dense causal lengths ('' for none)")
    ap.add_argument("--filter", action="append", default=[],
                    help="only the diet batches whose name contains TEXT (repeatable: any of them)")
    ap.add_argument("--no-diet", action="store_true", help="dense cases only")
    ap.add_argument("--hq", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmups", type=int, default=1)
    ap.add_argument("--deadline", type=float, default=None, help="seconds: start no round that would end after it")
    ap.add_argument("--json")
    ap.add_argument("--md")
    args = ap.parse_args(argv)
    names = [n for n, _ in args.lib]
    if len(names) < 2 or len(set(names)) != len(names):
        ap.error("expected two or more --lib NAME=PATH with distinct names")
    for name, path in args.lib:
        if not os.path.isfile(path):
            ap.error(f"--lib {name}={path}: no such file (build_timer.sh builds it)")
    head_dims = [int(x) for x in args.head_dims.split(",")]
    if args.rounds < 1 or args.reps < 1 or args.warmups < 0 or any(d not in (64, 128) for d in head_dims):
        ap.error("expected --rounds >= 1, --reps >= 1, --warmups >= 0 and head dims among 64, 128")
    cases = [diet_bench.dense_case(int(n)) for n in args.dense.split(",") if n.strip()]
    if not args.no_diet:
        cases += [b for b in diet_bench.parse_batches(args.batches)
                  if not args.filter or any(f in b["name"] for f in args.filter)]
    timers = [(name, diet_bench.KernelLibrary(path, args.hq, args.hkv)) for name, path in args.lib]
    meta = {"gpu": timers[0][1].device, "libs": dict(args.lib), "hq": args.hq, "hkv": args.hkv,
            "cases": [c["name"] for c in cases],
            "command": " ".join([os.path.basename(sys.argv[0])] + (argv or sys.argv[1:]))}
    print(f"{len(cases)} cases x {len(head_dims)} head dims x {len(names)} libraries x {args.rounds} rounds on "
          f"{meta['gpu']}", flush=True)
    def save(result):  # after every round, so that a run cut short keeps what it measured
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"meta": meta, **result, "summary": summarize(result, names)}, f, indent=1)

    t0 = time.monotonic()
    result = run_ab(cases, head_dims, args.rounds, timers, args.hq, args.reps, args.warmups, args.deadline,
                    log=lambda m: print(m, flush=True), on_round=save)
    meta["wall_s"] = time.monotonic() - t0
    save(result)
    text = render_markdown(summarize(result, names), names, meta)
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
