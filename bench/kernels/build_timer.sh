#!/usr/bin/env bash
# build_timer.sh BUILD_DIR [SOURCE_ROOT] -- builds BUILD_DIR/lib/libcad_kernel_timer.so, the timing library
# that diet_bench.py and ab_bench.py load with ctypes (case_timer.cu behind case_timer_capi.cu's C entry
# points), against BUILD_DIR/lib/libcad_kernels.a, which it (re)builds first (CMake, CUDA on, architectures
# $CAD_GPU_ARCH, default 90a; configured when BUILD_DIR has no CMakeCache.txt). SOURCE_ROOT (default: this
# checkout) is the tree whose kernels are built, so an A/B can build an older commit's library from a
# `git worktree`.
# Linked with -Bsymbolic: two builds loaded into one process (ab_bench.py) each call their own kernels.
# Runs here or on the GPU machine (CUDA code compiles without a GPU). Log: BUILD_DIR/build_timer.log.
# CAD_TIMER_DEFINES (e.g. -DCAD_TIMER_DYNAMIC_WALK: the forward's dynamic walk) compiles the timer with those
# macros, into libcad_kernel_timer${CAD_TIMER_SUFFIX}.so: two timers of one kernel library for an A/B of options.
set -euo pipefail
if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
  [ $# -ge 1 ] && exit 0 || exit 2
fi
BUILD=$1
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "${2:-$HERE/../..}" && pwd)
ARCH=${CAD_GPU_ARCH:-90a}
mkdir -p "$BUILD/lib"
BUILD=$(cd "$BUILD" && pwd)
LOG="$BUILD/build_timer.log"
: > "$LOG"
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  echo "configuring $BUILD for $ROOT (log: $LOG)"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" >> "$LOG" 2>&1 || { tail -20 "$LOG" >&2; exit 1; }
fi
# Always (incremental): a library left from an earlier tree would otherwise be timed as this one.
cmake --build "$BUILD" -j"$(nproc)" --target cad_kernels >> "$LOG" 2>&1 || { tail -20 "$LOG" >&2; exit 1; }
LIB="$BUILD/lib/libcad_kernel_timer${CAD_TIMER_SUFFIX:-}.so"
# shellcheck disable=SC2086  # CAD_TIMER_DEFINES: several flags, split on purpose
nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -Xlinker -Bsymbolic -gencode "arch=compute_${ARCH},code=sm_${ARCH}" \
  ${CAD_TIMER_DEFINES:-} -I "$ROOT/kernels" "$ROOT/bench/kernels/case_timer.cu" "$ROOT/bench/kernels/case_timer_capi.cu" \
  -L "$BUILD/lib" -lcad_kernels -o "$LIB" >> "$LOG" 2>&1 || { tail -20 "$LOG" >&2; exit 1; }
echo "$LIB"
