#!/bin/bash
# 2 GPUs: build; CAD over NCCL correctness; the GPU test program (HostStaging's test,
# never run before); then the trainer at 64K/128K, no timing syncs, against ../trainer_h200x2_2026-11-27_00fd4de/ (pinned uploads).
set -u
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R; nvidia-smi -L > $R/gpus.txt
S=$(date +%s)
OUT=$R/c ONLY=build,correctness bash tests/multi_gpu/run.sh > $R/c.log 2>&1
echo "build+correctness exit $? after $(( $(date +%s) - S )) s" | tee -a $R/c.log
cmake --build build-gpu -j 16 --target cad_gpu_tests > $R/gt_build.log 2>&1
echo "gpu tests build exit $? after $(( $(date +%s) - S )) s" | tee -a $R/gt_build.log
timeout 150 build-gpu/bin/cad_gpu_tests --gtest_brief=1 > $R/gpu_tests.log 2>&1
echo "gpu tests exit $? after $(( $(date +%s) - S )) s" | tee -a $R/gpu_tests.log
tar -czf $OUT/r.tgz -C $OUT r
LEFT=$(( ${LIMIT:-585} - ($(date +%s) - S) ))
NGPU=2 OUT=$R/a ONLY=train CONTEXTS="65536 131072" STEPS=5 LAYERS="65536:2 131072:2" \
  CONFIGS=local,torch_varlen,local_balanced,prefix_aware,prefix_aware+pp TRAINER_ARGS="--sync-attention-timing off" \
  TRAIN_BUDGET_S=$(( LEFT - 15 )) bash tests/multi_gpu/run.sh > $R/a.log 2>&1
echo "a exit $? after $(( $(date +%s) - S )) s" >> $R/a.log
tar -czf $OUT/r.tgz -C $OUT r
cat $R/c/summary.txt; tail -3 $R/gpu_tests.log; grep -h "FAILED\|Failure" $R/gpu_tests.log | head; grep -h "exit\|budget\|not run" $R/a.log
cat $R/a/table.md | grep -v "^$" | cut -c1-400
