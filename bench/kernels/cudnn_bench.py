#!/usr/bin/env python3
"""cuDNN fused attention (PyTorch SDPA, cuDNN backend) on the dense causal cases of the kernel benchmark,
then one table that puts our kernels (the CSV of cad_kernel_bench) beside it.
FLOPs: causal forward 4*d*(q*kv - q*(q-1)/2) per head, backward 2.5x forward. Timing: CUDA events,
2 warm-ups, median of repeats; backward = median(fwd+bwd) - median(fwd). Inputs uniform in [-1, 1).
usage: cudnn_bench.py --ours ours.csv [--out table.md]"""
import argparse
import csv
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HQ, HKV, D = 32, 8, 128


def median_ms(fn, reps):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def causal_flops(n, d=D, hq=HQ):
    return 4.0 * d * (n * n - n * (n - 1) / 2) * hq


def cudnn_dense_causal(n, d=D, hq=HQ, hkv=HKV):
    """Returns (fwd_ms, bwd_ms, note). diet_bench.py calls it too (other head dims)."""
    def rand(h):
        return (torch.rand(1, h, n, d, device="cuda", dtype=torch.bfloat16) * 2 - 1).requires_grad_(True)
    q, k, v = rand(hq), rand(hkv), rand(hkv)
    d_o = torch.rand(1, hq, n, d, device="cuda", dtype=torch.bfloat16) * 2 - 1
    note = "gqa"
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        def fwd():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        try:
            fwd()
        except RuntimeError:
            # cuDNN without native GQA here: expand K/V to every query head (same FLOPs).
            ke = k.detach().repeat_interleave(hq // hkv, dim=1).requires_grad_(True)
            ve = v.detach().repeat_interleave(hq // hkv, dim=1).requires_grad_(True)
            note = "kv expanded"

            def fwd():
                return F.scaled_dot_product_attention(q, ke, ve, is_causal=True)

        def fwd_bwd():
            fwd().backward(d_o)

        reps = 5 if n >= 65536 else 10
        f = median_ms(fwd, reps)
        fb = median_ms(fwd_bwd, reps)
    return f, fb - f, note


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True)
    ap.add_argument("--out")
    args = ap.parse_args()
    ours = list(csv.DictReader(open(args.ours)))
    gpu = torch.cuda.get_device_name()
    cudnn = {}
    for n in (4096, 16384, 65536):
        try:
            f, b, note = cudnn_dense_causal(n)
            cudnn[n] = (causal_flops(n) / f / 1e9, 2.5 * causal_flops(n) / b / 1e9, note)
        except Exception as e:  # report, keep going
            print(f"cuDNN dense causal {n}: failed: {e}")
        torch.cuda.empty_cache()
    ref16 = cudnn.get(16384)
    lines = [f"GPU: {gpu}; torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; Hq=32, Hkv=8, D=128, bf16",
             "",
             "| case | ours fwd TFLOP/s | ours bwd TFLOP/s | cuDNN fwd TFLOP/s | cuDNN bwd TFLOP/s | fwd ratio | bwd ratio | ours fwd/bwd, mma.sync kernels |",
             "|---|---|---|---|---|---|---|---|"]
    for row in ours:
        name = row["case"]
        of, ob = float(row["fwd_tflops"]), float(row["bwd_tflops"])
        op = f'{float(row.get("fwd_portable_tflops", 0) or 0):.0f} / {float(row.get("bwd_portable_tflops", 0) or 0):.0f}'
        ref, label = None, ""
        if name.startswith("dense_causal_"):
            n = int(name.split("_")[-1].rstrip("k")) * 1024
            ref = cudnn.get(n)
        elif ref16:
            ref, label = ref16, " (vs dense 16K)"
        if ref:
            cf, cb = ref[0], ref[1]
            fr = f"{of / cf:.2f}{label}"
            br = f"{ob / cb:.2f}{label}" if ob > 0 else "-"
            lines.append(f"| {name} | {of:.0f} | {ob:.0f} | {cf:.0f} | {cb:.0f} | {fr} | {br} | {op} |")
        else:
            lines.append(f"| {name} | {of:.0f} | {ob:.0f} | - | - | - | - | {op} |")
    notes = ", ".join(f"{n // 1024}K: {v[2]}" for n, v in cudnn.items())
    lines += ["", f"cuDNN K/V heads: {notes}"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        open(args.out, "w").write(text + "\n")


if __name__ == "__main__":
    main()
