#!/bin/bash
# 2 GPUs: the checks left from the commits before (build, correctness incl. copy engines, faults incl. the
# copy-engine skip), then 64K, 2 rounds: ping-pong over the copy engines (lead 2 of note h).
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$OUT/r; mkdir -p $R; cp .bench_data/g2zd.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
T=$OUT/all.tgz
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=2 OUT=$R/c ONLY=build,correctness,faults bash tests/multi_gpu/run.sh > $R/c.log 2>&1; t checks rc=$?
tail -25 $R/c.log
rm -f $R/c/build.log; tar -czf $T -C $R .
NGPU=2 OUT=$R/a SKIP_BUILD=1 ONLY=train CONTEXTS="65536" STEPS=5 LAYERS="65536:2" ROUNDS=2 \
  CONFIGS=local,local_balanced,prefix_aware+ce,prefix_aware+pp+ce,prefix_aware+ppauto+ce \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=330 TAR=$T bash tests/multi_gpu/run.sh > $R/a.log 2>&1
t train rc=$?
tar -czf $T -C $R .
python3 tests/multi_gpu/table.py $R/a/round* 2>&1 | tail -8
for d in $R/a/round*; do python3 tests/multi_gpu/table.py $d | grep -A8 "comm ms\|server fwd ms" | grep "^| 64K"; done
