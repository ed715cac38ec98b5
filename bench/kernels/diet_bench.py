#!/usr/bin/env python3
"""Our attention kernels on CAD's real diet against cuDNN, in one process (a benchmark, not a test).

Every round, for each head dim: cuDNN's fused attention (torch SDPA under
sdpa_kernel(SDPBackend.CUDNN_ATTENTION), as cudnn_bench.py runs it) on dense causal 4K/16K/64K, then our
kernels (libcad_kernel_timer.so, case_timer_capi.cu, through ctypes) on the same dense cases and on every
server batch of the diet file (bench/kernels/diet_batches.txt, made by cad_diet_batches). A diet batch's
ratio is our rate on it over cuDNN's dense-16K rate OF THE SAME ROUND and head dim (the
yardstick); the dense rows compare like with like. FLOPs per segment and query head: causal forward
4*d*(q*kv - q*(q-1)/2), backward 2.5x forward.

Writes every measurement to --json (after each round, so a run cut short keeps what it measured) and a
markdown summary to --md and stdout: the dense ratios per round and their min/median/max over rounds; per
head dim and direction the min/median/max over the diet batches (per round, and of each batch's median
over rounds); the five worst batches with their shapes; which of the kernel targets are met.

usage: diet_bench.py --lib libcad_kernel_timer.so [--batches FILE] [--rounds 3] [--head-dims 64,128]
                     [--hq 32] [--hkv 8] [--reps 3] [--warmups 1] [--deadline 330] [--filter TEXT]
                     [--json OUT.json] [--md OUT.md]

The parsing, summary and table code imports neither torch nor the library (tests/kernel_diet tests it
with a fake timer)."""
import argparse
import ctypes
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DENSE = (4096, 16384, 65536)
REFERENCE = 16384  # the diet's yardstick: cuDNN's dense causal 16K rate
ASSUMED_TFLOPS = 450.0  # for the time estimate printed before the run

# The kernel targets: dense ratios against cuDNN, the diet's median and minimum ratio.
DENSE_FWD, DENSE_BWD = 1.0, 0.95
DIET_MEDIAN = {"fwd": 0.95, "bwd": 0.90}
DIET_MIN = 0.85


class DietFileError(ValueError):
    """A malformed diet file; the message names the file and line."""


class SkipCase(Exception):
    """A case that cannot run on this device (e.g. it does not fit in memory); the run goes on."""


# ---- the diet file ------------------------------------------------------------------------------------

def parse_batches(path):
    """The batches of a diet file as dicts {name, tq, tk, segments: [(q_off, q_len, kv_off, kv_len)]}.
    Checks what the kernels need (segments inside the batch, 1 <= q_len <= kv_len)."""
    batches = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            where = f"{path}:{number}"
            words = line.split()
            if len(words) < 4:
                raise DietFileError(f"{where}: expected NAME TQ TK NSEG then the segments")
            name = words[0]
            try:
                tq, tk, nseg = (int(w) for w in words[1:4])
                segments = [tuple(int(x) for x in w.split(",")) for w in words[4:]]
            except ValueError as e:
                raise DietFileError(f"{where} ({name}): expected integers: {e}") from None
            if min(tq, tk, nseg) < 0:
                raise DietFileError(f"{where} ({name}): TQ, TK and NSEG must be >= 0")
            if len(segments) != nseg:
                raise DietFileError(f"{where} ({name}): NSEG says {nseg} segments, the line has {len(segments)}")
            for i, s in enumerate(segments):
                if len(s) != 4:
                    raise DietFileError(f"{where} ({name}) segment {i}: expected q_offset,q_len,kv_offset,kv_len")
                qo, ql, ko, kl = s
                if min(s) < 0 or ql < 1 or kl < ql or qo + ql > tq or ko + kl > tk:
                    raise DietFileError(f"{where} ({name}) segment {i}: {s} is not a causal segment inside "
                                        f"the batch's {tq} x {tk} rows")
            batches.append({"name": name, "tq": tq, "tk": tk, "segments": segments})
    if len({b["name"] for b in batches}) != len(batches):
        raise DietFileError(f"{path}: batch names are not unique")
    return batches


def forward_flops(segments, d, hq):
    return sum(4.0 * d * (q * kv - q * (q - 1) / 2) for _, q, _, kv in segments) * hq


def dense_flops(n, d, hq):
    return forward_flops([(0, n, 0, n)], d, hq)


def dense_case(n):
    """Dense causal attention over n tokens as a batch of this file's format (one segment)."""
    return {"name": f"dense_causal_{n // 1024}k", "tq": n, "tk": n, "segments": [(0, n, 0, n)]}


def dense_repeats(n):
    """(warm-ups, timed calls) of a dense case: cudnn_bench's repeats, fewer at 64K and up."""
    return 2, (5 if n >= 65536 else 10)


def shape_of(batch):
    segs = batch["segments"]
    return {"segments": len(segs), "max_q": max((s[1] for s in segs), default=0),
            "max_kv": max((s[3] for s in segs), default=0), "q_rows": batch["tq"], "kv_rows": batch["tk"]}


def tflops(flops, ms):
    return flops / ms / 1e9 if ms > 0 else 0.0


def estimate_seconds(batches, head_dims, hq, rounds, reps, warmups):
    """Seconds at ASSUMED_TFLOPS: forward + backward (2.5x) per call, warm-ups and repeats, dense cases of
    both libraries included (cudnn_bench's repeats: 2 warm-ups, 10 or 5)."""
    total = 0.0
    for d in head_dims:
        diet = sum(forward_flops(b["segments"], d, hq) for b in batches) * (reps + warmups)
        dense = sum(dense_flops(n, d, hq) * sum(dense_repeats(n)) for n in DENSE)
        # cuDNN: fwd alone, then fwd+bwd; ours: fwd, then bwd.
        total += 3.5 * diet + (1 + 3.5) * dense + 3.5 * dense
    return rounds * total / (ASSUMED_TFLOPS * 1e12)


# ---- the measurement loop (any timer: the real one below, or a test's fake) --------------------------

def run_rounds(batches, head_dims, rounds, timer, hq, reps, warmups, deadline_s=None, clock=time.monotonic,
               on_round=None, log=print):
    """Measures `rounds` rounds; returns a list of rounds, each {"round", "head_dims": {d: {...}}}.
    Before starting a round it stops when the deadline would pass (the longest round so far as the guess).
    timer.cudnn_dense(n, d) -> (fwd_ms, bwd_ms, note), a RuntimeError recorded as a failure (rates 0, no
    ratio); timer.ours(batch, d, warmups, reps) -> (fwd_ms, bwd_ms), raising SkipCase for a case this device
    cannot run (anything else ends the run); timer.release() frees cached memory."""
    start = clock()
    out, longest = [], 0.0
    for r in range(rounds):
        now = clock()
        if deadline_s is not None and r > 0 and (now - start) + longest > deadline_s:
            log(f"stopping after {r} rounds: another round (~{longest:.0f} s) would pass the "
                f"{deadline_s:.0f} s deadline")
            break
        rnd = {"round": r + 1, "head_dims": {}}
        for d in head_dims:
            res = {"cudnn_dense": {}, "ours_dense": {}, "diet": {}}
            for n in DENSE:
                try:
                    f, b, note = timer.cudnn_dense(n, d)
                except RuntimeError as e:  # e.g. no cuDNN kernel for this shape: no ratio, the run goes on
                    f, b, note = 0.0, 0.0, f"failed: {e}"
                    log(f"cuDNN dense {n} at D={d}: {note}")
                fl = dense_flops(n, d, hq)
                res["cudnn_dense"][str(n)] = {"fwd_ms": f, "bwd_ms": b, "fwd_tflops": tflops(fl, f),
                                              "bwd_tflops": tflops(2.5 * fl, b), "note": note}
            timer.release()
            for n in DENSE:
                f, b = timer.ours(dense_case(n), d, *dense_repeats(n))
                fl = dense_flops(n, d, hq)
                res["ours_dense"][str(n)] = {"fwd_ms": f, "bwd_ms": b, "fwd_tflops": tflops(fl, f),
                                             "bwd_tflops": tflops(2.5 * fl, b)}
            for batch in batches:
                try:
                    f, b = timer.ours(batch, d, warmups, reps)
                except SkipCase as e:
                    res["diet"][batch["name"]] = {"skipped": str(e)}
                    continue
                fl = forward_flops(batch["segments"], d, hq)
                res["diet"][batch["name"]] = {"fwd_ms": f, "bwd_ms": b, "fwd_tflops": tflops(fl, f),
                                              "bwd_tflops": tflops(2.5 * fl, b)}
            rnd["head_dims"][str(d)] = res
        longest = max(longest, clock() - now)
        out.append(rnd)
        log(f"round {r + 1} done in {clock() - now:.1f} s")
        if on_round:
            on_round(out)
    return out


# ---- the summary --------------------------------------------------------------------------------------

def spread(values):
    v = sorted(values)
    return {"min": v[0], "median": statistics.median(v), "max": v[-1]} if v else None


def summarize(batches, rounds):
    """Ratios and their distributions. Dense: ours/cuDNN per round; diet: ours / cuDNN's dense 16K rate of
    the same round and head dim, per round and per batch (median over rounds)."""
    shapes = {b["name"]: shape_of(b) for b in batches}
    head_dims = sorted({d for rnd in rounds for d in rnd["head_dims"]}, key=int)
    summary = {"rounds": len(rounds), "head_dims": {}}
    for d in head_dims:
        per = [rnd["head_dims"][d] for rnd in rounds if d in rnd["head_dims"]]
        dense = {}
        for n in DENSE:
            key = str(n)
            dense[key] = {}
            for direction in ("fwd", "bwd"):
                ok = [r for r in per if r["cudnn_dense"][key][f"{direction}_tflops"] > 0]
                ours = [r["ours_dense"][key][f"{direction}_tflops"] for r in ok]
                cudnn = [r["cudnn_dense"][key][f"{direction}_tflops"] for r in ok]
                ratios = [o / c for o, c in zip(ours, cudnn)]
                dense[key][direction] = {"per_round": ratios, "spread": spread(ratios),
                                         "ours_tflops": spread(ours), "cudnn_tflops": spread(cudnn)}
        diet = {}
        skipped = sorted({name for r in per for name, m in r["diet"].items() if "skipped" in m})
        for direction in ("fwd", "bwd"):
            by_batch, per_round = {}, []
            ref_rates = []
            for r in per:
                ref = r["cudnn_dense"][str(REFERENCE)][f"{direction}_tflops"]
                ref_rates.append(ref)
                ratios = {}
                for name, m in r["diet"].items():
                    if "skipped" in m or ref <= 0:
                        continue
                    ratios[name] = m[f"{direction}_tflops"] / ref
                    by_batch.setdefault(name, []).append(ratios[name])
                per_round.append(spread(list(ratios.values())))
            medians = {name: statistics.median(v) for name, v in by_batch.items()}
            worst = sorted(medians.items(), key=lambda kv: (kv[1], kv[0]))[:5]
            diet[direction] = {
                "reference_tflops_per_round": ref_rates,
                "per_round": per_round,
                "batches": spread(list(medians.values())),
                "per_batch_median": medians,
                "worst": [dict(name=n, ratio=v, **shapes.get(n, {})) for n, v in worst],
            }
        summary["head_dims"][d] = {"dense": dense, "diet": diet, "skipped": skipped,
                                   "measured_batches": len(diet["fwd"]["per_batch_median"])}
    summary["targets"] = targets(summary)
    return summary


def targets(summary):
    """The kernel targets, each {"what", "value", "goal", "met"}; dense on the median over rounds, the diet
    on each batch's median over rounds."""
    out = []
    for d, s in summary["head_dims"].items():
        for n in DENSE:
            for direction, goal in (("fwd", DENSE_FWD), ("bwd", DENSE_BWD)):
                sp = s["dense"][str(n)][direction]["spread"]
                if sp:
                    out.append({"what": f"D={d} dense {n // 1024}K {direction} vs cuDNN (median of rounds)",
                                "value": sp["median"], "goal": goal, "met": sp["median"] >= goal})
        for direction in ("fwd", "bwd"):
            sp = s["diet"][direction]["batches"]
            if not sp:
                continue
            out.append({"what": f"D={d} diet {direction} median vs cuDNN dense 16K", "value": sp["median"],
                        "goal": DIET_MEDIAN[direction], "met": sp["median"] >= DIET_MEDIAN[direction]})
            out.append({"what": f"D={d} diet {direction} minimum vs cuDNN dense 16K", "value": sp["min"],
                        "goal": DIET_MIN, "met": sp["min"] >= DIET_MIN})
    return out


def _fmt_spread(sp):
    return f'{sp["min"]:.2f} / {sp["median"]:.2f} / {sp["max"]:.2f}' if sp else "-"


def render_markdown(summary, meta):
    setup = [f'GPU: {meta.get("gpu", "?")}', meta.get("software"),
             f'Hq={meta.get("hq")} Hkv={meta.get("hkv")} bf16 causal',
             f'{summary["rounds"]} round(s), each measuring cuDNN first',
             f'diet: {meta.get("batches_file")} ({meta.get("num_batches")} batches)',
             f'ours: warm-ups {meta.get("warmups")}, median of {meta.get("reps")} (dense: 2, median of 10, 5 at 64K)']
    lines = ["; ".join(x for x in setup if x),
             f'Command: `{meta.get("command", "")}`', "",
             "Dense causal, ours / cuDNN in the same round:", "",
             "| D | case | fwd per round | fwd min / median / max | bwd per round | bwd min / median / max | "
             "TFLOP/s ours / cuDNN, fwd and bwd (median of rounds) |",
             "|---|---|---|---|---|---|---|"]

    def rates(x):
        return f'{x["ours_tflops"]["median"]:.0f} / {x["cudnn_tflops"]["median"]:.0f}' if x["ours_tflops"] else "-"
    for d, s in summary["head_dims"].items():
        for n in DENSE:
            f, b = s["dense"][str(n)]["fwd"], s["dense"][str(n)]["bwd"]
            lines.append(f'| {d} | {n // 1024}K | {" ".join(f"{x:.2f}" for x in f["per_round"])} | '
                         f'{_fmt_spread(f["spread"])} | {" ".join(f"{x:.2f}" for x in b["per_round"])} | '
                         f'{_fmt_spread(b["spread"])} | {rates(f)}; {rates(b)} |')
    lines += ["", "CAD's diet: ours / cuDNN's dense 16K rate of the same round, min / median / max over the batches:",
              "",
              "| D | direction | cuDNN 16K TFLOP/s per round | per round | each batch's median over rounds |",
              "|---|---|---|---|---|"]
    for d, s in summary["head_dims"].items():
        for direction in ("fwd", "bwd"):
            x = s["diet"][direction]
            refs = " ".join(f"{r:.0f}" for r in x["reference_tflops_per_round"])
            rounds = "; ".join(_fmt_spread(sp) for sp in x["per_round"])
            lines.append(f"| {d} | {direction} | {refs} | {rounds} | {_fmt_spread(x['batches'])} |")
    lines += ["", "Worst five batches (each batch's median ratio over rounds):", "",
              "| D | direction | batch | ratio | segments | max q | max kv | q rows / kv rows |",
              "|---|---|---|---|---|---|---|---|"]
    for d, s in summary["head_dims"].items():
        for direction in ("fwd", "bwd"):
            for w in s["diet"][direction]["worst"]:
                lines.append(f'| {d} | {direction} | {w["name"]} | {w["ratio"]:.2f} | {w.get("segments", "?")} | '
                             f'{w.get("max_q", "?")} | {w.get("max_kv", "?")} | {w.get("q_rows", "?")} / '
                             f'{w.get("kv_rows", "?")} |')
    for d, s in summary["head_dims"].items():
        if s["skipped"]:
            lines.append(f'\nD={d}: skipped (see the JSON for why): {", ".join(s["skipped"])}')
    met = [t for t in summary["targets"] if t["met"]]
    lines += ["", f"Targets: {len(met)} of {len(summary['targets'])} met", ""]
    for t in summary["targets"]:
        lines.append(f'- {"met" if t["met"] else "NOT met"}: {t["what"]}: {t["value"]:.2f} (goal >= {t["goal"]:.2f})')
    return "\n".join(lines)


# ---- the real timer: torch for cuDNN, the library for ours --------------------------------------------

class KernelLibrary:
    """Our kernels through one build of libcad_kernel_timer.so (ctypes; no torch). Several builds can be
    loaded side by side in one process (ab_bench.py): build_timer.sh links each with -Bsymbolic, so every
    library calls its own kernels."""
    VERSION = 1
    OK, INVALID, NO_MEMORY, CUDA_ERROR = 0, 1, 2, 3

    def __init__(self, lib_path, hq, hkv):
        self.path, self.hq, self.hkv = lib_path, hq, hkv
        self.lib = ctypes.CDLL(os.path.abspath(lib_path))
        if self.lib.cad_kernel_timer_version() != self.VERSION:
            raise RuntimeError(f"{lib_path}: timer version {self.lib.cad_kernel_timer_version()}, expected "
                               f"{self.VERSION} (rebuild it: build_timer.sh)")
        i64, i32 = ctypes.c_int64, ctypes.c_int
        self.lib.cad_kernel_time_case.argtypes = [ctypes.POINTER(i64), i64, i64, i64, i32, i32, i32, i32, i32, i32, i32,
                                                  ctypes.POINTER(ctypes.c_double), ctypes.c_char_p, ctypes.c_size_t]
        self.lib.cad_kernel_time_case.restype = i32
        name, err = ctypes.create_string_buffer(256), ctypes.create_string_buffer(1024)
        sms, hopper = ctypes.c_int(), ctypes.c_int()
        if self.lib.cad_kernel_timer_device(name, 256, ctypes.byref(sms), ctypes.byref(hopper), err, 1024) != 0:
            raise RuntimeError(f"{lib_path}: {err.value.decode()}")
        self.device = f"{name.value.decode()} ({sms.value} SMs, {'wgmma' if hopper.value else 'mma.sync'} kernels)"

    def ours(self, batch, d, warmups, reps):
        """(fwd_ms, bwd_ms) of the batch; SkipCase where it does not fit in device memory."""
        segs = batch["segments"]
        flat = (ctypes.c_int64 * (4 * len(segs)))(*[x for s in segs for x in s])
        out = (ctypes.c_double * 2)()
        err = ctypes.create_string_buffer(2048)
        rc = self.lib.cad_kernel_time_case(flat, len(segs), batch["tq"], batch["tk"], 1, d, self.hq, self.hkv,
                                           warmups, reps, 1, out, err, 2048)
        if rc == self.NO_MEMORY:
            raise SkipCase(err.value.decode())
        if rc != self.OK:
            raise RuntimeError(f'{self.path}: {batch["name"]} at D={d}: {err.value.decode()}')
        return out[0], out[1]


class LibraryTimer:
    """cuDNN through torch (cudnn_bench.cudnn_dense_causal) and our kernels through libcad_kernel_timer."""

    def __init__(self, lib_path, hq, hkv):
        import torch  # noqa: F401  (imported here: the summary code must import without it)
        sys.path.insert(0, HERE)
        import cudnn_bench
        self.torch, self.cudnn_bench = torch, cudnn_bench
        self.hq, self.hkv = hq, hkv
        torch.cuda.init()  # one CUDA context, shared by torch and the library
        self.kernels = KernelLibrary(lib_path, hq, hkv)
        self.device = self.kernels.device

    def software(self):
        t = self.torch
        return f"torch {t.__version__}, cuDNN {t.backends.cudnn.version()}"

    def cudnn_dense(self, n, d):
        return self.cudnn_bench.cudnn_dense_causal(n, d=d, hq=self.hq, hkv=self.hkv)

    def release(self):
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()

    def ours(self, batch, d, warmups, reps):
        return self.kernels.ours(batch, d, warmups, reps)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", required=True, help="libcad_kernel_timer.so (build_timer.sh builds it)")
    ap.add_argument("--batches", default=os.path.join(HERE, "diet_batches.txt"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--hq", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3, help="timed calls per diet batch (median)")
    ap.add_argument("--warmups", type=int, default=1, help="untimed calls per diet batch first")
    ap.add_argument("--deadline", type=float, default=330.0,
                    help="seconds: no round is started that would end after it (the longest round as the guess)")
    ap.add_argument("--filter", default="", help="only the diet batches whose name contains TEXT")
    ap.add_argument("--json")
    ap.add_argument("--md")
    args = ap.parse_args(argv)
    head_dims = [int(x) for x in args.head_dims.split(",")]
    if args.rounds < 1 or args.reps < 1 or args.warmups < 0 or any(d not in (64, 128) for d in head_dims):
        ap.error("expected --rounds >= 1, --reps >= 1, --warmups >= 0 and head dims among 64, 128")
    batches = [b for b in parse_batches(args.batches) if args.filter in b["name"]]
    est = estimate_seconds(batches, head_dims, args.hq, args.rounds, args.reps, args.warmups)
    print(f"{len(batches)} diet batches, head dims {head_dims}, {args.rounds} rounds: about {est:.0f} s of GPU time "
          f"at {ASSUMED_TFLOPS:.0f} TFLOP/s", flush=True)
    timer = LibraryTimer(args.lib, args.hq, args.hkv)
    meta = {"gpu": timer.device, "software": timer.software(), "hq": args.hq, "hkv": args.hkv,
            "batches_file": os.path.relpath(args.batches), "num_batches": len(batches), "reps": args.reps,
            "warmups": args.warmups, "estimate_s": est,
            "command": " ".join([os.path.basename(sys.argv[0])] + (argv or sys.argv[1:]))}

    def save(rounds):
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "rounds": rounds, "summary": summarize(batches, rounds)}, f, indent=1)

    t0 = time.monotonic()
    rounds = run_rounds(batches, head_dims, args.rounds, timer, args.hq, args.reps, args.warmups,
                        deadline_s=args.deadline, on_round=save, log=lambda m: print(m, flush=True))
    meta["wall_s"] = time.monotonic() - t0
    save(rounds)
    text = render_markdown(summarize(batches, rounds), meta)
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
