#!/usr/bin/env bash
# bwd_variants.sh -- on one GPU machine (H200, 16 cores), from the repository root: an A/B of the Hopper
# backward's compile-time step schedules (CAD_BWD90_VARIANT, kernels/sm90/bwd_traits.cuh). Unattended, under
# about 8 minutes:
#  1. builds one folder per variant (build-bwdv<N>, CMAKE_CUDA_FLAGS=-DCAD_BWD90_VARIANT=N), in parallel,
#     only the targets below: the GPU kernel tests, the benchmark-scale tests and cad_bwd_variant_bench;
#  2. per variant, the backward's correctness tests: cad_gpu_tests' AttentionVsReference and
#     WindowVsReference cases on the wgmma kernels (against the CPU reference plugin) and cad_gpu_large_tests'
#     LargeAttention cases (16K-64K against the fp32 GPU oracle);
#  3. ROUNDS rounds (default 3) of cad_bwd_variant_bench, every variant once per round, the order rotating
#     by round (Pretrain 64K/128K buffers, dense causal 16K/64K, dense 64K with a window of 4096; D 128 and 64);
#  4. compute-sanitizer racecheck of every variant but 0 on three small test cases (time permitting);
#  5. $OUT/summary.md and $OUT/summary.csv: per case and head dim, each variant's median backward and forward TFLOP/s
#     over the rounds and its ratio to the first variant; the test results; logs in $OUT/logs.tgz.
# Suffixes of a variant set the D=64 kernel's Q/dO stages (_sK: -DCAD_BWD64_STAGES=K, default 2) and queries per
# step (_qM: -DCAD_BWD64_QUERIES=M, 64 or 128, default 128), and _cN the D=64 forward's consumer warpgroups
# (-DCAD_FWD64_CONSUMERS=N, 2 or 3, default 3; kernels/cad_kernels.h: the host plan's query tile follows it, so the
# flags go to the C++ sources too), and _kN the forward's K/V stages (-DCAD_FWD90_KV_STAGES=N) and _m1 its mask
# ranges broadcast from lane 0 (-DCAD_FWD90_UNIFORM_MASKS=1; both sm90/fwd_traits.cuh), e.g. 1_q64, 1_q64_s4, 1_c2,
# 1_k2 or 1_m1.
#   next A/B: VARIANTS="1 1_m0 1_m1" (the mask ranges known warp-uniform, no reconvergence barrier per tile; 1_m0 is
#   1's code in a folder of its own, so that the run shows how far identical builds move)
# Exits 1 when a build, a correctness test or a sanitizer run failed (a timeout counts as a failure), else 0.
#   usage: [OUT=dir] [VARIANTS="0 1"] [ROUNDS=3] bash bench/kernels/bwd_variants.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
VARIANTS=${VARIANTS:-"0 1"}
ROUNDS=${ROUNDS:-3}
ARCH=${CAD_GPU_ARCH:-90a}
LOG=$OUT/logs
mkdir -p "$OUT" "$LOG"
S=$(date +%s)
elapsed() { echo $(( $(date +%s) - S )); }
t() { echo "[$(elapsed) s] $*" | tee -a "$OUT/steps.txt"; }
failed=()
fail() { failed+=("$1"); t "FAILED: $1"; }
finish() {
  tar -czf "$OUT/logs.tgz" -C "$OUT" logs 2>/dev/null && rm -rf "$LOG"
  if [ "${#failed[@]}" = 0 ]; then t "all builds and checks passed"; exit 0; fi
  t "${#failed[@]} failure(s):"; for f in "${failed[@]}"; do t "  $f"; done; exit 1
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt" 2>&1
# --dirty: a copy whose files differ from its git metadata (a stale .git beside newer files) says so.
git describe --always --dirty --abbrev=12 > "$LOG/commit.txt" 2>/dev/null || true
t "gpu: $(cat "$OUT/gpu.txt"); variants: $VARIANTS; rounds: $ROUNDS"

# ---- 1. builds, one folder per variant, in parallel ------------------------------------------------------
nv=$(echo $VARIANTS | wc -w)
jobs=$(( ($(nproc) + nv - 1) / nv ))
for v in $VARIANTS; do
  flags="-DCAD_BWD90_VARIANT=${v%%_*}"
  for part in $(echo "${v#*_}" | tr _ ' '); do
    [ "$part" = "$v" ] && break  # no suffix
    case "$part" in
      s[0-9]*) flags="$flags -DCAD_BWD64_STAGES=${part#s}" ;;
      q[0-9]*) flags="$flags -DCAD_BWD64_QUERIES=${part#q}" ;;
      c[23]) flags="$flags -DCAD_FWD64_CONSUMERS=${part#c}" ;;
      k[2-4]) flags="$flags -DCAD_FWD90_KV_STAGES=${part#k}" ;;
      m[01]) flags="$flags -DCAD_FWD90_UNIFORM_MASKS=${part#m}" ;;
      *) echo "variant $v: unknown suffix _$part (expected _sK, _qM, _c2/_c3, _k2.._k4 or _m0/_m1)" >&2; exit 2 ;;
    esac
  done
  (
    timeout 120 cmake -S . -B "build-bwdv$v" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DCMAKE_CUDA_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" &&
      timeout 300 cmake --build "build-bwdv$v" -j"$jobs" --target cad_bwd_variant_bench cad_gpu_tests \
        cad_gpu_large_tests cad_plugin_cuda cad_plugin_reference
    echo $? > "$LOG/build_v$v.rc"
  ) > "$LOG/build_v$v.log" 2>&1 &
done
built=()
wait
for v in $VARIANTS; do
  if [ "$(cat "$LOG/build_v$v.rc" 2>/dev/null)" = 0 ]; then
    built+=("$v")
  else
    fail "build of variant $v (logs/build_v$v.log)"; tail -15 "$LOG/build_v$v.log"
  fi
done
t "built: ${built[*]:-none} ($(grep -h '^\[' "$LOG"/build_v*.log | tail -1 | cut -c1-60))"
[ "${#built[@]}" = 0 ] && finish

# side_by_side NAME V LIMIT_S COMMAND...: COMMAND in the background under LIMIT_S, its output in logs/NAME_vV.log and
# its exit code in logs/NAME_vV.rc (the caller waits).
side_by_side() {
  local name=$1 v=$2 limit=$3; shift 3
  ( timeout "$limit" "$@" > "$LOG/${name}_v$v.log" 2>&1; echo $? > "$LOG/${name}_v$v.rc" ) &
}
# report NAME LABEL PATTERN V: variant V's line (its exit code and the log's lines matching PATTERN) into
# tests.txt, a failure counted with gtest's FAILED lines; returns 0 where the run passed.
report() {
  local name=$1 label=$2 pattern=$3 v=$4 rc line
  rc=$(cat "$LOG/${name}_v$v.rc")
  line="variant $v $label rc=$rc: $(grep -E "$pattern" "$LOG/${name}_v$v.log" | tr '\n' ' ')"
  echo "$line" >> "$OUT/tests.txt"; t "$line"
  [ "$rc" = 0 ] || { fail "variant $v: $label rc=$rc"; grep -E '^\[  FAILED  \]' "$LOG/${name}_v$v.log" | head -10; }
  [ "$rc" = 0 ]
}
GTEST_SUMMARY='^\[  (PASSED|FAILED)  \] [0-9]+ test'

# ---- 2. correctness per variant ----------------------------------------------------------------------------
# The small cases' CPU reference is the slow part: the variants' runs go side by side (one process each).
: > "$OUT/tests.txt"
for v in "${built[@]}"; do
  side_by_side gpu_tests "$v" 240 "build-bwdv$v/bin/cad_gpu_tests" \
    --gtest_filter='Gpu/AttentionVsReference.*:Gpu/WindowVsReference.*-*portable*'
done
wait
for v in "${built[@]}"; do report gpu_tests cad_gpu_tests "$GTEST_SUMMARY" "$v"; done
for v in "${built[@]}"; do
  side_by_side large_tests "$v" 150 "build-bwdv$v/bin/cad_gpu_large_tests" --gtest_filter='Gpu/LargeAttention.*'
done
wait
good=()
for v in "${built[@]}"; do
  report large_tests cad_gpu_large_tests "$GTEST_SUMMARY" "$v" && [ "$(cat "$LOG/gpu_tests_v$v.rc")" = 0 ] && good+=("$v")
done
# Only variants whose results are right are timed (one that fails may also hang).
t "timed: ${good[*]:-none}"

# ---- 3. timing rounds, interleaved ---------------------------------------------------------------------------
n=${#good[@]}
longest=0
for r in $(seq 1 "$ROUNDS"); do
  [ "$n" = 0 ] && break
  if [ "$r" -gt 1 ] && [ $(( $(elapsed) + longest )) -gt 350 ]; then
    t "round $r not started: another (~${longest} s) would pass the time budget"; break
  fi
  rs=$(date +%s)
  for i in $(seq 0 $((n - 1))); do
    v=${good[$(( (i + r - 1) % n ))]}
    timeout 120 "build-bwdv$v/bin/cad_bwd_variant_bench" bench/kernels/pretrain_batches.txt 128,64 3 \
      > "$LOG/bench_v${v}_r$r.csv" 2> "$LOG/bench_v${v}_r$r.err"
    rc=$?
    [ "$rc" = 0 ] || fail "bench of variant $v, round $r: rc=$rc (logs/bench_v${v}_r$r.err)"
  done
  d=$(( $(date +%s) - rs )); [ "$d" -gt "$longest" ] && longest=$d
  t "round $r done in $d s"
done
[ "$n" -gt 0 ] && { python3 bench/kernels/bwd_variants_summary.py "$LOG" "$OUT" "${good[@]}" || fail "summary (bwd_variants_summary.py)"; }

# ---- 4. racecheck of the changed schedules (time permitting), side by side --------------------------------------
# Both head dims and the WINDOW kernel; 8 query heads per KV head, so each block runs 4 steps and reuses its
# stages, dS^T and dQ buffers.
small='Gpu/AttentionVsReference.MatchesReference/tiny_d64_causal_h8x2:Gpu/AttentionVsReference.MatchesReference/tiny_d128_causal_h8x2:Gpu/WindowVsReference.MatchesReference/tiny_d128_causal_left5_rightnone'
raced=()
SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for v in "${built[@]}"; do
  [ "$v" = 0 ] && continue
  if [ "$(elapsed)" -gt 360 ]; then
    t "racecheck of variant $v not started (time budget)"; echo "variant $v racecheck: not run (time)" >> "$OUT/tests.txt"
    continue
  fi
  raced+=("$v")
  side_by_side racecheck "$v" 100 "$SANITIZER" --tool racecheck --error-exitcode 17 "build-bwdv$v/bin/cad_gpu_tests" \
    --gtest_filter="$small"
done
wait
for v in "${raced[@]}"; do report racecheck racecheck 'RACECHECK SUMMARY|ERROR SUMMARY' "$v"; done
cat "$OUT/tests.txt" >> "$OUT/summary.md"  # (summary.md exists once a variant was timed)
echo "---- summary ----"
cat "$OUT/summary.md"
finish
