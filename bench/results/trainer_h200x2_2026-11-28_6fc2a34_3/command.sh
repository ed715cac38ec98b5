#!/bin/bash
# On 2 GPUs: head groups with the dynamic forward walk at 64K (earlier runs: hg2 slower than unsplit by 12 and
# 20 ms at 64K, 128K), 2 rounds, same warm machine: local, local_balanced, prefix_aware, +dyn, +hg2+dyn.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
R=$OUT/r; mkdir -p $R; cp .bench_data/g2r.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
T=$OUT/all.tgz
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=2 OUT=$R/a SKIP_BUILD=1 ONLY=train CONTEXTS="65536" STEPS=5 LAYERS="65536:2" ROUNDS=2 \
  CONFIGS=local,local_balanced,prefix_aware,prefix_aware+dyn,prefix_aware+hg2+dyn \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=200 TAR=$T \
  bash tests/multi_gpu/run.sh > $R/a.log 2>&1; t train rc=$?
tar -czf $T -C $R .
python3 tests/multi_gpu/table.py $R/a/round* 2>&1 | tail -8; for d in $R/a/round*; do python3 tests/multi_gpu/table.py $d | grep -A8 "comm ms" | grep "^| 64K"; done
