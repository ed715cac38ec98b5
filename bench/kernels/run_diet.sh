#!/usr/bin/env bash
# run_diet.sh BUILD_DIR OUT_DIR [diet_bench.py options] -- our kernels on CAD's real diet against cuDNN, in
# one process (bench/kernels/diet_bench.py). Builds libcad_kernels.a in BUILD_DIR when it is missing (CMake,
# CUDA on), then the timing library libcad_kernel_timer.so with nvcc against it (as run_bench.sh builds
# cad_kernel_bench), and runs the driver under a time bound. The diet file is committed
# (bench/kernels/diet_batches.txt), so the document lengths are not needed here.
# Writes OUT_DIR/diet_bench.json (every measurement), OUT_DIR/diet_table.md and OUT_DIR/diet_bench.log.
# Default settings (3 rounds, head dims 64 and 128): about 3-4 minutes on one H200.
set -euo pipefail
BUILD=${1:-build-gpu}
OUT=${2:-gpu-out}
shift $(( $# < 2 ? $# : 2 ))
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
ARCH=${CAD_GPU_ARCH:-90a}
mkdir -p "$OUT" "$BUILD/lib"
if [ ! -f "$BUILD/lib/libcad_kernels.a" ]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" > "$OUT/diet_build.log" 2>&1
  cmake --build "$BUILD" -j"$(nproc)" --target cad_kernels >> "$OUT/diet_build.log" 2>&1
fi
nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode "arch=compute_${ARCH},code=sm_${ARCH}" -I "$ROOT/kernels" \
  "$HERE/case_timer.cu" "$HERE/case_timer_capi.cu" -L "$BUILD/lib" -lcad_kernels \
  -o "$BUILD/lib/libcad_kernel_timer.so"
# The driver stops starting rounds at --deadline (330 s); the timeout is the backstop.
timeout "${DIET_TIMEOUT:-420}" python3 "$HERE/diet_bench.py" --lib "$BUILD/lib/libcad_kernel_timer.so" \
  --json "$OUT/diet_bench.json" --md "$OUT/diet_table.md" "$@" 2>&1 | tee "$OUT/diet_bench.log"
