#!/usr/bin/env bash
# run.sh -- CAD across several GPUs of one host over NCCL (issue 16; needs nvidia-h200-x2 or -x4, not run by CI):
#   1. build (CUDA, sm_90a) the plugins, the GPU tests and the benchmarks (SKIP_BUILD=1 reuses $BUILD);
#   2. correctness: mpirun -np NGPU cad_gpu_cad_tests --nccl (one process per GPU: every balancer, bf16, GQA,
#      odd lengths, documents cut across ranks, keep/re-send, planned/one-shot, the CUDA-graph replay,
#      bad calls, a stream of another GPU);
#   3. faults over NCCL: rank 1 skips a forward, or dies mid-step; every survivor must exit with an error
#      within the timeout (3 s) plus a margin -- never hang;
#   4. the end-to-end step: examples/train_llama.py --configs under torchrun (one process per context), Llama
#      shape (hidden 4096, 32 heads, 8 KV heads, MLP 14336), bf16, Pretrain batches of 64K/128K/256K tokens per GPU, local attention vs
#      per_doc_cp, distca and prefix_aware, and distca and prefix_aware again with --ping-pong (two
#      nano-batches per GPU, a plan each, layers through cad.ping_pong; with ping-pong the per-rank attention
#      times count only the enqueue, so those runs give step times). Layers: LAYER_TOKENS / context (default
#      256K token-layers: 4 layers at 64K, 2 at 128K, 1 at 256K), so that every context's activations take the
#      same memory (about 55 GB without recomputation) and fit an 80 GB H100; the table (table.py) comes last.
#      After the STEPS=6 timed steps, step PROFILE_STEP's batch (default 3) runs again under torch.profiler: per
#      rank, GPU kernel time by family (attention, cad data path, nccl, gemm) in train_<name>_profile_rank<R>.json;
#   5. all_to_all_v bandwidth: ours through the plugin ABI against torch.distributed.all_to_all_single
#      (bench/nccl, the same steps as tests/gpu_comm/run.sh), 1 MiB .. 1 GiB per rank.
# Usage: NGPU=4 bash tests/multi_gpu/run.sh  (NGPU=1 is the dry run on one GPU; TRAINER_ARGS='--gc freeze'
# adds trainer options to every run). Logs under $OUT; with
# TAR=FILE everything under $OUT is also packed into FILE after every step (what the device tool brings back:
# at most 8 files), so that a run cut short still returns what it finished.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/multi_gpu_out}"
BUILD="${BUILD:-build-gpu}"
NGPU="${NGPU:-$(nvidia-smi -L | wc -l)}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --allow-run-as-root -np "$NGPU" --mca btl self,vader -x NCCL_NVLS_ENABLE)
export CAD_DATA="${CAD_DATA:-$PWD/../shared/data/doclen_pretrain.json}"
[ -f "$CAD_DATA" ] || CAD_DATA="$PWD/.bench_data/doclen_pretrain.json"
failed=0
pack() { if [ -n "${TAR:-}" ]; then tar -czf "$TAR.tmp" -C "$OUT" . && mv -f "$TAR.tmp" "$TAR"; fi; }
record() {  # record NAME STATUS
  echo "$1: $([ "$2" = 0 ] && echo passed || echo "FAILED (exit $2)") [$(date +%H:%M:%S)]" | tee -a "$SUMMARY"
  [ "$2" = 0 ] || failed=1
  pack
}
nvidia-smi -L | tee -a "$SUMMARY"
[ "${SKIP_BUILD:-0}" = 1 ] || { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
  cmake --build "$BUILD" -j "$(nproc)" --target cad_gpu_cad_tests cad_plugin_cad cad_plugin_cuda cad_plugin_mpi \
    cad_plugin_nccl cad_plugin_host cad_plugin_reference cad_plugin_colocated cad_plugin_per_doc_cp cad_plugin_distca \
    cad_plugin_prefix_aware cad bench_nccl_all_to_all test_cad_comm; } > "$OUT/build.log" 2>&1
record "build" $? || true
[ "$failed" = 0 ] || { tail -30 "$OUT/build.log"; exit 1; }

timeout 60 "$BUILD/bin/test_cad_comm" > "$OUT/cad_comm.log" 2>&1
record "CAD's host all_gather staged through the GPU (fake communicator)" $?
timeout 600 "${MPIRUN[@]}" "$BUILD/bin/cad_gpu_cad_tests" --nccl > "$OUT/cad_nccl.log" 2>&1
record "CAD over NCCL on $NGPU GPUs (one process per GPU)" $?
grep -E "worst relative|FAILED|Failure" "$OUT/cad_nccl.log" | head -20 | tee -a "$SUMMARY"

if [ "$NGPU" -ge 2 ]; then
  for fault in skip kill; do
    start=$(date +%s)
    CAD_TEST_FAULT=$fault timeout 120 "${MPIRUN[@]}" -x CAD_TEST_FAULT "$BUILD/bin/cad_gpu_cad_tests" --nccl \
      --gtest_filter='CadGpuFault.*' > "$OUT/fault_$fault.log" 2>&1
    rc=$?
    ok=1; { [ "$rc" != 0 ] && [ "$rc" != 124 ]; } && ok=0
    record "fault '$fault' on rank 1 over NCCL: job exit $rc after $(( $(date +%s) - start )) s" $ok
    grep "after rank 1's fault" "$OUT/fault_$fault.log" | tee -a "$SUMMARY"
  done
fi

# The end-to-end step. Per context one torchrun trains every configuration in turn (--configs: one start-up of
# about 25 s instead of six); a configuration whose JSON is missing afterwards (the process died, e.g. out of
# memory) is run again alone, so one failure costs only itself. Its log says which.
CONFIGS="${CONFIGS:-local,prefix_aware,per_doc_cp,distca,prefix_aware+pp,distca+pp}"
trainer() {  # trainer LOG ARGS...
  local log="$1"; shift
  timeout 1500 python3 -m torch.distributed.run --standalone --nproc-per-node "$NGPU" examples/train_llama.py \
    --device cuda --hidden 4096 --intermediate 14336 --heads 32 --kv-heads 8 --steps "${STEPS:-6}" \
    --profile-step "${PROFILE_STEP:-3}" ${TRAINER_ARGS:-} "$@" > "$log" 2>&1
}
export CAD_PLUGIN_PATH="$PWD/$BUILD/lib/cad/plugins" CAD_HOST_LIBRARY="$PWD/$BUILD/lib/libcad_host.so"
export PYTHONPATH="$PWD/host_adapter/python"
for ctx in ${CONTEXTS:-65536 131072 262144}; do
  layers=$(( ${LAYER_TOKENS:-262144} / ctx )); [ "$layers" -ge 1 ] || layers=1
  trainer "$OUT/train_all_${ctx}.log" --configs "$CONFIGS" --context "$ctx" --layers "$layers" \
    --json-out "$OUT/train_{config}_${ctx}.json"
  record "train $CONFIGS at $ctx tokens/GPU (one process)" $?
  for config in ${CONFIGS//,/ }; do
    name="${config/+pp/_pingpong}"
    if [ -f "$OUT/train_${name}_${ctx}.json" ]; then
      python3 -c "import json,sys; print('summary', json.dumps(json.load(open(sys.argv[1]))['summary']))" \
        "$OUT/train_${name}_${ctx}.json" | tee -a "$SUMMARY"
    else
      trainer "$OUT/train_${name}_${ctx}.log" --configs "$config" --context "$ctx" --layers "$layers" \
        --json-out "$OUT/train_{config}_${ctx}.json"
      record "train $name at $ctx alone (missing after the shared run)" $?
    fi
  done
  python3 tests/multi_gpu/table.py "$OUT" > "$OUT/table.md" 2>&1; pack
done
cat "$OUT/table.md"

if [ "$NGPU" -ge 2 ]; then  # the wire: ours against torch's all-to-all, same bytes (bench/nccl)
  timeout 120 "${MPIRUN[@]}" "$BUILD/bin/bench_nccl_all_to_all" "$BUILD/lib/cad/plugins/cad_nccl.so" \
    --csv "$OUT/a2a_ours.csv" > "$OUT/a2a.log" 2>&1
  record "all_to_all_v bandwidth: ours" $?
  timeout 180 python3 bench/nccl/torch_all_to_all.py --gpus "$NGPU" --csv "$OUT/a2a_torch.csv" >> "$OUT/a2a.log" 2>&1
  record "all_to_all bandwidth: torch" $?
  python3 bench/nccl/compare.py "$OUT/a2a_torch.csv" "$OUT/a2a_ours.csv" > "$OUT/a2a_table.md" 2>&1
  record "all-to-all table" $?
  cat "$OUT/a2a_table.md"
fi
echo "---- summary ----"
cat "$SUMMARY"
exit $failed
