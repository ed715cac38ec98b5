#!/usr/bin/env bash
# run_diet.sh BUILD_DIR OUT_DIR [diet_bench.py options] -- our kernels on CAD's real diet against cuDNN, in
# one process (bench/kernels/diet_bench.py). build_timer.sh (re)builds libcad_kernels.a in BUILD_DIR (CMake,
# CUDA on; incremental), then the timing library libcad_kernel_timer.so against it; the driver runs under a
# time bound. The diet file is committed (bench/kernels/diet_batches.txt), so the document lengths are
# not needed here.
# Writes OUT_DIR/diet_bench.json (every measurement), OUT_DIR/diet_table.md and OUT_DIR/diet_bench.log.
# Default settings (3 rounds, head dims 64 and 128): about 3-4 minutes on one H200.
set -euo pipefail
BUILD=${1:-build-gpu}
OUT=${2:-gpu-out}
shift $(( $# < 2 ? $# : 2 ))
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
LIB=$("$HERE/build_timer.sh" "$BUILD" | tail -1)
# The driver stops starting rounds at --deadline (330 s); the timeout is the backstop.
timeout "${DIET_TIMEOUT:-420}" python3 "$HERE/diet_bench.py" --lib "$LIB" \
  --json "$OUT/diet_bench.json" --md "$OUT/diet_table.md" "$@" 2>&1 | tee "$OUT/diet_bench.log"
