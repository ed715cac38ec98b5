#!/usr/bin/env bash
# run_gpu_checks.sh -- on a GPU machine: build the project for Hopper, run the GPU test program, the
# benchmark-scale correctness test (cad_gpu_large_tests, against an fp32 oracle on the GPU), the
# conformance kit on cad_cuda.so (where the `cad` tool is buildable), compute-sanitizer memcheck and
# racecheck on small cases, and (with --bench) the kernel benchmark against cuDNN.
# Logs go to $OUT (default ./gpu-out); the last lines printed are a summary, ending with the list of the
# checks that failed. Exits 1 when any check failed (a test program, the conformance kit, a sanitizer, the
# bench, or a target that did not build), 0 only when every check run passed.
#   usage: tests/gpu/run_gpu_checks.sh [--bench] [--no-sanitizer]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
BUILD=${BUILD:-build-gpu}
ARCH=${CAD_GPU_ARCH:-90a}
RUN_BENCH=0
RUN_SANITIZER=1
for arg in "$@"; do
  case "$arg" in
    --bench) RUN_BENCH=1 ;;
    --no-sanitizer) RUN_SANITIZER=0 ;;
    *) echo "unknown argument $arg" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
failed_checks=()
check() {  # check NAME STATUS: a nonzero status adds NAME to the failures the script exits with
  [ "$2" = 0 ] || failed_checks+=("$1 (exit $2)")
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee -a "$SUMMARY"

# ---- build (only the targets these checks need: other folders may be mid-change) ----------------
start=$(date +%s)
{
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" &&
  cmake --build "$BUILD" -j"$(nproc)" --target cad_gpu_tests cad_plugin_cuda cad_plugin_reference
} > "$OUT/build.log" 2>&1
build_rc=$?
cmake --build "$BUILD" -j"$(nproc)" --target cad >> "$OUT/build.log" 2>&1; cad_rc=$?
cmake --build "$BUILD" -j"$(nproc)" --target cad_gpu_large_tests >> "$OUT/build.log" 2>&1; large_build_rc=$?
note "build rc=$build_rc (cad tool rc=$cad_rc, large tests rc=$large_build_rc) in $(( $(date +%s) - start )) s"
if [ "$build_rc" != 0 ]; then tail -40 "$OUT/build.log"; exit 1; fi
check "build of the cad tool" "$cad_rc"
check "build of cad_gpu_large_tests" "$large_build_rc"

# ---- correctness ------------------------------------------------------------------------------------
# Timeouts: a hung kernel must not eat the whole lease.
timeout 300 "$BUILD/bin/cad_gpu_tests" --gtest_brief=0 > "$OUT/gpu_tests.log" 2>&1
tests_rc=$?
check "cad_gpu_tests" "$tests_rc"
note "gpu tests rc=$tests_rc: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/gpu_tests.log" | tr '\n' ' ')"
grep -E '^\[  FAILED  \]|Failure|Expected|Which is' "$OUT/gpu_tests.log" | head -30 | tee -a "$SUMMARY"
# The worst of the "O e LSE e dQ e dK e dV e" fields of the result lines matching $1 in log $2, after "$3"
# (inf or nan anywhere shows as inf).
worst_errors() {
  grep -E "$1" "$2" | awk -v title="$3" '
    function worse(cur, val) { if (val ~ /[iI][nN][fF]|[nN][aA][nN]/ || cur == "inf") return "inf"; return (cur == "" || val + 0 > cur + 0) ? val : cur }
    { for (i = 1; i < NF; i++) if ($i == "O" || $i == "LSE" || $i == "dQ" || $i == "dK" || $i == "dV") w[$i] = worse(w[$i], $(i+1)); n++ }
    END { printf "%s (%d cases): O %s LSE %s dQ %s dK %s dV %s\n", title, n, w["O"], w["LSE"], w["dQ"], w["dK"], w["dV"] }' | tee -a "$SUMMARY"
}
worst_errors '^\[(tiny|shared_kv|long_kv)' "$OUT/gpu_tests.log" "worst relative errors over all cases"

# Benchmark scale (dense 16K/64K, split-KV shards, shared-KV head+tail, ragged 64K; d 64/128) against the
# fp32 oracle that runs on the GPU, after the oracle's own check against cad_reference.so.
if [ "$large_build_rc" = 0 ]; then
  start=$(date +%s)
  timeout 300 "$BUILD/bin/cad_gpu_large_tests" > "$OUT/gpu_large_tests.log" 2>&1
  large_rc=$?
  check "cad_gpu_large_tests" "$large_rc"
  note "large tests rc=$large_rc in $(( $(date +%s) - start )) s: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/gpu_large_tests.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]|Failure|Expected|Which is|Value of' "$OUT/gpu_large_tests.log" | head -30 | tee -a "$SUMMARY"
  worst_errors '^\[oracle ' "$OUT/gpu_large_tests.log" "fp32 GPU oracle vs cad_reference.so, worst"
  worst_errors '^\[large ' "$OUT/gpu_large_tests.log" "benchmark scale vs the fp32 GPU oracle, worst"
else
  note "large tests: not built (see build.log)"
fi

if [ "$cad_rc" = 0 ] && [ -x "$BUILD/bin/cad" ]; then
  timeout 300 "$BUILD/bin/cad" conformance "$BUILD/lib/cad/plugins/cad_cuda.so" > "$OUT/conformance.log" 2>&1
  conformance_rc=$?
  # The status decides, and so does the report: a FAIL line with exit 0 would be the kit's own defect.
  fail_lines=$(grep -c '^FAIL' "$OUT/conformance.log")
  [ "$conformance_rc" = 0 ] && [ "$fail_lines" != 0 ] && conformance_rc=1
  check "conformance of cad_cuda.so ($fail_lines FAIL lines)" "$conformance_rc"
  note "conformance rc=$conformance_rc: $(tail -1 "$OUT/conformance.log")"
  grep '^FAIL' "$OUT/conformance.log" | head -20 | tee -a "$SUMMARY"
else
  note "conformance: cad tool not built (see build.log)"
fi

# compute-sanitizer memcheck and racecheck of $BUILD/bin/$1 on the gtest filter $2; logs
# $OUT/sanitizer_$3<tool>.log; $4 is added to the summary lines.
sanitize() {
  for tool in memcheck racecheck; do
    timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 17 "$BUILD/bin/$1" --gtest_filter="$2" \
      > "$OUT/sanitizer_$3$tool.log" 2>&1
    local rc=$?
    check "compute-sanitizer $tool$4" "$rc"
    note "compute-sanitizer $tool$4 rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$3$tool.log" | tail -1)"
  done
}
if [ "$RUN_SANITIZER" = 1 ]; then
  small='Gpu/AttentionVsReference.MatchesReference/tiny_d64_causal_h8x2*:Gpu/AttentionVsReference.MatchesReference/shared_kv_d128_full_h4x4*:Gpu/AttentionVsReference.MatchesReference/long_kv_d64_causal_h8x2*:GpuPack.*'
  sanitize cad_gpu_tests "$small" "" ""
  # The fp32 oracle's kernels, on two of its small checks (both head dims, shared KV, gaps, GQA).
  if [ "$large_build_rc" = 0 ]; then
    sanitize cad_gpu_large_tests 'Gpu/ReferenceVsCpu.MatchesCpuReference/d64_full_h4x4:Gpu/ReferenceVsCpu.MatchesCpuReference/d128_causal_h8x2' \
      oracle_ " (fp32 oracle)"
  fi
fi

if [ "$RUN_BENCH" = 1 ]; then
  timeout 400 bash bench/kernels/run_bench.sh "$BUILD" "$OUT" > "$OUT/bench.log" 2>&1
  bench_rc=$?
  check "kernel bench (bench/kernels/run_bench.sh)" "$bench_rc"
  note "bench rc=$bench_rc"
  cat "$OUT/kernel_table.md" 2>/dev/null || tail -20 "$OUT/bench.log"
fi
if [ "${#failed_checks[@]}" = 0 ]; then
  note "all checks passed"
else
  note "FAILED: ${#failed_checks[@]} check(s):"
  for f in "${failed_checks[@]}"; do note "  $f"; done
fi
echo "---- summary ----"
cat "$SUMMARY"
[ "${#failed_checks[@]}" = 0 ]
