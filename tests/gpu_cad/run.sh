#!/usr/bin/env bash
# run.sh -- CAD's CUDA data path on ONE GPU (not run by CI):
#   1. build (CUDA, sm_90a) the plugins and the test programs;
#   2. CAD on 1, 2, 3 and 4 ranks sharing the GPU, host-staged over the mpi communicator
#      (mpirun -np N cad_gpu_cad_tests), and NCCL with one rank (--nccl: also the CUDA-graph replay);
#   3. compute-sanitizer memcheck and racecheck on a small case;
#   4. the kernel tests of the cuda backend (tests/gpu), whose resident-plan path CAD uses.
# Logs under $OUT (default ./gpu_cad_out): summary.txt (printed at the end), build.log, cad_np*.log,
# sanitizer logs. Usage: bash tests/gpu_cad/run.sh [--skip-build]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu_cad_out}"
BUILD="${BUILD:-build-gpu}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -x NCCL_NVLS_ENABLE)
failed=0
record() {  # record NAME STATUS LOG
  local line="$1: $([ "$2" = 0 ] && echo passed || echo "FAILED (exit $2)")"
  [ -n "${3:-}" ] && line="$line -- $(grep -E '^\[  (PASSED|FAILED)  \]|worst relative' "$3" | tr '\n' ' ')"
  echo "$line" | tee -a "$SUMMARY"
  [ "$2" = 0 ] || { failed=1; [ -n "${3:-}" ] && grep -E 'Failure|FAILED|rank [0-9]+\]|error' "$3" | head -20 | tee -a "$SUMMARY"; }
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$SUMMARY"

if [ "${1:-}" != --skip-build ]; then
  start=$(date +%s)
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
    cmake --build "$BUILD" -j "$(nproc)" --target cad_gpu_cad_tests cad_gpu_tests cad_plugin_cad cad_plugin_cuda \
      cad_plugin_mpi cad_plugin_nccl cad_plugin_reference cad_plugin_colocated cad_plugin_per_doc_cp \
      cad_plugin_distca cad_plugin_prefix_aware test_cad_comm; } > "$OUT/build.log" 2>&1
  rc=$?
  echo "build rc=$rc in $(( $(date +%s) - start )) s" | tee -a "$SUMMARY"
  if [ "$rc" != 0 ]; then tail -40 "$OUT/build.log"; exit 1; fi
fi
BIN="$BUILD/bin/cad_gpu_cad_tests"

# CAD's host all_gathers reach a device communicator as device memory (a fake communicator checks it).
timeout 60 "$BUILD/bin/test_cad_comm" > "$OUT/cad_comm.log" 2>&1
record "cad comm: host all_gather staged through the GPU" $? "$OUT/cad_comm.log"

for n in 1 2 3 4; do
  timeout 300 "${MPIRUN[@]}" -np "$n" "$BIN" > "$OUT/cad_np$n.log" 2>&1
  record "cad host-staged mpi np=$n" $? "$OUT/cad_np$n.log"
done
timeout 300 "${MPIRUN[@]}" -np 1 "$BIN" --nccl > "$OUT/cad_nccl.log" 2>&1
record "cad nccl np=1 (graph replay included)" $? "$OUT/cad_nccl.log"

# Faults (host-staged, 2 processes on the GPU): rank 1 skips a forward (the other must time out after 3 s
# and exit with an error) or dies mid-step (the launcher ends the job). Bounded: a hang hits `timeout`.
for fault in skip kill; do
  start=$(date +%s)
  CAD_TEST_FAULT=$fault timeout 90 "${MPIRUN[@]}" -x CAD_TEST_FAULT -np 2 "$BIN" --gtest_filter='CadGpuFault.*' \
    > "$OUT/cad_fault_$fault.log" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  # Expected: a non-zero exit that is not the timeout's (124), within the bound.
  ok=1; { [ "$rc" != 0 ] && [ "$rc" != 124 ]; } && ok=0
  record "fault '$fault' on rank 1 (host-staged np=2): job exit $rc after ${took} s; $(grep -m1 "after rank 1's fault" "$OUT/cad_fault_$fault.log" | cut -c1-160)" $ok
done

if command -v compute-sanitizer > /dev/null; then
  for tool in memcheck racecheck; do
    # Host-staged with one rank: NCCL's own start-up probes would show up as API errors.
    timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 17 "$BIN" \
      --gtest_filter='CadGpu.BitwiseReproducible:CadGpu.BadCalls*' > "$OUT/sanitizer_$tool.log" 2>&1
    rc=$?
    record "compute-sanitizer $tool (host-staged np=1) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | tail -1)" $rc
    grep -E -A4 'Race reported|Invalid|Error:' "$OUT/sanitizer_$tool.log" | head -24 | tee -a "$SUMMARY"
  done
fi

timeout 300 "$BUILD/bin/cad_gpu_tests" > "$OUT/kernel_tests.log" 2>&1
record "cuda backend kernel tests" $? "$OUT/kernel_tests.log"
echo "---- summary ----"
cat "$SUMMARY"
exit $failed
