#!/bin/bash
# On 2 GPUs: PP=2, 4 layers, GPipe, 4 micro-batches of 128K: local against CAD only in the bubble ticks.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
R=$OUT/r; mkdir -p $R; cp .bench_data/g2bubble.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
T=$OUT/all.tgz; PP=2 OUT=$R/p128 CONTEXTS=131072 MICRO_BATCHES=4 CONFIGS=local,cad_bubble STEPS=3 TRAINER_ARGS="--sync-attention-timing off" \
  PIPE_BUDGET_S=170 TAR=$T bash tests/multi_gpu/pipeline.sh > $R/p128.log 2>&1
tail -12 $R/p128.log
