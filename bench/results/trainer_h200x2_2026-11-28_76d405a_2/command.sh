#!/bin/bash
# 2 GPUs: 128K, one round: the baselines, prefix_aware, ping-pong of halves (+pp) and of micro-batch pairs (+ppmb).
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$OUT/r; mkdir -p $R; cp .bench_data/g2zk.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
T=$OUT/all.tgz
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=2 OUT=$R/c ONLY=build bash tests/multi_gpu/run.sh > $R/c.log 2>&1; t checks rc=$?
grep -E "passed|FAIL" $R/c/summary.txt | tail -12
rm -f $R/c/build.log; tar -czf $T -C $R .
left=$(( 585 - ($(date +%s) - S) ))
NGPU=2 OUT=$R/a SKIP_BUILD=1 ONLY=train CONTEXTS="131072" STEPS=4 LAYERS="131072:1" ROUNDS=1 \
  CONFIGS=local,local_balanced,prefix_aware,prefix_aware+pp,prefix_aware+ppmb \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=$left TAR=$T bash tests/multi_gpu/run.sh > $R/a.log 2>&1
t train rc=$?
tar -czf $T -C $R .
python3 tests/multi_gpu/table.py $R/a 2>&1 | head -14
