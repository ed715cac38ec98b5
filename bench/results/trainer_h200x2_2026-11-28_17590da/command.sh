#!/bin/bash
# On 2 GPUs: the static walk restored as it was (the hand-off only under the dynamic walk), checked by
# the kernel tests and an A/B (HEAD before the walk / static / dynamic); the own tasks in place with their
# collective launched on the calling thread (+blocking: a blocking NCCL communicator), so that its kernel is on
# the GPU before the own tasks' forward: on every SM (res0, dynamic walk), with NCCL on at most 8 CTAs, leaving
# 16 SMs; against prefix_aware and prefix_aware+blocking; 64K, 2 layers, 5 steps.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
R=$OUT/r; mkdir -p $R; cp .bench_data/g2m.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
T=$OUT/all.tgz
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=2 OUT=$R/c ONLY=build TAR=$T bash tests/multi_gpu/run.sh > $R/c_build.log 2>&1; t build rc=$?
cmake --build build-gpu -j 16 --target cad_gpu_tests > $R/k_build.log 2>&1; t test build rc=$?
timeout 150 build-gpu/bin/cad_gpu_tests --gtest_filter='*DynamicWalk*:Gpu/AttentionVsReference.*' > $R/k.log 2>&1; t kernel tests rc=$?
tail -1 $R/k.log
( bash bench/kernels/build_timer.sh build-base .bench_data/base > $R/base_build.log 2>&1
  bash bench/kernels/build_timer.sh build-gpu > /dev/null 2>$R/timer_err.log
  CAD_TIMER_DEFINES=-DCAD_TIMER_DYNAMIC_WALK CAD_TIMER_SUFFIX=_dyn bash bench/kernels/build_timer.sh build-gpu > /dev/null 2>>$R/timer_err.log ) &
NGPU=2 OUT=$R/a SKIP_BUILD=1 ONLY=train CONTEXTS="65536" STEPS=5 LAYERS="65536:2" \
  CONFIGS=local,local_balanced,prefix_aware,prefix_aware+blocking,prefix_aware+own+res0+blocking,prefix_aware+own+res0+blocking+ctas8,prefix_aware+own+res16+blocking \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=240 TAR=$T \
  bash tests/multi_gpu/run.sh > $R/a.log 2>&1; t train rc=$?
wait; t timers
tar -czf $T -C $R .
python3 tests/multi_gpu/table.py $R/a 2>&1 | grep -E "^\| (64K|128K)" | cut -d'|' -f2-12
LIBS="--lib base=build-base/lib/libcad_kernel_timer.so --lib static=build-gpu/lib/libcad_kernel_timer.so --lib dynamic=build-gpu/lib/libcad_kernel_timer_dyn.so"
LEFT=$(( 560 - ($(date +%s) - S) ))
timeout $LEFT python3 bench/kernels/ab_bench.py $LIBS --dense 16384,65536 --head-dims 128 --rounds 4 --deadline $(( LEFT - 15 )) \
  --filter prefix_aware_s4_ --filter prefix_aware_s8_ --filter prefix_aware_s16_t64k --md $R/ab.md --json $R/ab.json > $R/ab.log 2>&1; t ab rc=$?
tar -czf $T -C $R .
tail -6 $R/ab.md
