#!/usr/bin/env python3
"""The local attention kernels a user can install, beside ours, on the same buffers: FlashAttention-4, FA3's
forward, torch's varlen_attn, FlexAttention and cuDNN, forward and backward apart, medians of interleaved rounds, each as a
ratio to our kernel, and how far each one's outputs are from ours.

Implementations (--impls):
  ours   cad.varlen_attn(q, k, v, cu, causal=True, window_size=...) on the device's local backend (the cuda
         plugin: the sm_90a kernels on Hopper), as window_bench.py's "cad".
  fa4    cad.fa4.varlen_attn (flash-attn-4's flash_attn.cute.flash_attn_varlen_func), windows included.
  fa3    fa3-fwd's flash_attn_varlen_func (the only FA3 wheel on PyPI: forward only, built without windows).
  torch  torch.nn.attention.varlen.varlen_attn (FA2 inside on torch 2.11), as window_bench.py's "torch".
  cudnn  torch's scaled_dot_product_attention with the cuDNN backend, one document at a time (no window there);
         K/V expanded to every query head outside the timing where it refuses GQA.
  flex   torch.nn.attention.flex_attention (compiled), the packed buffer in one call with a document-causal block
         mask (and the window's left edge), GQA through enable_gqa.
An implementation that is not installed, or does not run a case (a window, a backward), is reported 'n/a'
with the reason; one that fails is recorded with its error and the run goes on.

Cases (D 128 and D 64, --head-dims; Hq 32, Hkv 8, bf16, causal): --buffers Pretrain buffers (the trainer's
recipe, cad.train.recipe.sample_batch over doclen_pretrain.json: one step's buffers of --buffers ranks)
at each of --contexts tokens, one dense document of each of --dense tokens, and with a causal window
(--window, left) the Pretrain buffers and the dense documents of --window-dense. A case of several buffers
counts their time and FLOPs together.

Timing: CUDA events. Every round times every case with every implementation, the order of the implementations
rotating by round; within a round an implementation runs --warmup untimed calls per buffer (first round only:
that is where FA4 compiles), then --reps forward calls (no_grad) and --reps backward calls
(torch.autograd.grad of a fresh untimed forward), and keeps their medians. Reported: the median over rounds.
FLOPs: a causal query at position p with window left sees min(p + 1, left + 1) keys; forward 4 * D * Hq per
(query, key) pair, backward 2.5x forward (window_bench.py's flops, the convention of every kernel table here).
Ratios are time / ours' time: below 1 is faster than ours.

Outputs (first round, first buffer of each case): the relative Frobenius difference ||x - ours|| / ||ours|| of
O, dQ, dK, dV (K/V gradients of expanded heads summed back), all from the same inputs and dO (uniform in
[-1, 1)).

--budget-s: no round starts that would end past it (the guess: the last round's time less its warm-up calls and
output checks, which only the first round makes; see next_round_guess); results are
rewritten after every round. --dry-run prints the cases and their FLOPs (no GPU, no torch needed).

usage: fa_anchor_bench.py [--out results.json] [--build build-gpu] [--impls ours,fa4,fa3,torch,cudnn,flex]
                          [--head-dims 128,64] [--contexts 65536,131072] [--buffers 4] [--dense 16384,65536]
                          [--window 4096] [--window-dense 65536] [--rounds 3] [--reps 3] [--warmup 2]
                          [--budget-s 420] [--dry-run] [--data doclen_pretrain.json]
"""
import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time
import traceback

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import window_bench as wb  # noqa: E402  (batches, FLOPs, the ours/torch implementations: one definition each)

REPO = wb.REPO
HQ, HKV = 32, 8
IMPLS = ("ours", "fa4", "fa3", "torch", "cudnn", "flex")
NotApplicable = wb.NotApplicable


# ---- cases ---------------------------------------------------------------------------------------------------
def make_cases(args):
    """[{"name", "window", "buffers": [lengths], "error"}]: Pretrain buffers, dense documents, then windowed."""
    pretrain, why = {}, None
    if args.contexts:
        path = wb.data_path(args.data)
        if path is None:
            why = "no doclen_pretrain.json (give --data, or set CAD_DATA)"
        else:
            try:
                lengths = json.loads(path.read_text())
                sample_batch = wb.load_recipe()
                pretrain = {ctx: sample_batch(lengths, ctx, args.buffers, args.seed) for ctx in args.contexts}
            except Exception as e:  # noqa: BLE001 -- reported per case
                why = f"sampling the Pretrain buffers from {path}: {wb.short_error(e)}"
    cases = []

    def add(name, window, buffers):
        cases.append({"name": name, "window": window, "buffers": buffers, "error": why if buffers is None else None})

    for window in [None] + ([args.window] if args.window is not None else []):
        tag = "" if window is None else f", window {window}"
        for ctx in args.contexts:
            add(f"{args.buffers} Pretrain buffers of {ctx // 1024}K{tag}", window, pretrain.get(ctx))
        for n in (args.dense if window is None else args.window_dense):
            add(f"one document of {n // 1024 if n % 1024 == 0 else n}{'K' if n % 1024 == 0 else ''}{tag}", window,
                [[n]])
    return cases


def case_flops(case, hq, d):
    fwd = sum(wb.flops(lengths, case["window"], hq, d)[0] for lengths in case["buffers"])
    return fwd, 2.5 * fwd


# ---- implementations beyond window_bench's ----------------------------------------------------------------------
class Ours(wb.CadImpl):
    name = "ours"
    backward = True

    def __init__(self, device):
        super().__init__(device, portable=False)
        self.name = "ours"  # CadImpl names itself "cad"


class Torch(wb.TorchImpl):
    backward = True


class Fa4:
    name = "fa4"
    backward = True

    def __init__(self, device):
        sys.path.insert(0, str(REPO / "host_adapter" / "python"))
        import cad.fa4
        self.fa4 = cad.fa4
        ok, why = cad.fa4.available(device)
        self.unavailable = None if ok else why
        self.version = cad.fa4.version()

    def prepare(self, q, k, v, cu, longest, left):
        if self.unavailable:
            raise NotApplicable(self.unavailable)
        window = (left, 0) if left is not None else (-1, -1)
        return (q, k, v), (lambda a, b, c: self.fa4.varlen_attn(a, b, c, cu, longest, causal=True,
                                                                 window_size=window)), ""


class Fa3:
    """fa3-fwd: FlashAttention-3's forward (the wheel is built with FLASHATTENTION_DISABLE_BACKWARD and _LOCAL)."""
    name = "fa3"
    backward = False

    def __init__(self, device):
        self.unavailable, self.fn = None, None
        try:
            import fa3_fwd_interface
            self.fn = fa3_fwd_interface.flash_attn_varlen_func
        except Exception as e:  # noqa: BLE001 -- not installed: every case says so
            self.unavailable = f"fa3_fwd_interface not importable ({wb.short_error(e)}; pip install fa3-fwd)"
        if device.type != "cuda":
            self.unavailable = "fa3-fwd runs on CUDA only"

    def prepare(self, q, k, v, cu, longest, left):
        if self.unavailable:
            raise NotApplicable(self.unavailable)
        if left is not None:
            raise NotApplicable("fa3-fwd 0.0.3 is built without local (windowed) attention")

        def call(a, b, c):
            out = self.fn(a, b, c, cu, cu, longest, longest, causal=True)
            return out[0] if isinstance(out, (tuple, list)) else out
        return (q, k, v), call, "forward only"


class Cudnn:
    """SDPA with the cuDNN backend, document by document, [1, H, L, D] views of the THD tensors."""
    name = "cudnn"
    backward = True

    def __init__(self, device):
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        import torch.nn.functional as F
        self.torch, self.F, self.kernel, self.backend = torch, F, sdpa_kernel, SDPBackend.CUDNN_ATTENTION
        self.gqa = None
        self.unavailable = None if device.type == "cuda" else "cuDNN attention runs on CUDA only"

    def _call(self, docs, gqa):
        torch, F = self.torch, self.F

        def call(a, b, c):
            outs = []
            with self.kernel(self.backend):
                for s, e in docs:
                    def view(t):
                        return t[s:e].transpose(0, 1).unsqueeze(0)
                    o = F.scaled_dot_product_attention(view(a), view(b), view(c), is_causal=True, enable_gqa=gqa)
                    outs.append(o[0].transpose(0, 1))
            return torch.cat(outs)
        return call

    def prepare(self, q, k, v, cu, longest, left):
        if self.unavailable:
            raise NotApplicable(self.unavailable)
        if left is not None:
            raise NotApplicable("cuDNN SDPA takes no sliding window here")
        offsets = cu.tolist()
        docs = [(a, b) for a, b in zip(offsets, offsets[1:]) if b > a]
        if self.gqa is not False:
            try:
                with self.torch.no_grad():
                    self._call(docs, True)(q, k, v)
                self.torch.cuda.synchronize()
                self.gqa = True
                return (q, k, v), self._call(docs, True), "gqa"
            except Exception as e:  # noqa: BLE001 -- then with K/V expanded
                self.gqa_error = wb.short_error(e)[:200]
                self.gqa = False
        g = q.shape[1] // k.shape[1]
        ke = k.detach().repeat_interleave(g, dim=1).requires_grad_(True)
        ve = v.detach().repeat_interleave(g, dim=1).requires_grad_(True)
        return (q, ke, ve), self._call(docs, False), f"K/V expanded (GQA refused: {self.gqa_error})"


class Flex:
    """torch's FlexAttention: one [1, H, T, D] call over the packed buffer with a block mask that keeps each query to
    its own document's keys at or before it (and, with a window, the `left` before it), GQA through enable_gqa.
    flex_attention is compiled once per process (torch.compile; each new buffer length compiles again, in the
    untimed warmup); the block mask is made in prepare, outside the timing (on the GPU by create_block_mask's
    compiled, blockwise evaluation)."""
    name = "flex"
    backward = True

    def __init__(self, device):
        import torch
        self.torch = torch
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        except ImportError as e:
            self.unavailable = f"torch {torch.__version__} has no FlexAttention ({wb.short_error(e)})"
            return
        self.unavailable = None
        self.create_block_mask = create_block_mask
        # Buffer lengths x head dims x directions are a dozen graphs or more: above dynamo's default of 8.
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        self.flex = torch.compile(flex_attention, dynamic=False)

    def block_mask(self, cu, left, device):
        torch = self.torch
        tokens = int(cu[-1])
        lengths = (cu[1:] - cu[:-1]).to(torch.int64)
        doc = torch.repeat_interleave(torch.arange(lengths.numel(), device=device), lengths.to(device))

        def mask(b, h, q_idx, kv_idx):
            keep = (doc[q_idx] == doc[kv_idx]) & (kv_idx <= q_idx)
            return keep & (q_idx - kv_idx <= left) if left is not None else keep
        # On the GPU the mask is evaluated block by block (compiled): evaluated at once, it is tokens x tokens
        # (128 GiB of intermediates for a 128K buffer).
        return self.create_block_mask(mask, None, None, tokens, tokens, device=device, _compile=device.type == "cuda")

    def prepare(self, q, k, v, cu, longest, left):
        if self.unavailable:
            raise NotApplicable(self.unavailable)
        block_mask = self.block_mask(cu, left, q.device)

        def call(a, b, c):
            def bhsd(t):
                return t.transpose(0, 1).unsqueeze(0)
            return self.flex(bhsd(a), bhsd(b), bhsd(c), block_mask=block_mask, enable_gqa=True)[0].transpose(0, 1)
        return (q, k, v), call, "compiled, block mask"


def make_impl(name, device):
    return {"ours": Ours, "fa4": Fa4, "fa3": Fa3, "torch": Torch, "cudnn": Cudnn, "flex": Flex}[name](device)


# ---- timing ------------------------------------------------------------------------------------------------------
def measure(torch, device, fn, inputs, d_o, warmup, reps, backward, clock=None):
    """(forward ms, backward ms or None): medians of reps CUDA-event timings after warmup untimed calls (their wall
    seconds added to clock["once_s"] where a clock is given: the first round's compiles happen there)."""
    timed = wb.timer(torch, device)

    def forward():
        with torch.no_grad():
            fn(*inputs)

    start = time.time()
    for _ in range(warmup):
        if backward:
            torch.autograd.grad(fn(*inputs), inputs, d_o)
        else:
            forward()
    wb.sync(torch, device)
    if clock is not None and warmup > 0:
        clock["once_s"] = clock.get("once_s", 0.0) + time.time() - start
    fwd = statistics.median(timed(forward) for _ in range(reps))
    if not backward:
        return fwd, None
    bwd = []
    for _ in range(reps):
        o = fn(*inputs)
        wb.sync(torch, device)
        bwd.append(timed(lambda o=o: torch.autograd.grad(o, inputs, d_o)))
    return fwd, statistics.median(bwd)


def frobenius(got, want):
    """||got - want|| / ||want|| per tensor pair (float64 sums)."""
    return [float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)) for a, b in zip(got, want)]


def outputs(torch, impl, fn, inputs, d_o, hkv):
    if impl.backward:
        return wb.outputs(torch, fn, inputs, d_o, hkv)
    with torch.no_grad():
        return [fn(*inputs).detach()]


# ---- the run -------------------------------------------------------------------------------------------------------
def next_round_guess(round_s, once_s):
    """Seconds the next round should take: the last one's without its one-time work (the first round's warm-up
    calls, where compiles happen, and output checks), which later rounds do not repeat; never below a tenth of the
    last round (the rest of the compile cost hides in the first timed calls)."""
    return max(round_s - once_s, 0.1 * round_s)


def run_round(torch, state, r, args, log):
    """One round over head dims x cases x implementations (rotated by r); fills state["rounds"][r] and returns the
    seconds of its one-time work (warm-up calls and output checks: the first round's only)."""
    impls = state["impls"]
    order = impls[r % len(impls):] + impls[:r % len(impls)]
    rnd = {}
    clock = {"once_s": 0.0}
    device = state["device"]
    for d in args.head_dims:
        for case in state["cases"]:
            if case["error"]:
                continue
            key = f"D{d} | {case['name']}"
            tensors = state["tensors"].setdefault(d, {}).get(case["name"])
            if tensors is None:
                tensors = []
                for i, lengths in enumerate(case["buffers"]):
                    tokens = sum(lengths)
                    gen = torch.Generator(device=device).manual_seed(args.seed * 7919 + 31 * tokens + i + d)

                    def rand(h):
                        return (torch.rand(tokens, h, d, generator=gen, device=device) * 2 - 1).to(torch.bfloat16)
                    q, k, v = (rand(h).requires_grad_(True) for h in (HQ, HKV, HKV))
                    cu = torch.tensor([0] + [sum(lengths[:j + 1]) for j in range(len(lengths))], dtype=torch.int32,
                                      device=device)
                    tensors.append((q, k, v, rand(HQ), cu, max(lengths)))
                state["tensors"][d][case["name"]] = tensors
            res = rnd.setdefault(key, {})
            for impl in order:
                entry = {"fwd_ms": 0.0, "bwd_ms": 0.0 if impl.backward else None}
                try:
                    for i, (q, k, v, d_o, cu, longest) in enumerate(tensors):
                        inputs, fn, note = impl.prepare(q, k, v, cu, longest, case["window"])
                        f, b = measure(torch, device, fn, inputs, d_o, args.warmup if r == 0 else 0, args.reps,
                                       impl.backward, clock)
                        entry["fwd_ms"] += f
                        if b is not None:
                            entry["bwd_ms"] += b
                        entry["note"] = note
                        if r == 0 and i == 0:
                            started = time.time()
                            check(torch, state, key, impl, fn, inputs, d_o)
                            clock["once_s"] += time.time() - started
                        del inputs, fn
                    if impl.name == "ours":
                        entry["kernels"] = impl.kernels()
                    log(f"round {r + 1} {key} {impl.name}: fwd {entry['fwd_ms']:.2f} ms"
                        + (f", bwd {entry['bwd_ms']:.2f} ms" if entry["bwd_ms"] is not None else ""))
                except NotApplicable as e:
                    entry = {"na": str(e)}
                except Exception as e:  # noqa: BLE001 -- recorded; the run goes on
                    entry = {"error": wb.short_error(e)}
                    log(f"round {r + 1} {key} {impl.name}: ERROR {entry['error']}")
                    traceback.print_exc()
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                        torch.cuda.empty_cache()
                res[impl.name] = entry
            state["kept"].pop(key, None)  # every implementation has been compared on this case
            state["pending"].pop(key, None)
        # one head dim's tensors at a time
        state["tensors"].pop(d, None)
        state["kept"].clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    state["rounds"].append(rnd)
    return clock["once_s"]


def check(torch, state, key, impl, fn, inputs, d_o):
    """First round, first buffer: ours' O/dQ/dK/dV kept; every other implementation compared with them."""
    got = outputs(torch, impl, fn, inputs, d_o, HKV)
    if impl.name == "ours":
        state["kept"][key] = got
        pending = state["pending"].pop(key, [])
        for name, other in pending:
            state["checks"].setdefault(key, {})[name] = frobenius(other, got)
        return
    want = state["kept"].get(key)
    if want is None:  # ours runs later in this round's order: compare when it has run
        state["pending"].setdefault(key, []).append((impl.name, got))
        return
    state["checks"].setdefault(key, {})[impl.name] = frobenius(got, want)


def summarize(state, args):
    """Per case: per implementation the median over rounds of fwd/bwd ms, TFLOP/s, and ratios to ours."""
    rows = []
    for d in args.head_dims:
        for case in state["cases"]:
            key = f"D{d} | {case['name']}"
            row = {"key": key, "d": d, "case": case["name"], "window": case["window"], "impls": {}}
            if case["error"]:
                row["error"] = case["error"]
                rows.append(row)
                continue
            fwd_flops, bwd_flops = case_flops(case, HQ, d)
            row.update(fwd_flops=fwd_flops, bwd_flops=bwd_flops, docs=[len(b) for b in case["buffers"]],
                       max_doc=max(max(b) for b in case["buffers"]))
            for impl in state["impls"]:
                per_round = [rnd.get(key, {}).get(impl.name) for rnd in state["rounds"]]
                ok = [e for e in per_round if e and "fwd_ms" in e]
                if not ok:
                    first = next((e for e in per_round if e), {})
                    row["impls"][impl.name] = {"na": first.get("na"), "error": first.get("error")}
                    continue
                fwd = statistics.median(e["fwd_ms"] for e in ok)
                bwds = [e["bwd_ms"] for e in ok if e.get("bwd_ms") is not None]
                bwd = statistics.median(bwds) if bwds else None
                row["impls"][impl.name] = {
                    "fwd_ms": fwd, "bwd_ms": bwd, "rounds": len(ok), "fwd_ms_rounds": [e["fwd_ms"] for e in ok],
                    "bwd_ms_rounds": bwds, "fwd_tflops": fwd_flops / fwd / 1e9,
                    "bwd_tflops": bwd_flops / bwd / 1e9 if bwd else None, "note": ok[0].get("note", ""),
                    "kernels": ok[0].get("kernels", "")}
            ours = row["impls"].get("ours", {})
            for name, e in row["impls"].items():
                if "fwd_ms" not in e or "fwd_ms" not in ours:
                    continue
                e["fwd_ratio"] = e["fwd_ms"] / ours["fwd_ms"]
                if e["bwd_ms"] and ours.get("bwd_ms"):
                    e["bwd_ratio"] = e["bwd_ms"] / ours["bwd_ms"]
                    e["both_ratio"] = (e["fwd_ms"] + e["bwd_ms"]) / (ours["fwd_ms"] + ours["bwd_ms"])
            row["checks"] = state["checks"].get(key, {})
            rows.append(row)
    return rows


def markdown(result):
    m = result["meta"]
    names = [n for n in m["impls"] if n != "ours"]
    lines = [f"GPU: {m['gpu']}; torch {m['torch']} (CUDA {m['cuda']}, cuDNN {m['cudnn']}); flash-attn-4 "
             f"{m['fa4_version'] or 'not installed'}; Hq {HQ}, Hkv {HKV}, bf16, causal; medians of "
             f"{m['rounds_done']} interleaved rounds ({m['reps']} calls each). Ours in TFLOP/s (fwd / bwd / both); "
             f"the others as time relative to ours (below 1 = faster than ours), fwd / bwd / both.", "",
             "| D | case | ours fwd / bwd / both | " + " | ".join(names) + " |",
             "|---|---|---|" + "---|" * len(names)]
    for row in result["rows"]:
        if row.get("error"):
            lines.append(f"| {row['d']} | {row['case']} | {row['error']} |" + " |" * len(names))
            continue
        o = row["impls"].get("ours", {})
        if "fwd_ms" in o:
            both = (row["fwd_flops"] + row["bwd_flops"]) / (o["fwd_ms"] + o["bwd_ms"]) / 1e9 if o["bwd_ms"] else None
            ours = f"{o['fwd_tflops']:.0f} / {wb.fmt(o['bwd_tflops'], '.0f')} / {wb.fmt(both, '.0f')}"
        else:
            ours = o.get("error") or o.get("na") or "-"
        cells = []
        for n in names:
            e = row["impls"].get(n, {})
            if "fwd_ratio" in e:
                cells.append(" / ".join(wb.fmt(e.get(x), ".2f") for x in ("fwd_ratio", "bwd_ratio", "both_ratio"))
                             if e.get("bwd_ratio") is not None else f"{e['fwd_ratio']:.2f} (fwd only)")
            elif "fwd_ms" in e:
                cells.append(f"{e['fwd_tflops']:.0f} TFLOP/s fwd (ours missing)")
            else:
                cells.append("n/a" if e.get("na") else f"error: {e.get('error', '-')}"[:80])
        lines.append(f"| {row['d']} | {row['case']} | {ours} | " + " | ".join(cells) + " |")
    lines += ["", "TFLOP/s of every implementation (fwd / bwd):", "",
              "| D | case | " + " | ".join(m["impls"]) + " |", "|---|---|" + "---|" * len(m["impls"])]
    for row in result["rows"]:
        if row.get("error"):
            continue
        cells = []
        for n in m["impls"]:
            e = row["impls"].get(n, {})
            cells.append(f"{e['fwd_tflops']:.0f} / {wb.fmt(e.get('bwd_tflops'), '.0f')}" if "fwd_ms" in e else "-")
        lines.append(f"| {row['d']} | {row['case']} | " + " | ".join(cells) + " |")
    lines += ["", "Relative Frobenius difference to ours, first buffer of each case (O / dQ / dK / dV):", "",
              "| D | case | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for row in result["rows"]:
        if row.get("error"):
            continue
        cells = [" / ".join(f"{x:.1e}" for x in row["checks"][n]) if n in row.get("checks", {}) else "-"
                 for n in names]
        lines.append(f"| {row['d']} | {row['case']} | " + " | ".join(cells) + " |")
    notes = sorted({f"{n}: {e['na']}" for row in result["rows"] for n, e in row.get("impls", {}).items()
                    if e.get("na")} | {f"{n}: {e['note']}" for row in result["rows"]
                                       for n, e in row.get("impls", {}).items() if e.get("note")})
    if notes:
        lines += ["", "Notes:"] + [f"- {x}" for x in notes]
    lines += ["", f"{m['elapsed_s']:.0f} s; commit {m['commit']}; command: `{m['command']}`"]
    return "\n".join(lines) + "\n"


def commit():
    if os.environ.get("CAD_BENCH_COMMIT"):  # a copy of the tree without .git (the GPU machine's)
        return os.environ["CAD_BENCH_COMMIT"]
    try:
        # --dirty: a copy whose files differ from its git metadata (a stale .git beside newer files) says so.
        return subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty", "--abbrev=7"],
                              capture_output=True, text=True, timeout=10).stdout.strip() or "unknown"
    except Exception:  # noqa: BLE001 -- a copy without .git
        return "unknown"


def int_list(text):
    return [int(x) for x in text.split(",") if x.strip()] if text else []


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="results JSON (the markdown table is written beside it, .md)")
    p.add_argument("--build", default=os.environ.get("BUILD", "build-gpu"), help="build tree (libcad_host, plugins)")
    p.add_argument("--impls", default=",".join(IMPLS), help=f"any of {', '.join(IMPLS)} (ours first is the base)")
    p.add_argument("--head-dims", type=int_list, default=[128, 64])
    p.add_argument("--contexts", type=int_list, default=[65536, 131072])
    p.add_argument("--buffers", type=int, default=4, help="Pretrain buffers per context (one step's ranks)")
    p.add_argument("--dense", type=int_list, default=[16384, 65536])
    p.add_argument("--window", type=int, default=4096, help="causal window (left); -1 for none")
    p.add_argument("--window-dense", type=int_list, default=[65536])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data", help="doclen_pretrain.json (default $CAD_DATA, ../shared/data, .bench_data)")
    p.add_argument("--budget-s", type=float, default=420.0)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: a check of the script itself (our reference backend, wall-clock times)")
    args = p.parse_args(argv)
    args.impls = [x.strip() for x in args.impls.split(",") if x.strip()]
    bad = [x for x in args.impls if x not in IMPLS]
    if bad or "ours" not in args.impls:
        p.error(f"--impls: unknown {bad}" if bad else "--impls must include ours (the base of every ratio)")
    args.impls = ["ours"] + [x for x in args.impls if x != "ours"]
    if args.window is not None and args.window < 0:
        args.window = None
    if args.rounds < 1 or args.reps < 1 or args.warmup < 0 or args.buffers < 1:
        p.error("--rounds, --reps and --buffers must be >= 1, --warmup >= 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    started = time.time()
    command = " ".join([os.path.relpath(__file__, REPO)] + (argv if argv is not None else sys.argv[1:]))
    wb.setup_environment(args.build)  # the cad package (its recipe samples the Pretrain buffers) on sys.path
    cases = make_cases(args)
    if args.dry_run:
        for d in args.head_dims:
            for c in cases:
                if c["error"]:
                    print(f"D{d} {c['name']}: {c['error']}")
                    continue
                f, _ = case_flops(c, HQ, d)
                docs = [len(b) for b in c["buffers"]]
                print(f"D{d} {c['name']}: docs {docs}, longest {max(max(b) for b in c['buffers'])}, "
                      f"forward {f / 1e12:.2f} TFLOP")
        return 0
    import torch
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: this benchmark runs on a GPU (--dry-run, or --device cpu to check the script)",
              file=sys.stderr)
        return 2
    impls = []
    for name in args.impls:
        try:
            impls.append(make_impl(name, device))
        except Exception as e:  # noqa: BLE001 -- the others still run
            print(f"{name}: cannot set up: {wb.short_error(e)}", flush=True)
            if name == "ours":
                return 1
    fa4 = next((i for i in impls if i.name == "fa4"), None)
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else f"none (--device cpu, {platform.machine()})"
    meta = {"command": command, "commit": commit(), "gpu": gpu, "host": platform.node(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "fa4_version": fa4.version if fa4 else None, "fa4": (fa4.unavailable or "available") if fa4 else "not run",
            "impls": [i.name for i in impls], "head_dims": args.head_dims, "reps": args.reps, "warmup": args.warmup,
            "seed": args.seed, "buffers": {c["name"]: c["buffers"] for c in cases if not c["error"]},
            "rounds_done": 0, "elapsed_s": 0}
    print(f"{meta['gpu']}; torch {meta['torch']}; fa4: {meta['fa4']}", flush=True)
    state = {"device": device, "impls": impls, "cases": cases, "rounds": [], "tensors": {}, "kept": {}, "pending": {}, "checks": {}}
    last = 0.0
    for r in range(args.rounds):
        now = time.time()
        if r > 0 and (now - started) + last > args.budget_s:
            print(f"stopping after {r} rounds: another (~{last:.0f} s) would pass --budget-s {args.budget_s:.0f}",
                  flush=True)
            break
        once = run_round(torch, state, r, args, lambda s: print(s, flush=True))
        took = time.time() - now
        last = next_round_guess(took, once)
        meta.update(rounds_done=r + 1, elapsed_s=time.time() - started)
        result = {"meta": meta, "rows": summarize(state, args), "raw_rounds": state["rounds"]}
        if args.out:
            out = pathlib.Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1) + "\n")
            out.with_suffix(".md").write_text(markdown(result))
        print(f"round {r + 1} done in {took:.0f} s ({once:.0f} s of it warm-up and checks); "
              f"the next one guessed at {last:.0f} s", flush=True)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
