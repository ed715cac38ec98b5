#!/bin/bash
# 2 GPUs: where the critical rank's CAD calls spend their time beyond the server compute at
# 64K: one profiled step (step 2's batch) with timelines, local_balanced and prefix_aware+ce.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$OUT/r; mkdir -p $R; cp .bench_data/g2ze.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=2 OUT=$R/c ONLY=build bash tests/multi_gpu/run.sh > $R/c.log 2>&1; t build rc=$?
NGPU=2 OUT=$R/a SKIP_BUILD=1 ONLY=train CONTEXTS="65536" STEPS=4 LAYERS="65536:2" PROFILE_STEP=2 \
  CONFIGS=local_balanced,prefix_aware+ce \
  TRAINER_ARGS="--sync-attention-timing off --profile-trace" TRAIN_BUDGET_S=300 bash tests/multi_gpu/run.sh > $R/a.log 2>&1
t train rc=$?
ls -la $R/a
gzip -9 $R/a/*trace*.json
rm -f $R/c/build.log; tar -czf $OUT/all.tgz -C $R .
ls -la $OUT
