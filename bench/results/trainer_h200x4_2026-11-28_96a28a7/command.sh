#!/bin/bash
# On 4 GPUs: head groups where each rank's moved rows go to 3 peers (on 2 H200s over NVLink hg2/hg4 were
# 9-20 ms slower than unsplit, runs 38-42; through host memory hg4 won 62 ms). Build, then 64K, 2 rounds: local,
# local_balanced (the ideal), prefix_aware, +hg2, +hg4; Llama-8B shape, 2 layers, 5 steps.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
R=$OUT/r; mkdir -p $R; cp .bench_data/g4a.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
T=$OUT/all.tgz
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=4 OUT=$R/c ONLY=build TAR=$T bash tests/multi_gpu/run.sh > $R/c.log 2>&1; t build rc=$?
NGPU=4 OUT=$R/a SKIP_BUILD=1 ONLY=train CONTEXTS="65536" STEPS=5 LAYERS="65536:2" ROUNDS=2 \
  CONFIGS=local,local_balanced,prefix_aware,prefix_aware+hg2,prefix_aware+hg4 \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=380 TAR=$T \
  bash tests/multi_gpu/run.sh > $R/a.log 2>&1; t train rc=$?
rm -f $R/c/build.log; tar -czf $T -C $R .
tail -3 $R/a/summary.txt | cut -c1-200
python3 tests/multi_gpu/table.py $R/a/round* 2>&1 | tail -8; for d in $R/a/round*; do python3 tests/multi_gpu/table.py $d | grep -A8 "comm ms" | grep "^| 64K"; done
