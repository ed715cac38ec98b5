#!/usr/bin/env bash
# run.sh -- GPU checks of the "nccl" communicator, for a machine with 4 GPUs (not run by CI):
#   1. build the project with CUDA (only the targets needed here);
#   2. `mpirun -np 4 cad conformance cad_nccl.so` -- correctness on device buffers, mismatched counts,
#      and the timeout check (one rank skips a barrier: the others must report TIMEOUT, nobody hangs);
#   3. all-to-all bandwidth: our all_to_all_v (bench/nccl/bench_all_to_all.cpp) against
#      torch.distributed.all_to_all_single on the NCCL backend (bench/nccl/torch_all_to_all.py), same
#      bytes, 1 MiB .. 1 GiB per rank, and the table of both (bench/nccl/compare.py).
# Everything is logged under $OUT (default: ./gpu_comm_out). Usage: bash tests/gpu_comm/run.sh
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

step "machine"
{ nvidia-smi -L; nvidia-smi topo -m; nvcc --version | tail -1; mpirun --version | head -1;
  python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'; } 2>&1 | tee "$OUT/machine.txt"

step "build ($JOBS jobs)"
if ! { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON -DCAD_BUILD_TESTS=OFF \
         -DCMAKE_CUDA_ARCHITECTURES=90a &&
       cmake --build "$BUILD" -j "$JOBS" --target cad cad_plugin_nccl bench_nccl_all_to_all; } > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  echo "build failed (full log: $OUT/build.log)"
  exit 1
fi
PLUGIN="$BUILD/lib/cad/plugins/cad_nccl.so"

step "conformance: mpirun -np $NGPU cad conformance cad_nccl.so"
timeout 120 "${MPIRUN[@]}" "$BUILD/bin/cad" conformance "$PLUGIN" --verbose > "$OUT/conformance.log" 2>&1 || failed=1
step "conformance again with the opt-in byte-count check (config verify_counts), appended to conformance.log"
{ echo "===== --quick --config '{\"verify_counts\": true}'";
  timeout 60 "${MPIRUN[@]}" "$BUILD/bin/cad" conformance "$PLUGIN" --quick --verbose --config '{"verify_counts": true}'; } \
  > "$OUT/conformance_verify.tmp" 2>&1 || failed=1
echo "-- default config"; grep -E "^(FAIL|SKIP|conformance:)|rank_skips|mismatched|large" "$OUT/conformance.log" | sort | uniq -c
echo "-- verify_counts"; grep -E "^(FAIL|SKIP|conformance:)|rank_skips|mismatched" "$OUT/conformance_verify.tmp" | sort | uniq -c
cat "$OUT/conformance_verify.tmp" >> "$OUT/conformance.log" && rm -f "$OUT/conformance_verify.tmp"

step "bandwidth: ours (all_to_all_v through the plugin ABI; default non-blocking NCCL communicator)"
timeout 90 "${MPIRUN[@]}" "$BUILD/bin/bench_nccl_all_to_all" "$PLUGIN" --csv "$OUT/ours.csv" 2>&1 | tee "$OUT/bench.log" || failed=1
step "bandwidth: ours with config blocking_comm (a blocking NCCL communicator)"
timeout 90 "${MPIRUN[@]}" "$BUILD/bin/bench_nccl_all_to_all" "$PLUGIN" --csv "$OUT/ours_blocking.csv" \
  --config '{"blocking_comm": true}' --label ours_blocking 2>&1 | tee -a "$OUT/bench.log" || failed=1

step "bandwidth: torch.distributed.all_to_all_single (NCCL backend)"
timeout 120 python3 bench/nccl/torch_all_to_all.py --gpus "$NGPU" --csv "$OUT/torch.csv" 2>&1 | tee -a "$OUT/bench.log" || failed=1

step "table"
python3 bench/nccl/compare.py "$OUT/torch.csv" "$OUT/ours.csv" "$OUT/ours_blocking.csv" 2>&1 | tee "$OUT/table.md" || failed=1
exit $failed
