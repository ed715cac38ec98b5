#!/bin/bash
# 2 GPUs: copy engines against NCCL's kernels at 128K (larger messages,
# where the copy engines' bandwidth is 0.73-0.82x of NCCL's): prefix_aware, prefix_aware+ce; 1 round, 4 steps.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
R=$OUT/r; mkdir -p $R; cp .bench_data/g2zb.sh $R/command.sh
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=2 OUT=$R/a ONLY=build,train CONTEXTS="131072" STEPS=4 LAYERS="131072:2" CONFIGS=prefix_aware,prefix_aware+ce \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=150 bash tests/multi_gpu/run.sh > $R/a.log 2>&1
t build+train rc=$?
rm -f $R/a/build.log; tar -czf $OUT/all.tgz -C $R .
python3 tests/multi_gpu/table.py $R/a | grep -E "^\| 128K" | cut -c1-200
