#!/bin/bash
# Kernel profile (one H200): the project's sm_90a forward and backward kernels on dense causal 16K/64K and CAD
# shard batches: 5 rounds of cad_kernel_bench, then Nsight Compute sections (speed of light, compute and memory
# workload, occupancy, warp states, scheduler) for one forward and one backward launch of each profiled case,
# and the kernels' resource usage (registers, shared memory, spills) from cuobjdump.
set -u
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*" | tee -a $OUT/steps.txt; }
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee $OUT/gpu.txt
git log -1 --format=%H > $OUT/commit.txt 2>/dev/null || cp build-data/commit.txt $OUT/commit.txt
B=build-gpu
{ cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
  cmake --build $B -j16 --target cad_kernel_bench; } > $OUT/build.log 2>&1
t "build rc=$?"; tail -2 $OUT/build.log
BIN=$(find $B -name cad_kernel_bench -type f | head -1); t "bench at $BIN"
for r in 1 2 3 4 5; do
  $BIN bench/kernels/pretrain_batches.txt dense_causal > $OUT/bench_dense_r$r.csv 2>> $OUT/bench.err
  $BIN bench/kernels/pretrain_batches.txt shards_ > $OUT/bench_shards_r$r.csv 2>> $OUT/bench.err
  $BIN bench/kernels/pretrain_batches.txt pretrain > $OUT/bench_pretrain_r$r.csv 2>> $OUT/bench.err
  t "round $r rc=$?"
done
cuobjdump -res-usage $BIN 2>&1 | grep -A1 -E "attention_(fwd|bwd)_sm90" | head -40 > $OUT/res_usage.txt; t "res-usage"
SEC="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats"
for c in dense_causal_16k dense_causal_64k shards_mixed_q128-8k_kv16k-128k; do
  for k in fwd bwd; do
    timeout 150 ncu --clock-control none -k regex:attention_${k}_sm90 -s 2 -c 1 $SEC $BIN bench/kernels/pretrain_batches.txt $c \
      > $OUT/ncu_${c}_${k}.txt 2>&1
    t "ncu $c $k rc=$?"
  done
done
t done
