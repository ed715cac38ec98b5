#!/usr/bin/env python3
"""Sliding-window attention on one GPU: forward and backward time of the project's cuda backend (cad.varlen_attn,
local: no plan, no CAD group) and of torch.nn.attention.varlen.varlen_attn, causal windows (left, 0) and plain
causal attention for reference, at Llama-8B's attention shape (32 query heads, 8 KV heads, D 128, bf16).

Batches: one buffer of the Pretrain recipe (cad.train.recipe.sample_batch over doclen_pretrain.json, the
trainer's first micro-batch for --seed) at each of --contexts tokens, and dense single documents of --dense
tokens. Windows: --windows (left limits; "none" = plain causal is always added).

Implementations (--impls):
  cad           cad.varlen_attn(q, k, v, cu, causal=True, window_size=(left, 0)) on the cuda backend: with a window
                or without, the backend's default kernels (wgmma on sm_90a); the kernels that ran are read from
                the backend's stats.
  cad_portable  the same call with the backend configured {"hopper_kernels": false}: causal only (windowed, the
                portable times are the earlier all-portable cad rows of docs/windows.md), the like-for-like
                reference for the windowed times.
  torch         torch.nn.attention.varlen.varlen_attn(..., window_size=(left, 0)) where this torch takes
                window_size (else 'n/a' with the reason); K/V expanded to 32 heads outside the timing where it
                does not take GQA (as cad.train.attention's torch_varlen does).

FLOPs: a causal query at position p of its document with window left sees min(p + 1, left + 1) keys; forward
4 * D * Hq per (query, key) pair, backward 2.5x forward (the convention of cudnn_bench.py). Timing: CUDA events,
--warmup calls, then the median (and min) of --reps; forward under no_grad, backward = torch.autograd.grad of a
fresh untimed forward. Inputs uniform in [-1, 1). With --check (default) cad and torch are also compared once per
case: max |cad - torch| / max |torch| of O, dQ, dK, dV (a large-scale check of the window kernels).

Every case that fails (an exception, out of memory, a refused argument) is recorded with its error and the run
goes on; results are rewritten after every case, so a crash leaves the cases before it. --budget-s stops starting
new cases after that many seconds (the rest are recorded as skipped).

Without a GPU: --dry-run prints the batches and their FLOP counts (and checks the FLOP formula against a
key-by-key count); --tiny --device cpu runs the whole path on small shapes on the CPU (the reference backend,
wall-clock timing) to check the script itself.

Environment: the package from the source tree and a build: --build DIR sets CAD_HOST_LIBRARY, CAD_PLUGIN_PATH and
PYTHONPATH from DIR (default build-gpu) unless they are set already.

usage: window_bench.py [--out results.json] [--build build-gpu] [--windows 4096,8192] [--contexts 65536,131072]
                       [--dense 16384,32768,65536] [--impls cad,cad_portable,torch] [--reps 10] [--warmup 3]
                       [--budget-s 360] [--no-check] [--dry-run] [--tiny] [--device cuda|cpu]
"""
import argparse
import inspect
import json
import os
import pathlib
import platform
import statistics
import sys
import time
import traceback

REPO = pathlib.Path(__file__).resolve().parents[2]
HQ, HKV, D = 32, 8, 128  # Llama-3 8B attention
TINY = dict(hq=4, hkv=2, d=64, windows=[32, 100], contexts=[2048], dense=[256, 700])


# ---- batches and FLOPs (no torch needed) --------------------------------------------------------------------
def causal_pairs(n, left=None):
    """(query, key) pairs of one causal document of n tokens whose queries see at most left + 1 keys (their own
    and the left before it); left None or < 0: no limit. Query p sees min(p + 1, left + 1) keys."""
    if left is None or left < 0 or left + 1 >= n:
        return n * (n + 1) // 2
    m = left + 1
    return m * (m + 1) // 2 + (n - m) * m


def causal_pairs_by_key(n, left=None):
    """causal_pairs counted key by key (the check of the formula)."""
    total = 0
    for p in range(n):
        for j in range(p + 1):
            if left is None or left < 0 or j >= p - left:
                total += 1
    return total


def flops(lengths, left, hq, d):
    """(forward, backward) FLOPs of a batch of causal documents."""
    fwd = 4.0 * d * hq * sum(causal_pairs(n, left) for n in lengths)
    return fwd, 2.5 * fwd


def load_recipe():
    """cad.train.recipe's sample_batch (the DistCA recipe, as the trainers and `cad demo` sample it)."""
    from cad.train.recipe import sample_batch
    return sample_batch


def data_path(given):
    if given:
        return pathlib.Path(given)
    for p in (os.environ.get("CAD_DATA"), REPO.parent / "shared" / "data" / "doclen_pretrain.json",
              REPO / ".bench_data" / "doclen_pretrain.json"):
        if p and pathlib.Path(p).is_file():
            return pathlib.Path(p)
    return None


def make_batches(args):
    """[(name, lengths or None, error or None)]: the Pretrain buffers, then the dense documents."""
    out = []
    path = data_path(args.data)
    lengths, why = None, None
    if args.contexts:
        if path is None:
            why = "no doclen_pretrain.json (give --data, or set CAD_DATA)"
        else:
            try:
                lengths = json.loads(path.read_text())
                sample_batch = load_recipe()
            except Exception as e:  # noqa: BLE001 -- reported per batch
                why = f"reading {path}: {type(e).__name__}: {e}"
    for ctx in args.contexts:
        name = f"pretrain_{ctx // 1024}k"
        if why:
            out.append((name, None, why))
            continue
        out.append((name, sample_batch(lengths, ctx, 1, args.seed)[0], None))
    for n in args.dense:
        out.append((f"dense_{n // 1024}k" if n % 1024 == 0 else f"dense_{n}", [n], None))
    return out


# ---- the implementations ----------------------------------------------------------------------------------
class NotApplicable(Exception):
    """A case this implementation does not run (reported 'n/a' with the reason, not as a failure)."""


def setup_environment(build):
    build = (REPO / build) if not pathlib.Path(build).is_absolute() else pathlib.Path(build)
    os.environ.setdefault("CAD_HOST_LIBRARY", str(build / "lib" / "libcad_host.so"))
    os.environ.setdefault("CAD_PLUGIN_PATH", str(build / "lib" / "cad" / "plugins"))
    os.environ.setdefault("CAD_LOG_LEVEL", "warn")
    sys.path.insert(0, str(REPO / "host_adapter" / "python"))


class CadImpl:
    """cad.varlen_attn, local (no plan): the device's backend; portable: the cuda backend without wgmma kernels."""

    def __init__(self, device, portable):
        import cad
        from cad import _runtime
        self.cad, self.runtime, self.device, self.portable = cad, _runtime, device, portable
        self.name = "cad_portable" if portable else "cad"
        self.host = None
        if portable:
            if device.type != "cuda":
                self.unavailable = "the portable kernels are the cuda backend's (this run is on the CPU)"
                return
            from cad._host import Host
            self.host = Host({"log_level": "warn", "instances": [{"name": "local", "plugin": "cuda",
                                                                  "config": {"hopper_kernels": False}}],
                              "attention": "local"}, "local")
        self.unavailable = None

    def prepare(self, q, k, v, cu, longest, left):
        if self.unavailable:
            raise NotApplicable(self.unavailable)
        if self.portable and left is not None:
            raise NotApplicable("windowed portable: see docs/windows.md (not rerun, to keep the run short)")
        window = (left, 0) if left is not None else (-1, -1)
        return (q, k, v), (lambda a, b, c: self.cad.varlen_attn(a, b, c, cu, causal=True, window_size=window)), ""

    def __enter__(self):
        # The local backend of this device is a cached Host: the portable one stands in for it during a case.
        if self.host is not None:
            key = self.runtime._key(self.device)
            self.saved = self.runtime._locals.get(key)
            self.runtime._locals[key] = self.host
        return self

    def __exit__(self, *exc):
        if self.host is not None:
            key = self.runtime._key(self.device)
            if self.saved is None:
                self.runtime._locals.pop(key, None)
            else:
                self.runtime._locals[key] = self.saved

    def kernels(self):
        host = self.host or self.runtime.local_backend(self.device)
        try:
            s = host.stats()
        except Exception:  # noqa: BLE001 -- stats are informative only
            return ""
        if "forward_kernel" not in s:
            return ""
        return f"fwd {s['forward_kernel']}, bwd {s.get('backward_kernel', '?')}"


class TorchImpl:
    name = "torch"

    def __init__(self, device):
        import torch
        self.torch = torch
        try:
            from torch.nn.attention.varlen import varlen_attn
        except ImportError:
            varlen_attn = None
        self.fn = varlen_attn
        self.params = set(inspect.signature(varlen_attn).parameters) if varlen_attn else set()
        self.gqa = None  # whether this torch's varlen_attn took GQA (found on the first case)
        if varlen_attn is None:
            self.unavailable = f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn"
        elif device.type != "cuda":
            self.unavailable = "torch's varlen_attn runs on CUDA only (this run is on the CPU)"
        else:
            self.unavailable = None

    def signature(self):
        return "n/a" if self.fn is None else str(inspect.signature(self.fn))

    def prepare(self, q, k, v, cu, longest, left):
        if self.unavailable:
            raise NotApplicable(self.unavailable)
        options = {}
        if "window_size" in self.params:
            options["window_size"] = (left, 0) if left is not None else (-1, 0)
        elif left is not None:
            raise NotApplicable(f"torch {self.torch.__version__}'s varlen_attn takes no window_size "
                                f"(signature {self.signature()})")
        else:
            options["is_causal"] = True  # torch 2.9/2.10

        def call(a, b, c, extra=None):
            return self.fn(a, b, c, cu, cu, longest, longest, **options, **(extra or {}))

        if self.gqa is not False:
            extra = {"enable_gqa": True} if "enable_gqa" in self.params else {}
            try:
                with self.torch.no_grad():
                    call(q, k, v, extra)
                self.torch.cuda.synchronize()
                self.gqa = True
                return (q, k, v), (lambda a, b, c: call(a, b, c, extra)), "gqa"
            except Exception as e:  # noqa: BLE001 -- then with K/V expanded
                self.gqa_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
                self.gqa = False
        g = q.shape[1] // k.shape[1]
        ke = k.detach().repeat_interleave(g, dim=1).requires_grad_(True)
        ve = v.detach().repeat_interleave(g, dim=1).requires_grad_(True)
        return (q, ke, ve), call, f"K/V expanded to {q.shape[1]} heads (GQA refused: {self.gqa_error})"


# ---- timing -------------------------------------------------------------------------------------------------
def timer(torch, device):
    """A function timing fn() in ms: CUDA events on a GPU, wall clock (after a synchronize) on the CPU."""
    if device.type == "cuda":
        def run(fn):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b)
    else:
        def run(fn):
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
    return run


def measure(torch, device, fn, inputs, d_o, warmup, reps):
    """{fwd_ms, fwd_min_ms, bwd_ms, bwd_min_ms}: medians and minima over reps, after warmup calls."""
    run = timer(torch, device)

    def forward():
        with torch.no_grad():
            fn(*inputs)

    def backward_once():
        o = fn(*inputs)
        sync(torch, device)
        return run(lambda: torch.autograd.grad(o, inputs, d_o))

    for _ in range(warmup):
        forward()
    sync(torch, device)
    fwd = [run(forward) for _ in range(reps)]
    for _ in range(max(1, warmup - 1)):
        o = fn(*inputs)
        torch.autograd.grad(o, inputs, d_o)
    sync(torch, device)
    bwd = [backward_once() for _ in range(reps)]
    return {"fwd_ms": statistics.median(fwd), "fwd_min_ms": min(fwd), "bwd_ms": statistics.median(bwd),
            "bwd_min_ms": min(bwd)}


def sync(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def outputs(torch, fn, inputs, d_o, hkv):
    """O, dQ, dK, dV of one call, K/V gradients summed back to hkv heads where they were expanded."""
    o = fn(*inputs)
    grads = torch.autograd.grad(o, inputs, d_o)
    out = [o.detach()] + [g.detach() for g in grads]
    for i in (2, 3):
        t = out[i]
        if t.shape[1] != hkv:
            out[i] = t.float().view(t.shape[0], hkv, t.shape[1] // hkv, t.shape[2]).sum(2).to(t.dtype)
    return out


def relative_errors(got, want):
    return {name: float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6))
            for name, a, b in zip(("o", "dq", "dk", "dv"), got, want)}


def short_error(e):
    text = f"{type(e).__name__}: {e}".strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


# ---- output -------------------------------------------------------------------------------------------------
def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def markdown(result):
    m = result["meta"]
    lines = [f"# Sliding-window attention, one GPU ({m['device_name']})", "",
             f"Hq={m['hq']} Hkv={m['hkv']} D={m['d']} bf16, causal; torch {m['torch']}, cuda {m['torch_cuda']}; "
             f"median of {m['reps']} after {m['warmup']} warm-ups ({m['timing']}); FLOPs with the window "
             f"(query p sees min(p+1, left+1) keys), backward 2.5x forward. torch varlen_attn: {m['torch_varlen']}.",
             "", "| batch | docs | max doc | window | impl | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | "
             "vs causal (fwd/bwd) | kernels / note |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    causal = {(r["batch"], r["impl"]): r for r in result["rows"] if r["window"] is None and r["status"] == "ok"}
    for r in result["rows"]:
        w = "causal" if r["window"] is None else f"({r['window']}, 0)"
        speed = "-"
        base = causal.get((r["batch"], r["impl"]))
        if r["window"] is not None and base and r["status"] == "ok":
            speed = f"{base['fwd_ms'] / r['fwd_ms']:.2f}x / {base['bwd_ms'] / r['bwd_ms']:.2f}x"
        if r["status"] == "ok":
            note = "; ".join(x for x in (r.get("kernels"), r.get("note")) if x)
            lines.append(f"| {r['batch']} | {r['docs']} | {r['max_doc']} | {w} | {r['impl']} | {r['fwd_ms']:.3f} | "
                         f"{r['fwd_tflops']:.1f} | {r['bwd_ms']:.3f} | {r['bwd_tflops']:.1f} | {speed} | {note} |")
        else:
            lines.append(f"| {r['batch']} | {fmt(r.get('docs'), 'd')} | {fmt(r.get('max_doc'), 'd')} | {w} | "
                         f"{r['impl']} | {r['status']} | | | | | {r.get('error', '')} |")
    checks = [c for c in result["checks"]]
    if checks:
        lines += ["", "cad vs torch, max |cad - torch| / max |torch| (one call of each on the same inputs):", "",
                  "| batch | window | O | dQ | dK | dV | note |", "|---|---|---|---|---|---|---|"]
        for c in checks:
            w = "causal" if c["window"] is None else f"({c['window']}, 0)"
            e = c.get("errors")
            if e:
                lines.append(f"| {c['batch']} | {w} | {e['o']:.2e} | {e['dq']:.2e} | {e['dk']:.2e} | {e['dv']:.2e} | "
                             f"{'ok' if max(e.values()) < 2e-2 else 'LARGE'} |")
            else:
                lines.append(f"| {c['batch']} | {w} | | | | | {c.get('error', '')} |")
    lines += ["", f"{m['elapsed_s']:.0f} s; command: `{m['command']}`"]
    return "\n".join(lines) + "\n"


def write(result, out):
    if out is None:
        return
    out = pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    json_path = out if out.suffix != ".md" else out.with_suffix(".json")
    md_path = out.with_suffix(".md") if out.suffix != ".md" else out
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    md_path.write_text(markdown(result))


# ---- main ---------------------------------------------------------------------------------------------------
def int_list(text):
    return [int(x) for x in text.split(",") if x.strip()] if text else []


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See the module docstring (head of this file) for what is measured and how.")
    p.add_argument("--out", help="results: JSON at this path and markdown beside it (.md), or the other way round "
                                 "when it ends in .md")
    p.add_argument("--build", default=os.environ.get("BUILD", "build-gpu"),
                   help="build tree with libcad_host and the plugins (default build-gpu, relative to the repository)")
    p.add_argument("--windows", type=int_list, default=None, help="comma-separated left limits (default 4096,8192)")
    p.add_argument("--contexts", type=int_list, default=None,
                   help="Pretrain buffer sizes in tokens (default 65536,131072; '' for none)")
    p.add_argument("--dense", type=int_list, default=None,
                   help="dense single-document lengths (default 16384,32768,65536; '' for none)")
    p.add_argument("--impls", default="cad,cad_portable,torch", help="any of cad, cad_portable, torch")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=1, help="recipe seed (the trainer's first micro-batch for its --seed)")
    p.add_argument("--data", help="doclen_pretrain.json (default $CAD_DATA, ../shared/data, .bench_data)")
    p.add_argument("--budget-s", type=float, default=360.0, help="start no new case after this many seconds")
    p.add_argument("--no-check", dest="check", action="store_false", help="skip the cad vs torch comparison")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true",
                   help=f"small shapes (Hq={TINY['hq']} Hkv={TINY['hkv']} D={TINY['d']}, windows {TINY['windows']}, "
                        f"a {TINY['contexts'][0]}-token Pretrain buffer, dense {TINY['dense']}) unless given")
    p.add_argument("--dry-run", action="store_true",
                   help="no tensors: print the batches and FLOP counts, check the FLOP formula, write --out")
    args = p.parse_args(argv)
    tiny = TINY if args.tiny else dict(hq=HQ, hkv=HKV, d=D, windows=[4096, 8192], contexts=[65536, 131072],
                                       dense=[16384, 32768, 65536])
    args.hq, args.hkv, args.d = tiny["hq"], tiny["hkv"], tiny["d"]
    for key in ("windows", "contexts", "dense"):
        if getattr(args, key) is None:
            setattr(args, key, tiny[key])
    args.impls = [x.strip() for x in args.impls.split(",") if x.strip()]
    bad = [x for x in args.impls if x not in ("cad", "cad_portable", "torch")]
    if bad:
        p.error(f"--impls: unknown {bad}")
    if args.reps < 1 or args.warmup < 0:
        p.error("--reps must be >= 1 and --warmup >= 0")
    if any(w < 0 for w in args.windows):
        p.error("--windows: left limits are >= 0 (plain causal is always included)")
    return args


def check_flop_formula():
    for n in (1, 2, 3, 7, 64, 129):
        for left in (None, 0, 1, 5, 63, 64, 200):
            a, b = causal_pairs(n, left), causal_pairs_by_key(n, left)
            if a != b:
                raise AssertionError(f"causal_pairs({n}, {left}) = {a}, counted {b}")


def main(argv=None):
    args = parse_args(argv)
    started = time.time()
    command = " ".join([os.path.relpath(__file__, REPO)] + (argv if argv is not None else sys.argv[1:]))
    batches = make_batches(args)
    windows = [None] + args.windows
    meta = {"command": command, "hq": args.hq, "hkv": args.hkv, "d": args.d, "reps": args.reps,
            "warmup": args.warmup, "seed": args.seed, "data": str(data_path(args.data)), "host": platform.node(),
            "device_name": "-", "torch": "-", "torch_cuda": "-", "torch_varlen": "-", "timing": "-", "elapsed_s": 0}
    meta["batches"] = {name: lengths for name, lengths, _ in batches if lengths}
    result = {"meta": meta, "rows": [], "checks": []}

    if args.dry_run:
        check_flop_formula()
        print("FLOP formula: matches the key-by-key count")
        print(f"{'batch':>14} {'docs':>5} {'tokens':>7} {'max doc':>7}  " +
              "  ".join(f"{'causal' if w is None else f'w={w}':>10}" for w in windows) + "   (forward TFLOP)")
        for name, lengths, why in batches:
            if why:
                print(f"{name:>14}  not sampled: {why}")
                result["rows"].append({"batch": name, "window": None, "impl": "-", "status": "error", "error": why})
                continue
            fw = [flops(lengths, w, args.hq, args.d)[0] for w in windows]
            print(f"{name:>14} {len(lengths):5d} {sum(lengths):7d} {max(lengths):7d}  " +
                  "  ".join(f"{x / 1e12:10.3f}" for x in fw))
            for w, f in zip(windows, fw):
                result["rows"].append({"batch": name, "docs": len(lengths), "tokens": sum(lengths),
                                       "max_doc": max(lengths), "lengths": lengths, "window": w, "impl": "-",
                                       "status": "dry-run", "fwd_flops": f, "bwd_flops": 2.5 * f})
        meta["elapsed_s"] = time.time() - started
        if args.out:
            pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        return 0

    setup_environment(args.build)
    import torch
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu (with --tiny) or --dry-run", file=sys.stderr)
        return 2
    meta.update(torch=torch.__version__, torch_cuda=str(torch.version.cuda),
                device_name=torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
                timing="CUDA events" if device.type == "cuda" else "wall clock",
                cad_host_library=os.environ.get("CAD_HOST_LIBRARY"))
    impls = []
    for name in args.impls:
        try:
            impls.append(TorchImpl(device) if name == "torch" else CadImpl(device, portable=name == "cad_portable"))
        except Exception as e:  # noqa: BLE001 -- the other implementations still run
            print(f"{name}: cannot set up: {short_error(e)}", flush=True)
            result["rows"].append({"batch": "-", "window": None, "impl": name, "status": "error",
                                   "error": f"setup: {short_error(e)}"})
    torch_impl = next((i for i in impls if i.name == "torch"), None)
    meta["torch_varlen"] = ((torch_impl.unavailable or f"signature {torch_impl.signature()}") if torch_impl
                            else "not run")
    print(f"{meta['device_name']}; torch {meta['torch']}; varlen_attn: {meta['torch_varlen']}", flush=True)
    dtype = torch.bfloat16

    for name, lengths, why in batches:
        if why:
            for w in windows:
                result["rows"].append({"batch": name, "window": w, "impl": "-", "status": "error", "error": why})
            print(f"{name}: {why}", flush=True)
            continue
        tokens = sum(lengths)
        cu = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))], dtype=torch.int32,
                          device=device)
        gen = torch.Generator(device=device).manual_seed(args.seed * 7919 + tokens)

        def rand(h):
            return (torch.rand(tokens, h, args.d, generator=gen, device=device) * 2 - 1).to(dtype)
        try:
            q, k, v = (rand(h).requires_grad_(True) for h in (args.hq, args.hkv, args.hkv))
            d_o = rand(args.hq)
        except Exception as e:  # noqa: BLE001
            for w in windows:
                result["rows"].append({"batch": name, "window": w, "impl": "-", "status": "error",
                                       "error": f"inputs: {short_error(e)}"})
            continue
        for w in windows:
            fwd_flops, bwd_flops = flops(lengths, w, args.hq, args.d)
            kept = {}
            for impl in impls:
                row = {"batch": name, "docs": len(lengths), "tokens": tokens, "max_doc": max(lengths), "window": w,
                       "impl": impl.name, "fwd_flops": fwd_flops, "bwd_flops": bwd_flops}
                label = f"{name} window={'causal' if w is None else w} {impl.name}"
                if time.time() - started > args.budget_s:
                    row.update(status="skipped", error=f"past --budget-s {args.budget_s:.0f}")
                    result["rows"].append(row)
                    print(f"{label}: skipped (budget)", flush=True)
                    continue
                try:
                    with (impl if isinstance(impl, CadImpl) else _Null()):
                        inputs, fn, note = impl.prepare(q, k, v, cu, max(lengths), w)
                        t = measure(torch, device, fn, inputs, d_o, args.warmup, args.reps)
                        kernels = impl.kernels() if isinstance(impl, CadImpl) else ""
                        if args.check and impl.name in ("cad", "torch"):
                            kept[impl.name] = outputs(torch, fn, inputs, d_o, args.hkv)
                    row.update(status="ok", note=note, kernels=kernels, **t,
                               fwd_tflops=fwd_flops / (t["fwd_ms"] * 1e-3) / 1e12,
                               bwd_tflops=bwd_flops / (t["bwd_ms"] * 1e-3) / 1e12)
                    print(f"{label}: fwd {t['fwd_ms']:.3f} ms ({row['fwd_tflops']:.1f} TFLOP/s), bwd "
                          f"{t['bwd_ms']:.3f} ms ({row['bwd_tflops']:.1f} TFLOP/s) {kernels} {note}", flush=True)
                except NotApplicable as e:
                    row.update(status="n/a", error=str(e))
                    print(f"{label}: n/a ({e})", flush=True)
                except Exception as e:  # noqa: BLE001 -- reported, the run goes on
                    row.update(status="error", error=short_error(e))
                    print(f"{label}: ERROR {short_error(e)}", flush=True)
                    traceback.print_exc()
                    if device.type == "cuda":
                        try:
                            torch.cuda.synchronize()
                            torch.cuda.empty_cache()
                        except Exception as e2:  # noqa: BLE001 -- a broken context: the next cases say so
                            print(f"  after the error: {short_error(e2)}", flush=True)
                result["rows"].append(row)
                meta["elapsed_s"] = time.time() - started
                write(result, args.out)
            if args.check and {"cad", "torch"} <= {i.name for i in impls}:
                check = {"batch": name, "window": w}
                if "cad" in kept and "torch" in kept:
                    try:
                        check["errors"] = relative_errors(kept["cad"], kept["torch"])
                        print(f"{name} window={'causal' if w is None else w} cad vs torch: " +
                              " ".join(f"{k} {x:.2e}" for k, x in check["errors"].items()), flush=True)
                    except Exception as e:  # noqa: BLE001
                        check["error"] = short_error(e)
                else:
                    check["error"] = "not both ran"
                result["checks"].append(check)
            kept.clear()
        del q, k, v, d_o
        if device.type == "cuda":
            torch.cuda.empty_cache()
    meta["elapsed_s"] = time.time() - started
    write(result, args.out)
    print(markdown(result))
    failed = [r for r in result["rows"] if r["status"] == "error"]
    print(f"{len(result['rows'])} rows, {len(failed)} errors, {meta['elapsed_s']:.0f} s", flush=True)
    return 0


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    sys.exit(main())
