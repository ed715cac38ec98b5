#!/usr/bin/env bash
# run.sh -- GPU checks of the "nccl" communicator, for a machine with 4 GPUs (not run by CI):
#   1. build the project with CUDA (only the targets needed here);
#   2. `mpirun -np 4 cad conformance cad_nccl.so` -- correctness on device buffers, mismatched counts,
#      and the timeout check (one rank skips a barrier: the others must report TIMEOUT, nobody hangs);
#   3. the host bootstrap (tests/gpu_comm/host_bootstrap.sh): NGPU ranks as threads and as processes,
#      each with its own cad_host_t lending bootstrap_all_gather, config "bootstrap": "host"/"auto";
#      collectives verified byte for byte, and the refusals/failures of that path;
#   4. all-to-all bandwidth: our all_to_all_v (bench/nccl/bench_all_to_all.cpp) against
#      torch.distributed.all_to_all_single on the NCCL backend (bench/nccl/torch_all_to_all.py), same
#      bytes, 1 MiB .. 1 GiB per rank, and the table of both (bench/nccl/compare.py).
# Everything is logged under $OUT (default: ./gpu_comm_out) in 8 files (what the device tool brings
# back): summary.txt (the machine, then one line per step; printed at the end), build.log,
# conformance.log (with the host bootstrap's output appended), bench.log, the three CSVs and table.md.
# Usage: bash tests/gpu_comm/run.sh   (NGPU=2 on a 2-GPU machine)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu_comm_out}"
mkdir -p "$OUT"
NGPU="${NGPU:-4}"
JOBS="${JOBS:-$(nproc)}"
BUILD="${BUILD:-build-gpu}"
# NVLink multicast (NVLS) stays off: on shared hosts it can take the GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export PYTHONUNBUFFERED=1
MPIRUN=(mpirun --allow-run-as-root -np "$NGPU" -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST
        -x NVSHMEM_DISABLE_NVLS -x NCCL_DEBUG)
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
failed=0
step() { printf '\n== %s [%s]\n' "$*" "$(date +%H:%M:%S)"; }
SUMMARY="$OUT/summary.txt"  # begins with the machine step's output
record() {  # record NAME EXIT_STATUS: one line in $SUMMARY; a nonzero status fails the run
  if [ "$2" = 0 ]; then echo "$1: passed" >> "$SUMMARY"; else echo "$1: FAILED (exit $2)" >> "$SUMMARY"; failed=1; fi
}

step "machine"
{ nvidia-smi -L; nvidia-smi topo -m; nvcc --version | tail -1; mpirun --version | head -1;
  python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'; } 2>&1 | tee "$SUMMARY"

step "build ($JOBS jobs)"
if ! { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON -DCAD_BUILD_TESTS=OFF \
         -DCMAKE_CUDA_ARCHITECTURES=90a &&
       cmake --build "$BUILD" -j "$JOBS" --target cad cad_plugin_nccl bench_nccl_all_to_all \
         cad_nccl_host_bootstrap_test; } > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  echo "build failed (full log: $OUT/build.log)"
  echo "build: FAILED (see build.log)" >> "$SUMMARY"
  exit 1
fi
PLUGIN="$BUILD/lib/cad/plugins/cad_nccl.so"

step "conformance: mpirun -np $NGPU cad conformance cad_nccl.so"
timeout 120 "${MPIRUN[@]}" "$BUILD/bin/cad" conformance "$PLUGIN" --verbose > "$OUT/conformance.log" 2>&1
record "conformance (mpirun -np $NGPU, default config)" $?
step "conformance again with the opt-in byte-count check (config verify_counts), appended to conformance.log"
{ echo "===== --quick --config '{\"verify_counts\": true}'";
  timeout 60 "${MPIRUN[@]}" "$BUILD/bin/cad" conformance "$PLUGIN" --quick --verbose --config '{"verify_counts": true}'; } \
  > "$OUT/conformance_verify.tmp" 2>&1
record "conformance (--quick, verify_counts)" $?
echo "-- default config"; grep -E "^(FAIL|SKIP|conformance:)|rank_skips|mismatched|large" "$OUT/conformance.log" | sort | uniq -c
echo "-- verify_counts"; grep -E "^(FAIL|SKIP|conformance:)|rank_skips|mismatched" "$OUT/conformance_verify.tmp" | sort | uniq -c
cat "$OUT/conformance_verify.tmp" >> "$OUT/conformance.log" && rm -f "$OUT/conformance_verify.tmp"

step "host bootstrap: $NGPU ranks as threads, then as processes, bootstrapped through the host's all-gather"
# Appends its own line to $SUMMARY and its output to conformance.log.
SKIP_BUILD=1 BUILD="$BUILD" OUT="$OUT" NGPU="$NGPU" LOG="$OUT/conformance.log" bash tests/gpu_comm/host_bootstrap.sh ||
  failed=1

step "bandwidth: ours (all_to_all_v through the plugin ABI; default non-blocking NCCL communicator)"
timeout 90 "${MPIRUN[@]}" "$BUILD/bin/bench_nccl_all_to_all" "$PLUGIN" --csv "$OUT/ours.csv" 2>&1 | tee "$OUT/bench.log"
record "bandwidth: ours" $?
step "bandwidth: ours with config blocking_comm (a blocking NCCL communicator)"
timeout 90 "${MPIRUN[@]}" "$BUILD/bin/bench_nccl_all_to_all" "$PLUGIN" --csv "$OUT/ours_blocking.csv" \
  --config '{"blocking_comm": true}' --label ours_blocking 2>&1 | tee -a "$OUT/bench.log"
record "bandwidth: ours_blocking" $?

step "bandwidth: torch.distributed.all_to_all_single (NCCL backend)"
timeout 120 python3 bench/nccl/torch_all_to_all.py --gpus "$NGPU" --csv "$OUT/torch.csv" 2>&1 | tee -a "$OUT/bench.log"
record "bandwidth: torch" $?

step "table"
python3 bench/nccl/compare.py "$OUT/torch.csv" "$OUT/ours.csv" "$OUT/ours_blocking.csv" 2>&1 | tee "$OUT/table.md"
record "table" $?

step "summary ($SUMMARY)"
cat "$SUMMARY"
exit $failed
