#!/bin/bash
# 4-GPU host: build; (a) GPUs 0,1 the trainer at 64K/128K, ping-pong through cad.PingPongLayer, no timing
# syncs, at once with (b) GPUs 2,3 the pipeline PP=2 at 64K x 4; then (c) all 4 GPUs the trainer at 64K/128K.
set -u
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R; nvidia-smi -L > $R/gpus.txt
S=$(date +%s)
OUT=$R/build ONLY=build bash tests/multi_gpu/run.sh > $R/build.log 2>&1
echo "build exit $? after $(( $(date +%s) - S )) s" | tee -a $R/build.log
( CUDA_VISIBLE_DEVICES=0,1 NGPU=2 OUT=$R/a ONLY=train CONTEXTS="65536 131072" STEPS=4 LAYERS="65536:2 131072:2" \
  CONFIGS=local,torch_varlen,local_balanced,prefix_aware,prefix_aware+pp TRAINER_ARGS="--sync-attention-timing off" \
  TRAIN_BUDGET_S=${TA:-290} bash tests/multi_gpu/run.sh > $R/a.log 2>&1
  echo "a exit $? after $(( $(date +%s) - S )) s" >> $R/a.log ) &
( sleep 5; CUDA_VISIBLE_DEVICES=2,3 NGPU=2 PP=2 OUT=$R/p SKIP_BUILD=1 CONTEXTS=65536 MICRO_BATCHES=4 \
  CONFIGS=local,cad_tick STEPS=3 PIPE_BUDGET_S=${TP:-270} TRAINER_ARGS="--sync-attention-timing off" \
  bash tests/multi_gpu/pipeline.sh > $R/p.log 2>&1
  echo "p exit $? after $(( $(date +%s) - S )) s" >> $R/p.log ) &
wait
tar -czf $OUT/r.tgz -C $OUT r
LEFT=$(( ${LIMIT:-585} - ($(date +%s) - S) ))
if [ $LEFT -gt 150 ]; then
  NGPU=4 OUT=$R/c ONLY=train CONTEXTS="65536 131072" STEPS=4 LAYERS="65536:2 131072:2" \
    CONFIGS=local,torch_varlen,local_balanced,per_doc_cp,distca,prefix_aware,prefix_aware+pp \
    TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=$(( LEFT - 15 )) bash tests/multi_gpu/run.sh > $R/c.log 2>&1
  echo "c exit $? after $(( $(date +%s) - S )) s" >> $R/c.log
fi
tar -czf $OUT/r.tgz -C $OUT r
grep -h "passed\|FAILED\|exit\|not run\|budget" $R/*.log; cat $R/a/table.md $R/c/table.md 2>/dev/null | grep -v "^$"; cat $R/p/table.md
grep -h "^step" $R/a/train_all_*.log | grep -i "ping-pong\|nan"
