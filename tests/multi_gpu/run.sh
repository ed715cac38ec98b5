#!/usr/bin/env bash
# run.sh -- CAD across several GPUs of one host over NCCL (needs nvidia-h100-x2 or larger; not run by CI).
# Stages (ONLY=comma list picks some; default all):
#   build        (CUDA, sm_90a) the plugins, libcad_host, the GPU tests and the benchmarks the stages below need;
#   correctness  mpirun -np NGPU cad_gpu_cad_tests --nccl (one process per GPU: every balancer, bf16, GQA, odd
#                lengths, documents cut across ranks, keep/re-send, planned/one-shot, the CUDA-graph replay, bad
#                calls, a stream of another GPU), and CAD's staged host all-gather (fake communicator); with 2+ GPUs
#                also the nccl plugin's copy_engines: `cad conformance` and the same CAD tests over it;
#   faults       over NCCL: rank 1 skips a forward, or dies mid-step; every survivor must exit with an error within
#                the timeout (3 s) plus a margin -- never hang; the skip also over copy_engines (its GPU waits);
#   train        the trainer users run: examples/train_llama.py under torchrun, one process per context training
#                every configuration in turn (--configs): --model llama3-8b (hidden 4096, 32 heads, 8 KV heads,
#                MLP 14336, vocab 128256), FSDP2 (bf16 compute, fp32 master weights), full activation
#                checkpointing, 2 micro-batches per step (each its own Pretrain batch and CAD plan), CONTEXTS
#                tokens per GPU and micro-batch; configurations local (the project's kernels), torch_varlen
#                (torch's varlen_attn), per_doc_cp, distca, prefix_aware, each also with +pp (ping-pong); then
#                tests/multi_gpu/table.py (a table per context);
#   bandwidth    all_to_all_v: ours through the plugin ABI against torch.distributed.all_to_all_single.
# Usage: NGPU=2 bash tests/multi_gpu/run.sh; ONLY=train bash tests/multi_gpu/run.sh (no build: $BUILD must hold
# the plugins and libcad_host already; ONLY=build,train builds only what training needs). SKIP_BUILD=1 is
# ONLY without build. Logs under $OUT; with TAR=FILE everything under $OUT is also packed into FILE after every
# stage (what the device tool brings back: at most 8 files), so that a run cut short still returns what it did.
#
# The train stage's time: a GPU run is given about 25 minutes of device time for everything, so this stage
# stops at TRAIN_BUDGET_S (default 480 s). Measured on 4 H200s (bench/results/multi_gpu_h200x4_2026-11-26_224ecd2{,_2}: vocab 1024, no
# recomputation, 1 micro-batch) one Llama-8B layer's forward + backward took ~0.3 s at 64K tokens, ~0.9 s at
# 128K and ~2.7 s at 256K (local attention, slowest rank); recomputation adds a forward (~1.3x), 2
# micro-batches double it, and the 128256-token head costs about 0.4 s per 64K tokens of a micro-batch. Hence
# the defaults: LAYERS='65536:2 131072:1 262144:1' (decoder layers per context; memory would allow more), STEPS=2
# (step 0 warms up, step 1 is timed: every configuration times the same batches), the estimate ~100 s at 64K,
# ~140 s at 128K and ~250 s at 256K. Each context's torchrun gets the budget left minus 90 s per context still
# to come; configurations are trained in CONFIGS' order (ping-pong ones last), so when time runs out the table
# lacks the last ones and the summary says which. More: TRAIN_BUDGET_S=900 STEPS=4 LAYERS='65536:8 ...'.
# ROUNDS=N trains the contexts N times (records in $OUT/round1..N; round k's configurations rotated by k - 1) and
# writes $OUT/table_pooled.md, the table pooled over the rounds (tests/multi_gpu/table.py with several folders):
# where one run's share of the gain varies (64K on 2 GPUs), quote the pooled one.
# TRAINER_ARGS adds trainer options to every run (e.g. '--gc freeze', or a Gemma-3-like layer pattern:
# '--window 4096 --global-every 6', or '--profile-trace' for a timeline of the profiled step); PROFILE_STEP=N (default off: it costs one
# more step per configuration) profiles step N's batch again after the timed steps, per rank, into
# train_<config>_<context>_profile_rank<R>.json (with '--profile-trace' also its timeline, _trace_rank<R>.json:
# `python3 tests/multi_gpu/trace_calls.py` says per CAD call what it paid beyond its attention on that rank).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/multi_gpu_out}"
BUILD="${BUILD:-build-gpu}"
NGPU="${NGPU:-$(nvidia-smi -L | wc -l)}"
ONLY="${ONLY:-build,correctness,faults,train,bandwidth}"
[ "${SKIP_BUILD:-0}" = 1 ] && ONLY="${ONLY//build/}"
want() { [[ ",$ONLY," == *",$1,"* ]]; }
# shellcheck source=stage_log.sh
. tests/multi_gpu/stage_log.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --allow-run-as-root -np "$NGPU" --mca btl self,vader -x NCCL_NVLS_ENABLE)
nvidia-smi -L | tee -a "$SUMMARY"
echo "stages: $ONLY" | tee -a "$SUMMARY"

if want build; then
  targets=(cad_host cad_plugin_cad cad_plugin_cuda cad_plugin_nccl cad_plugin_host cad_plugin_reference
           cad_plugin_colocated cad_plugin_per_doc_cp cad_plugin_distca cad_plugin_prefix_aware)
  { want correctness || want faults; } && targets+=(cad_gpu_cad_tests test_cad_comm cad_plugin_mpi cad)
  want bandwidth && targets+=(bench_nccl_all_to_all)
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
    cmake --build "$BUILD" -j "$(nproc)" --target "${targets[@]}"; } > "$OUT/build.log" 2>&1
  record "build (${targets[*]})" $?
  [ "$failed" = 0 ] || { tail -30 "$OUT/build.log"; exit 1; }
fi

if want correctness; then
  timeout 60 "$BUILD/bin/test_cad_comm" > "$OUT/cad_comm.log" 2>&1
  record "CAD's host all_gather staged through the GPU (fake communicator)" $?
  timeout 600 "${MPIRUN[@]}" "$BUILD/bin/cad_gpu_cad_tests" --nccl > "$OUT/cad_nccl.log" 2>&1
  record "CAD over NCCL on $NGPU GPUs (one process per GPU)" $?
  grep -E "worst relative|FAILED|Failure" "$OUT/cad_nccl.log" | head -20 | tee -a "$SUMMARY"
  if [ "$NGPU" -ge 2 ]; then  # all-to-alls by the copy engines (config copy_engines): one host, 2+ GPUs
    timeout 120 "${MPIRUN[@]}" "$BUILD/bin/cad" conformance "$BUILD/lib/cad/plugins/cad_nccl.so" \
      --config '{"copy_engines": true}' > "$OUT/conformance_copy_engines.log" 2>&1
    rc=$?
    record "conformance of cad_nccl.so with copy_engines ($NGPU ranks): $(grep -m1 -o 'conformance: .*' \
      "$OUT/conformance_copy_engines.log")" $rc
    timeout 600 "${MPIRUN[@]}" "$BUILD/bin/cad_gpu_cad_tests" --nccl --copy-engines --gtest_filter='-CadGpuFault.*' \
      > "$OUT/cad_copy_engines.log" 2>&1
    record "CAD over the copy engines on $NGPU GPUs" $?
    grep -E "worst relative|FAILED|Failure" "$OUT/cad_copy_engines.log" | head -20 | tee -a "$SUMMARY"
  fi
fi

if want faults && [ "$NGPU" -ge 2 ]; then
  for fault in skip kill; do
    start=$(date +%s)
    CAD_TEST_FAULT=$fault timeout 120 "${MPIRUN[@]}" -x CAD_TEST_FAULT "$BUILD/bin/cad_gpu_cad_tests" --nccl \
      --gtest_filter='CadGpuFault.*' > "$OUT/fault_$fault.log" 2>&1
    rc=$?
    ok=1; { [ "$rc" != 0 ] && [ "$rc" != 124 ]; } && ok=0
    record "fault '$fault' on rank 1 over NCCL: job exit $rc after $(( $(date +%s) - start )) s" $ok
    grep "after rank 1's fault" "$OUT/fault_$fault.log" | tee -a "$SUMMARY"
  done
  # The copy engines' waits are the GPU's: rank 0 must still come back (the watchdog releases them) and exit.
  start=$(date +%s)
  CAD_TEST_FAULT=skip timeout 120 "${MPIRUN[@]}" -x CAD_TEST_FAULT "$BUILD/bin/cad_gpu_cad_tests" --nccl \
    --copy-engines --gtest_filter='CadGpuFault.*' > "$OUT/fault_skip_copy_engines.log" 2>&1
  rc=$?
  ok=1; { [ "$rc" != 0 ] && [ "$rc" != 124 ]; } && ok=0
  record "fault 'skip' on rank 1 over the copy engines: job exit $rc after $(( $(date +%s) - start )) s" $ok
  grep "after rank 1's fault" "$OUT/fault_skip_copy_engines.log" | tee -a "$SUMMARY"
fi

if want train; then
  build_dir="$BUILD"; [[ "$build_dir" = /* ]] || build_dir="$PWD/$BUILD"  # BUILD may be relative or absolute
  export CAD_PLUGIN_PATH="$build_dir/lib/cad/plugins" CAD_HOST_LIBRARY="$build_dir/lib/libcad_host.so"
  # The checkout's package first; what the caller's PYTHONPATH holds stays behind it (FlashAttention-4 installed
  # with `pip install --target`, whose directory only PYTHONPATH names: without it `fa4` configurations fail).
  export PYTHONPATH="$PWD/host_adapter/python${PYTHONPATH:+:$PYTHONPATH}"
  # Long-context training fragments PyTorch's caching allocator: 32 layers at 64K on 4 H100s ran out of memory
  # with 8.5 GiB reserved but unallocated. Growable segments, as long-context users set them (same for every
  # configuration; a PYTORCH_CUDA_ALLOC_CONF given by the caller is kept).
  export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
  if [ ! -f "$CAD_PLUGIN_PATH/cad_cad.so" ] || [ ! -f "$CAD_HOST_LIBRARY" ]; then
    echo "train: no plugins in $CAD_PLUGIN_PATH (or no $CAD_HOST_LIBRARY): run with ONLY=build,train" | tee -a "$SUMMARY"
    exit 1
  fi
  CONFIGS="${CONFIGS:-local,torch_varlen,local_balanced,prefix_aware,distca,per_doc_cp,local+pp,torch_varlen+pp,prefix_aware+pp,distca+pp,per_doc_cp+pp}"
  CONTEXTS="${CONTEXTS:-65536 131072 262144}"
  LAYERS="${LAYERS:-65536:2 131072:1 262144:1}"
  layers_for() {  # the LAYERS entry of context $1, else LAYER_TOKENS / context (at least 1)
    local entry
    for entry in $LAYERS; do [ "${entry%%:*}" = "$1" ] && { echo "${entry##*:}"; return; }; done
    local n=$(( ${LAYER_TOKENS:-131072} / $1 )); [ "$n" -ge 1 ] || n=1; echo "$n"
  }
  deadline=$(( $(date +%s) + ${TRAIN_BUDGET_S:-480} ))
  trainer() {  # trainer SECONDS LOG ARGS...: one torchrun, at most SECONDS
    local seconds="$1" log="$2"; shift 2
    local cmd=(python3 -m torch.distributed.run --standalone --nproc-per-node "$NGPU" examples/train_llama.py
               --device cuda --model llama3-8b --parallel fsdp2 --checkpointing full
               --micro-batches "${MICRO_BATCHES:-2}" --steps "${STEPS:-2}" --profile-step "${PROFILE_STEP:--1}"
               ${TRAINER_ARGS:-} "$@")
    echo "+ timeout $seconds ${cmd[*]}" | tee -a "$SUMMARY"
    timeout "$seconds" "${cmd[@]}" > "$log" 2>&1
  }
  # Each configuration's JSON name, as the trainer names it (config<TAB>name lines; it also refuses bad CONFIGS,
  # against the model the training runs: +hgN must divide its heads).
  names=$(python3 examples/train_llama.py --model llama3-8b --micro-batches "${MICRO_BATCHES:-2}" ${TRAINER_ARGS:-} --configs "$CONFIGS" --list-configs) || {
    record "train: CONFIGS=$CONFIGS refused by the trainer" 1; exit 1; }
  # ROUNDS=N: the contexts N times, round k's records in $OUT/round<k> (N = 1: in $OUT), then one table pooled
  # over the rounds (table.py with several folders): at 64K the same configuration's share of the gain moved
  # 0.64-0.84 between identical runs on 2 H200s (bench/results/trainer_h200x2_2026-11-28_{c787de7,17590da*}).
  rounds="${ROUNDS:-1}"
  if ! [[ "$rounds" =~ ^[1-9][0-9]*$ ]]; then
    record "train: ROUNDS=$rounds is not a positive whole number" 1; exit 1
  fi
  set -- $CONTEXTS
  contexts_left=$(( rounds * $# ))
  round_dirs=()
  IFS=, read -r -a config_list <<< "$CONFIGS"
  for round in $(seq 1 "$rounds"); do
    ROUT="$OUT"
    if [ "$rounds" -gt 1 ]; then ROUT="$OUT/round$round"; mkdir -p "$ROUT"; round_dirs+=("$ROUT"); fi
    # Round k trains the configurations rotated by k - 1, so that no configuration always runs first (on a cold
    # GPU) or last.
    shift_by=$(( (round - 1) % ${#config_list[@]} ))
    round_configs=$(IFS=,; echo "${config_list[*]:shift_by},${config_list[*]:0:shift_by}")
    round_configs="${round_configs%,}"
    for ctx in $CONTEXTS; do
      contexts_left=$(( contexts_left - 1 ))
      layers=$(layers_for "$ctx")
      allowed=$(( deadline - $(date +%s) - 90 * contexts_left ))
      if [ "$allowed" -lt 60 ]; then
        echo "train at $ctx (round $round): not run, the ${TRAIN_BUDGET_S:-480} s budget is spent" | tee -a "$SUMMARY"
        continue
      fi
      trainer "$allowed" "$ROUT/train_all_${ctx}.log" --configs "$round_configs" --context "$ctx" --layers "$layers" \
        --json-out "$ROUT/train_{config}_${ctx}.json"
      rc=$?
      if [ "$rc" = 124 ]; then  # the budget, not a failure: the table has what finished
        echo "train at $ctx tokens/GPU and micro-batch, $layers layers (round $round): stopped by the budget after" \
          "${allowed} s [$(date +%H:%M:%S)]" | tee -a "$SUMMARY"
      else
        record "train $round_configs at $ctx tokens/GPU and micro-batch, $layers layers (one process, round $round)" $rc
      fi
      while IFS=$'\t' read -r config name; do
        if [ -f "$ROUT/train_${name}_${ctx}.json" ]; then
          python3 -c "import json,sys; print('summary', json.dumps(json.load(open(sys.argv[1]))['summary']))" \
            "$ROUT/train_${name}_${ctx}.json" | tee -a "$SUMMARY"
          continue
        fi
        # Missing after a failure (e.g. out of memory ends the process): alone again, if there is time for it.
        allowed=$(( deadline - $(date +%s) - 90 * contexts_left ))
        if [ "$rc" != 124 ] && [ "$allowed" -ge 120 ]; then
          trainer "$allowed" "$ROUT/train_${name}_${ctx}.log" --configs "$config" --context "$ctx" --layers "$layers" \
            --json-out "$ROUT/train_{config}_${ctx}.json"
          record "train $name at $ctx alone (missing after the shared run, round $round)" $?
        else
          echo "train $name at $ctx (round $round): not run (budget)" | tee -a "$SUMMARY"
        fi
      done <<< "$names"
      python3 tests/multi_gpu/table.py "$ROUT" > "$ROUT/table.md" 2>&1
      record "table of the runs at $ctx (round $round)" $?
    done
  done
  if [ "$rounds" -gt 1 ]; then
    python3 tests/multi_gpu/table.py "${round_dirs[@]}" > "$OUT/table_pooled.md" 2>&1
    record "pooled table of $rounds rounds" $?
    cat "$OUT/table_pooled.md"
  else
    cat "$OUT/table.md"
  fi
fi

if want bandwidth && [ "$NGPU" -ge 2 ]; then  # the wire: ours against torch's all-to-all, same bytes (bench/nccl)
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
