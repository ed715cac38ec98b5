#!/bin/bash
# 2 GPUs: 256K with the new data path (one collective per direction, own rows off the wire),
# the default communicator (NCCL): local, local_balanced, prefix_aware; 3 steps, one round.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$OUT/r; mkdir -p $R; cp .bench_data/g2zh.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=2 OUT=$R/k256 ONLY=build,train CONTEXTS="262144" STEPS=3 LAYERS="262144:1" \
  CONFIGS=local,local_balanced,prefix_aware \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=230 bash tests/multi_gpu/run.sh > $R/k256.log 2>&1
t train 256K rc=$?
rm -f $R/k256/build.log; tar -czf $OUT/all.tgz -C $R .
grep -E "^\| 256K" $R/k256/table.md | head -4 | cut -c1-140
