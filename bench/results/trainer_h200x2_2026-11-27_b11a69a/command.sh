#!/bin/bash
# A/B on 2 GPUs: prefix_aware against +blocking (NCCL blocking communicator), +tol0.005, +pp+blocking,
# with local and local_balanced (the measured ideal), 64K and 128K tokens per GPU, 2 layers, 5 steps.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
R=$OUT/r; mkdir -p $R; cp .bench_data/g2a.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
NGPU=2 OUT=$R/a ONLY=build,train CONTEXTS="65536 131072" STEPS=5 LAYERS="65536:2 131072:2" \
  CONFIGS=local,local_balanced,prefix_aware,prefix_aware+blocking,prefix_aware+tol0.005,prefix_aware+pp+blocking,prefix_aware+pp \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=440 TAR=$OUT/a.tgz \
  bash tests/multi_gpu/run.sh > $R/a.log 2>&1
tail -40 $R/a.log
python3 tests/multi_gpu/table.py $R/a 2>&1 | tail -60
