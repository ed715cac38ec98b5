#!/bin/bash
# On 2 GPUs: PP=2, 4 layers; GPipe and 1F1B, local / local_balanced (the measured ideal) / CAD per tick;
# 4 micro-batches of 128K tokens, then 8 micro-batches of 64K. Timing syncs off.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
R=$OUT/r; mkdir -p $R; cp .bench_data/g2pipe2.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
C=local,local_balanced,cad_tick,1f1b_local,1f1b_local_balanced,1f1b_cad_tick
PP=2 OUT=$R/p128 CONTEXTS=131072 MICRO_BATCHES=4 CONFIGS=$C STEPS=3 TRAINER_ARGS="--sync-attention-timing off" \
  PIPE_BUDGET_S=320 bash tests/multi_gpu/pipeline.sh > $R/p128.log 2>&1
tar -czf $OUT/all.tgz -C $R .
PP=2 OUT=$R/p64 SKIP_BUILD=1 CONTEXTS=65536 MICRO_BATCHES=8 CONFIGS=local,local_balanced,cad_tick STEPS=3 TRAINER_ARGS="--sync-attention-timing off" \
  PIPE_BUDGET_S=180 bash tests/multi_gpu/pipeline.sh > $R/p64.log 2>&1
rm -rf $R/p128/build; tar -czf $OUT/all.tgz -C $R .
tail -14 $R/p128.log; tail -14 $R/p64.log
