#!/bin/bash
# On 2 GPUs: head groups at 128K (an earlier run at 64K: hg2 2385 against 2373 ms unsplit, 2 rounds); same warm
# machine, no build: local, local_balanced (the ideal), prefix_aware, prefix_aware+hg2; 2 layers, 5 steps.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
R=$OUT/r; mkdir -p $R; cp .bench_data/g2q.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
T=$OUT/all.tgz
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=2 OUT=$R/a SKIP_BUILD=1 ONLY=train CONTEXTS="131072" STEPS=5 LAYERS="131072:2" \
  CONFIGS=local,local_balanced,prefix_aware,prefix_aware+hg2 \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=300 TAR=$T \
  bash tests/multi_gpu/run.sh > $R/a.log 2>&1; t train rc=$?
tar -czf $T -C $R .
python3 tests/multi_gpu/table.py $R/a 2>&1 | grep -E "^\| 128K"
