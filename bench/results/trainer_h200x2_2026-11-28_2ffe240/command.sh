#!/bin/bash
# 2 GPUs: the GPU checks left from the commits before (correctness over NCCL on 2 GPUs, with the new
# CallTimesCountEveryCall; the pack kernel tests; host-staged np 1-4 on one GPU), then the step table at 64K with the
# calls timed on the GPU (gpu_calls): local, local_balanced, prefix_aware, prefix_aware+time (time balancing with
# the fitted pairs table, always the time plan); 2 rounds, 2 layers, 5 steps.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$OUT/r; mkdir -p $R; cp .bench_data/g2v.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
T=$OUT/all.tgz
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=2 OUT=$R/c ONLY=build,correctness bash tests/multi_gpu/run.sh > $R/c.log 2>&1; t build+correctness rc=$?
tail -4 $R/c/summary.txt
grep -E "OK \] CadGpu\.CallTimes|FAILED|Failure" $R/c/cad_nccl.log | sort | uniq -c | head -12
B=build-gpu
cmake --build $B -j 32 --target cad_gpu_tests > $R/k_build.log 2>&1; t kernel tests build rc=$?
timeout 120 $B/bin/cad_gpu_tests --gtest_filter='GpuPack.*' > $R/pack.log 2>&1; t pack tests rc=$?
tail -2 $R/pack.log; grep -E "FAILED|Failure" $R/pack.log | head -5
for n in 1 2 3 4; do
  CUDA_VISIBLE_DEVICES=0 timeout 200 mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np $n \
    $B/bin/cad_gpu_cad_tests --gtest_filter='-CadGpuFault.*' > $R/staged_np$n.log 2>&1
  t host-staged np=$n rc=$? $(grep -E '^\[  (PASSED|FAILED)' $R/staged_np$n.log | tr '\n' ' ')
  grep -E "FAILED|Failure" $R/staged_np$n.log | head -5
done
NGPU=2 OUT=$R/a SKIP_BUILD=1 ONLY=train CONTEXTS="65536" STEPS=5 LAYERS="65536:2" ROUNDS=2 \
  CONFIGS=local,local_balanced,prefix_aware,prefix_aware+time \
  TRAINER_ARGS="--sync-attention-timing off --balancer-rate-table bench/results/rate_table_h200/rate_table_h200_units_pairs.json --balancer-min-time-gain 0" \
  TRAIN_BUDGET_S=300 TAR=$T bash tests/multi_gpu/run.sh > $R/a.log 2>&1; t train rc=$?
rm -f $R/c/build.log; tar -czf $T -C $R .
python3 tests/multi_gpu/table.py $R/a/round* 2>&1 | tail -6
for d in $R/a/round*; do python3 tests/multi_gpu/table.py $d | grep -B1 -A6 "server fwd ms" | grep "^| 64K"; done
