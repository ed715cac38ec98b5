#!/bin/bash
# 2 GPUs (~8 min): CAD over NCCL on 2 GPUs with the one-collective exchange after its
# refactors (correctness, faults), then 64K, 2 rounds: the baselines, prefix_aware, the trainer's ppauto fix
# (b40b85b), forced ping-pong of halves (+pp) and of micro-batch pairs (+ppmb, new).
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$OUT/r; mkdir -p $R; cp .bench_data/g2zj.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
T=$OUT/all.tgz
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=2 OUT=$R/c ONLY=build,correctness,faults bash tests/multi_gpu/run.sh > $R/c.log 2>&1; t checks rc=$?
grep -E "passed|FAIL" $R/c/summary.txt | tail -12
rm -f $R/c/build.log; tar -czf $T -C $R .
left=$(( 580 - ($(date +%s) - S) ))
NGPU=2 OUT=$R/a SKIP_BUILD=1 ONLY=train CONTEXTS="65536" STEPS=5 LAYERS="65536:2" ROUNDS=2 \
  CONFIGS=local,local_balanced,prefix_aware,prefix_aware+ppauto,prefix_aware+pp,prefix_aware+ppmb \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=$left TAR=$T bash tests/multi_gpu/run.sh > $R/a.log 2>&1
t train rc=$?
tar -czf $T -C $R .
python3 tests/multi_gpu/table.py $R/a/round* 2>&1 | head -14
