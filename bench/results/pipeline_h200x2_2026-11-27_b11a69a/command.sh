#!/bin/bash
# On 2 GPUs: PP=2, 4 layers, 4 micro-batches of 128K tokens, GPipe and 1F1B, local and CAD per tick
# (no timing syncs), then local and 1f1b_local again with synchronised attention timing (for the ideal).
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
R=$OUT/r; mkdir -p $R; cp .bench_data/g2pipe.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
PP=2 OUT=$R/p CONTEXTS=131072 MICRO_BATCHES=4 CONFIGS=local,cad_tick,1f1b_local,1f1b_cad_tick STEPS=3 \
  TRAINER_ARGS="--sync-attention-timing off" PIPE_BUDGET_S=320 TAR=$OUT/p.tgz bash tests/multi_gpu/pipeline.sh > $R/p.log 2>&1
PP=2 OUT=$R/psync SKIP_BUILD=1 CONTEXTS=131072 MICRO_BATCHES=4 CONFIGS=local,1f1b_local STEPS=3 \
  TRAINER_ARGS="--sync-attention-timing on" PIPE_BUDGET_S=190 TAR=$OUT/psync.tgz bash tests/multi_gpu/pipeline.sh > $R/psync.log 2>&1
tail -15 $R/p.log; tail -12 $R/psync.log
