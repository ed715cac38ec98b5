#!/bin/bash
# 4-GPU run: the pipeline trainer with PP=2 x DP=2, 32K tokens x 4 micro-batches, local against cad_tick.
set -u
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R; nvidia-smi -L > $R/gpus.txt
S=$(date +%s)
NGPU=4 OUT=$R/p TAR=$OUT/p.tgz CONTEXTS=32768 MICRO_BATCHES=4 CONFIGS=local,cad_tick STEPS=3 PIPE_BUDGET_S=170 \
  bash tests/multi_gpu/pipeline.sh > $R/p.log 2>&1
echo "p exit $? after $(( $(date +%s) - S )) s" >> $R/p.log
rm -f $OUT/p.tgz; tar -czf $OUT/r.tgz -C $OUT r
tail -12 $R/p.log
