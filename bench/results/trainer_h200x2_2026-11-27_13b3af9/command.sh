#!/bin/bash
# 4-GPU host: two 2-GPU rounds at once (GPUs 0,1 and 2,3) of prefix_aware against prefix_aware+pp at
# 64K and 128K, 7 steps, no timing syncs; then a profiled +pp step at 64K on GPUs 0,1 (Chrome traces).
set -u
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R; nvidia-smi -L > $R/gpus.txt
S=$(date +%s)
OUT=$R/build ONLY=build bash tests/multi_gpu/run.sh > $R/build.log 2>&1
echo "build exit $? after $(( $(date +%s) - S )) s" | tee -a $R/build.log
for pair in $(seq 0 $(( ${PAIRS:-2} - 1 ))); do
  ( [ $pair = 1 ] && sleep 3
    CUDA_VISIBLE_DEVICES=$(( 2 * pair )),$(( 2 * pair + 1 )) NGPU=2 OUT=$R/round$pair ONLY=train CONTEXTS="65536 131072" \
    STEPS=7 LAYERS="65536:2 131072:2" CONFIGS=local_balanced,prefix_aware,prefix_aware+pp \
    TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=${TA:-330} bash tests/multi_gpu/run.sh > $R/round$pair.log 2>&1
    echo "round$pair exit $? after $(( $(date +%s) - S )) s" >> $R/round$pair.log ) &
done
wait
tar -czf $OUT/r.tgz -C $OUT r
if [ $(( $(date +%s) - S )) -lt 450 ]; then
  CUDA_VISIBLE_DEVICES=0,1 NGPU=2 OUT=$R/t ONLY=train CONTEXTS=65536 STEPS=2 LAYERS=65536:2 PROFILE_STEP=1 \
    TRAINER_ARGS='--profile-trace --sync-attention-timing off' CONFIGS=prefix_aware,prefix_aware+pp TRAIN_BUDGET_S=100 \
    bash tests/multi_gpu/run.sh > $R/t.log 2>&1
  echo "t exit $? after $(( $(date +%s) - S )) s" >> $R/t.log
  for f in $R/t/*_trace_rank*.json; do [ -f "$f" ] && gzip -6 "$f"; done
fi
tar -czf $OUT/r.tgz -C $OUT r
grep -h "passed\|FAILED\|exit\|not run\|budget" $R/*.log
for p in $(seq 0 $(( ${PAIRS:-2} - 1 ))); do grep -h "^| 64K\|^| 128K" $R/round$p/table.md | cut -d'|' -f2-5,10-12,16 | head -6; done
ls -la $R/t 2>/dev/null | head
