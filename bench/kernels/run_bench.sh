#!/usr/bin/env bash
# run_bench.sh BUILD_DIR OUT_DIR -- builds cad_kernel_bench against BUILD_DIR's libcad_kernels.a, runs
# it, then the cuDNN side, and prints the combined table (also written to OUT_DIR/kernel_table.md).
set -euo pipefail
BUILD=${1:-build-gpu}
OUT=${2:-gpu-out}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
ARCH=${CAD_GPU_ARCH:-90a}
mkdir -p "$OUT" "$BUILD/bin"
nvcc -O3 -std=c++17 -gencode "arch=compute_${ARCH},code=sm_${ARCH}" -I "$ROOT/kernels" \
  "$HERE/kernel_bench.cu" "$HERE/case_timer.cu" -L "$BUILD/lib" -lcad_kernels -o "$BUILD/bin/cad_kernel_bench"
"$BUILD/bin/cad_kernel_bench" "$HERE/pretrain_batches.txt" ${BENCH_FILTER:-} | tee "$BUILD/ours.csv"
python3 "$HERE/cudnn_bench.py" --ours "$BUILD/ours.csv" --out "$OUT/kernel_table.md"
