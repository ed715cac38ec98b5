#!/bin/bash
# On 2 GPUs: how many head groups. Through host memory (NCCL_P2P_DISABLE=1; an earlier run: hg4 1.011x of local
# Where unsplit CAD was 0.988x): prefix_aware, +hg4, +hg8 with local, local_balanced; then on NVLink (earlier runs: hg2
# 9-20 ms slower than unsplit) prefix_aware, +hg4, with local, local_balanced. 64K, 1 round each, 2 layers, 5 steps.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
R=$OUT/r; mkdir -p $R; cp .bench_data/g2t.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
T=$OUT/all.tgz
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=2 OUT=$R/c ONLY=build TAR=$T bash tests/multi_gpu/run.sh > $R/c.log 2>&1; t build rc=$?
NCCL_P2P_DISABLE=1 NGPU=2 OUT=$R/host SKIP_BUILD=1 ONLY=train CONTEXTS="65536" STEPS=5 LAYERS="65536:2" \
  CONFIGS=local,local_balanced,prefix_aware,prefix_aware+hg4,prefix_aware+hg8 \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=200 TAR=$T \
  bash tests/multi_gpu/run.sh > $R/host.log 2>&1; t train through host memory rc=$?
NGPU=2 OUT=$R/nvlink SKIP_BUILD=1 ONLY=train CONTEXTS="65536" STEPS=5 LAYERS="65536:2" \
  CONFIGS=local,local_balanced,prefix_aware,prefix_aware+hg4 \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=200 TAR=$T \
  bash tests/multi_gpu/run.sh > $R/nvlink.log 2>&1; t train on nvlink rc=$?
rm -f $R/c/build.log; tar -czf $T -C $R .
for d in $R/host $R/nvlink; do echo "== $d"; python3 tests/multi_gpu/table.py $d | grep -E "^\| 64K" | cut -d'|' -f2-12; done
