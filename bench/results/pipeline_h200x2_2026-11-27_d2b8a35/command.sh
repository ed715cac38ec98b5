#!/bin/bash
# On 2 GPUs: PP=2, 4 layers; both bubble pools (GPipe cad_bubble, 1F1B 1f1b_cad_bubble) against their locals
# and cad_tick, at 4 x 128K, then 8 x 64K. No timing syncs.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
R=$OUT/r; mkdir -p $R; cp .bench_data/g2f.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
T=$OUT/all.tgz
PP=2 OUT=$R/p128 CONTEXTS=131072 MICRO_BATCHES=4 CONFIGS=local,cad_tick,cad_bubble,1f1b_local,1f1b_cad_bubble,local_balanced STEPS=3 \
  TRAINER_ARGS="--sync-attention-timing off" PIPE_BUDGET_S=300 TAR=$T bash tests/multi_gpu/pipeline.sh > $R/p128.log 2>&1
PP=2 OUT=$R/p64 SKIP_BUILD=1 CONTEXTS=65536 MICRO_BATCHES=8 CONFIGS=local,cad_bubble,1f1b_local,1f1b_cad_bubble STEPS=3 \
  TRAINER_ARGS="--sync-attention-timing off" PIPE_BUDGET_S=170 TAR=$T bash tests/multi_gpu/pipeline.sh > $R/p64.log 2>&1
tar -czf $T -C $R .
tail -10 $R/p128.log; tail -8 $R/p64.log
