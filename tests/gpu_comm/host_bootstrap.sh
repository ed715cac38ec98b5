#!/usr/bin/env bash
# host_bootstrap.sh -- the "nccl" communicator bootstrapped by its host, on GPUs (not run by CI):
# tests/gpu_comm/host_bootstrap_test.cpp with NGPU ranks (default: every visible GPU, at least 2), as
# threads of one process and then as processes, each rank with its own cad_host_t whose
# bootstrap_all_gather is shared memory; plus the refusals and failure cases (see the test's header).
# Builds what it needs (cad_plugin_nccl, cad_nccl_host_bootstrap_test) unless SKIP_BUILD=1. Output:
# stdout, appended to $LOG (default $OUT/host_bootstrap.log, emptied first), and one line appended to
# $OUT/summary.txt. A step of run.sh; stand-alone:
#   NGPU=2 OUT=$OUT bash tests/gpu_comm/host_bootstrap.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu_comm_out}"
mkdir -p "$OUT"
JOBS="${JOBS:-$(nproc)}"
BUILD="${BUILD:-build-gpu}"
if [ -z "${LOG:-}" ]; then LOG="$OUT/host_bootstrap.log"; : > "$LOG"; fi
SUMMARY="$OUT/summary.txt"
# NVLink multicast (NVLS) stays off: on shared hosts it can take the GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  echo "building cad_plugin_nccl and cad_nccl_host_bootstrap_test in $BUILD ($JOBS jobs)" | tee -a "$LOG"
  if ! { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON -DCAD_BUILD_TESTS=OFF \
           -DCMAKE_CUDA_ARCHITECTURES=90a &&
         cmake --build "$BUILD" -j "$JOBS" --target cad_plugin_nccl cad_nccl_host_bootstrap_test; } >> "$LOG" 2>&1; then
    tail -40 "$LOG"
    echo "host bootstrap: build FAILED (see $(basename "$LOG"))" >> "$SUMMARY"
    exit 1
  fi
fi

args=()
[ -n "${NGPU:-}" ] && args+=(--ranks "$NGPU")
this_run="$(mktemp)"
echo "===== host bootstrap: cad_nccl_host_bootstrap_test cad_nccl.so ${args[*]}" >> "$LOG"
timeout 580 "$BUILD/bin/cad_nccl_host_bootstrap_test" "$BUILD/lib/cad/plugins/cad_nccl.so" "${args[@]}" 2>&1 |
  tee "$this_run"
rc=${PIPESTATUS[0]}
cat "$this_run" >> "$LOG"
tally="$(grep -E '^host_bootstrap: [0-9]+ passed' "$this_run" | tail -1)"
phases="$(grep -E '^PHASE ' "$this_run" | sed -E 's/^PHASE ([^:]+): ([a-zA-Z]+).*/\1 \2/' | paste -sd, - | sed 's/,/, /g')"
checks_failed="$(grep -c '^  FAIL' "$this_run")"
rm -f "$this_run"
if [ "$rc" = 0 ]; then result=passed; else result="FAILED (exit $rc)"; fi
echo "host bootstrap (NGPU=${NGPU:-all visible}): $result -- ${tally:-no tally line} [$phases]; $checks_failed failing check(s)" \
  >> "$SUMMARY"
exit "$rc"
