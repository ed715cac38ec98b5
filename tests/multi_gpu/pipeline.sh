#!/usr/bin/env bash
# pipeline.sh -- the pipeline-parallel trainer (examples/train_pipeline.py) on 2 GPUs of one host: GPipe
# with PP=2 (DP=1), --model llama3-8b with --layers 4 (2 decoder layers per stage), full activation checkpointing,
# Pretrain-recipe micro-batches of CONTEXTS tokens (default 32768 65536) and MICRO_BATCHES per step (default 4 8),
# every configuration of CONFIGS (default local,local_balanced,torch_varlen,cad_tick,cad_bubble,cad_stage,
# 1f1b_local,1f1b_cad_bubble: the trainer's --configs names; local_balanced is the measured ideal, the 1f1b_ ones
# run the 1F1B schedule beside the GPipe ones; the bubble pools were the fastest at 4 x 128K in bench/results/pipeline_h200x2_2026-11-27_d2b8a35{,_2}) trained in turn by one torchrun
# per (context, micro-batches) from the same weights on the same batches, STEPS steps each (default 3: step 0
# warms up). Then tests/multi_gpu/pipeline_table.py prints a table per (context, micro-batches): step ms, tokens/s,
# speedup over local, the ideal speedup, the realised share, and the mean per-tick attention imbalance measured,
# planned (after) and colocated (before).
#
# Usage (from anywhere; needs nvidia-h100-x2 or larger, not run by CI):
#   bash tests/multi_gpu/pipeline.sh                  # builds first (tests/multi_gpu/run.sh's build stage)
#   SKIP_BUILD=1 BUILD=build-gpu bash tests/multi_gpu/pipeline.sh   # a tree built already
# Environment: PP (default 2: pipeline stages; DP = NGPU / PP), OUT (default ./pipeline_out: JSON per configuration pipe_<context>_<micro-batches>_<config>.json,
# logs, table.md, summary.txt), BUILD (default build-gpu), NGPU (default 2; the world),
# PIPE_BUDGET_S (default 300: the whole training time; a torchrun that would start with less than 60 s left is
# skipped, one running out of time is stopped and the table has what finished), CONTEXTS, MICRO_BATCHES, CONFIGS,
# STEPS, LAYERS (default 4), CHECKPOINTING (default full), TRAINER_ARGS (added to every run), CAD_DATA (default
# ../shared/data/doclen_pretrain.json, as run.sh), TAR (pack OUT into this file after every run).
#
# Time (measured on 2 H200s, bench/results/gpu_h200x2_2026-11-27_c6bcbc7, pipeline_h200x2_2026-11-27_b11a69a): a step takes ~2.4 s at 32K x 4, ~5 s at 64K x 4,
# ~9.8 s at 64K x 8 and ~11.8 s at 128K x 4 (GPipe; 1F1B ~3% more); a torchrun spends ~30 s starting, then per
# configuration STEPS steps and ~10 s of set-up: at 64K x 8 three configurations took 120 s, at 128K x 4 six took
# 240 s. The default budget (300 s) covers the 32K runs and part of the 64K ones; PIPE_BUDGET_S=900 covers all four.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/pipeline_out}"
BUILD="${BUILD:-build-gpu}"
NGPU="${NGPU:-2}"
# shellcheck source=stage_log.sh
. tests/multi_gpu/stage_log.sh
nvidia-smi -L | tee -a "$SUMMARY"

if [ "${SKIP_BUILD:-0}" != 1 ]; then  # run.sh's build stage: libcad_host and the plugins, CUDA, sm_90a
  OUT="$OUT/build" BUILD="$BUILD" ONLY=build bash tests/multi_gpu/run.sh > "$OUT/build_stage.log" 2>&1
  record "build (tests/multi_gpu/run.sh ONLY=build, into $BUILD)" $?
  [ "$failed" = 0 ] || { tail -30 "$OUT/build_stage.log"; exit 1; }
fi

export CAD_PLUGIN_PATH="$PWD/$BUILD/lib/cad/plugins" CAD_HOST_LIBRARY="$PWD/$BUILD/lib/libcad_host.so"
export PYTHONPATH="$PWD/host_adapter/python"
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"  # as run.sh's train stage
if [ ! -f "$CAD_PLUGIN_PATH/cad_cad.so" ] || [ ! -f "$CAD_HOST_LIBRARY" ]; then
  echo "no plugins in $CAD_PLUGIN_PATH (or no $CAD_HOST_LIBRARY): build first (drop SKIP_BUILD)" | tee -a "$SUMMARY"
  exit 1
fi

CONFIGS="${CONFIGS:-local,local_balanced,torch_varlen,cad_tick,cad_bubble,cad_stage,1f1b_local,1f1b_cad_bubble}"
deadline=$(( $(date +%s) + ${PIPE_BUDGET_S:-300} ))
for ctx in ${CONTEXTS:-32768 65536}; do
  for mb in ${MICRO_BATCHES:-4 8}; do
    allowed=$(( deadline - $(date +%s) ))
    if [ "$allowed" -lt 60 ]; then
      echo "pipeline at $ctx tokens x $mb micro-batches: not run, the ${PIPE_BUDGET_S:-300} s budget is spent" |
        tee -a "$SUMMARY"
      continue
    fi
    cmd=(python3 -m torch.distributed.run --standalone --nproc-per-node "$NGPU" examples/train_pipeline.py
         --device cuda --pp "${PP:-2}" --model llama3-8b --layers "${LAYERS:-4}" --checkpointing "${CHECKPOINTING:-full}"
         --context "$ctx" --micro-batches "$mb" --steps "${STEPS:-3}" --configs "$CONFIGS"
         --json-out "$OUT/pipe_${ctx}_${mb}_{config}.json" ${TRAINER_ARGS:-})
    echo "+ timeout $allowed ${cmd[*]}" | tee -a "$SUMMARY"
    timeout "$allowed" "${cmd[@]}" > "$OUT/pipe_${ctx}_${mb}.log" 2>&1
    rc=$?
    if [ "$rc" = 124 ]; then  # the budget, not a failure: the table has what finished
      echo "pipeline at $ctx x $mb: stopped by the budget after $allowed s [$(date +%H:%M:%S)]" | tee -a "$SUMMARY"
    else
      record "pipeline $CONFIGS at $ctx tokens x $mb micro-batches" $rc
      [ "$rc" = 0 ] || tail -20 "$OUT/pipe_${ctx}_${mb}.log" | tee -a "$SUMMARY"
    fi
    python3 tests/multi_gpu/pipeline_table.py "$OUT" > "$OUT/table.md" 2>&1
    record "pipeline table after $ctx x $mb" $?
  done
done
cat "$OUT/table.md"
echo "---- summary ----"
cat "$SUMMARY"
exit $failed
