#!/usr/bin/env python3
"""Fails when ptxas serializes the wgmma instructions of a Hopper kernel.

ptxas reports "Potential Performance Loss: wgmma.mma_async instructions are serialized ..." (C7510-C7515) when it
cannot keep a kernel's warpgroup products asynchronous -- a register touched while its product runs, too few
registers for the pipeline, a path that leaves products in flight -- and then waits after every wgmma, which costs
a large share of the kernel's speed while every result stays right. Only ptxas's -v output shows it, so this check
compiles each sm_90a translation unit with its defaults and fails on that line.
It also prints each kernel's spill bytes (information, not a failure).

Usage: check_wgmma_serialization.py --nvcc NVCC [--source FILE.cu [--define NAME=VALUE ...]]
  without --source: the project's sm_90a kernels (kernels/sm90/*_sm90.cu) with their defaults; --define (with
  --source) checks one unit built with a switch, e.g. -DCAD_BWD90_VARIANT=0. Exit 0: none serialized; 1: some
  serialized or a compile failed; 2: bad arguments.
"""
import argparse
import pathlib
import re
import subprocess
import sys
import tempfile

KERNELS = pathlib.Path(__file__).resolve().parents[1]
REPO = KERNELS.parent
SERIALIZED = re.compile(r"\((C75\d\d)\) Potential Performance Loss: wgmma\.mma_async instructions are serialized[^\n]*")
SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")

DEFAULT_CASES = [
    ("sm90/fwd_hd128_sm90.cu", []),
    ("sm90/fwd_hd64_sm90.cu", []),
    ("sm90/bwd_hd128_sm90.cu", []),
    ("sm90/bwd_hd64_sm90.cu", []),
]


def compile_and_check(nvcc, source, defines, out_dir):
    """(serialization lines, spill pairs) of one translation unit; raises RuntimeError if nvcc fails."""
    cmd = [nvcc, "-std=c++17", "-O3", "-gencode", "arch=compute_90a,code=sm_90a", "-DCAD_SM90_KERNEL_BODY",
           f"-I{KERNELS}", f"-I{REPO / 'plugin_api'}", "-Xptxas", "-v", "-c", str(source),
           "-o", str(pathlib.Path(out_dir) / "check.o")] + [f"-D{d}" for d in defines]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    text = run.stdout + run.stderr
    if run.returncode != 0:
        raise RuntimeError(f"{source}: nvcc failed (exit {run.returncode}):\n{text[-3000:]}")
    return [m.group(0) for m in SERIALIZED.finditer(text)], [(int(a), int(b)) for a, b in SPILLS.findall(text)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nvcc", required=True, help="the CUDA compiler (CMake's CMAKE_CUDA_COMPILER)")
    p.add_argument("--source", help="one .cu file to check instead of the project's kernels")
    p.add_argument("--define", action="append", default=[], help="NAME=VALUE for --source (repeatable)")
    args = p.parse_args(argv)
    if args.define and not args.source:
        p.error("--define goes with --source")
    cases = [(pathlib.Path(args.source), args.define)] if args.source else \
        [(KERNELS / f, d) for f, d in DEFAULT_CASES]
    bad = []
    with tempfile.TemporaryDirectory() as tmp:
        for source, defines in cases:
            label = f"{source.relative_to(REPO) if source.is_relative_to(REPO) else source}" + \
                    "".join(f" -D{d}" for d in defines)
            if not source.is_file():
                print(f"{label}: no such file", file=sys.stderr)
                return 2
            try:
                serialized, spills = compile_and_check(args.nvcc, source, defines, tmp)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(f"FAILED {label}: {e}")
                bad.append(label)
                continue
            spill_text = ", ".join(f"{s}/{l}" for s, l in spills) or "none"
            if serialized:
                print(f"FAILED {label}: ptxas serializes its wgmmas")
                for line in serialized:
                    print(f"  {line}")
                bad.append(label)
            else:
                print(f"ok     {label} (spill stores/loads per kernel, bytes: {spill_text})")
    if bad:
        print(f"{len(bad)} of {len(cases)} failed: {', '.join(bad)}")
        return 1
    print(f"all {len(cases)} compiled with asynchronous wgmmas")
    return 0


if __name__ == "__main__":
    sys.exit(main())
