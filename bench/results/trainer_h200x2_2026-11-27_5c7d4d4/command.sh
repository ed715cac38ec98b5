#!/bin/bash
# 2-GPU call, the step-overheads table after the read-back fix and the ping-pong hand-over (HEAD): 64K, 128K
# (2 layers) and 256K (1 layer); every baseline and the measured ideal; ping-pong forced and on its own decision.
set -u
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R; nvidia-smi -L > $R/gpus.txt
S=$(date +%s)
NGPU=2 OUT=$R/a TAR=$OUT/a.tgz ONLY=build,train CONTEXTS="65536 131072 262144" STEPS=4 \
  LAYERS="65536:2 131072:2 262144:1" \
  CONFIGS=local,torch_varlen,local_balanced,distca,prefix_aware,prefix_aware+ppauto,prefix_aware+pp \
  TRAIN_BUDGET_S=${TB:-540} bash tests/multi_gpu/run.sh > $R/a.log 2>&1
echo "a exit $? after $(( $(date +%s) - S )) s" >> $R/a.log
rm -f $OUT/a.tgz; tar -czf $OUT/r.tgz -C $OUT r
grep -h "passed\|FAILED\|exit\|not run\|budget" $R/a.log; grep -A12 "^### " $R/a/table.md | cut -c1-400
