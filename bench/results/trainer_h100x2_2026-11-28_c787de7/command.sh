#!/bin/bash
# The Hopper forward's dynamic walk (each block takes the next untaken unit), on 2 GPUs:
# build; the dynamic-walk kernel tests; an A/B of the forward (HEAD before the change / static / dynamic) on dense
# and CAD server batches; the GPU correctness stage over NCCL (its keep instances run the own tasks in place);
# the trainer at 64K: local, local_balanced (the measured ideal), prefix_aware, the own tasks in place with their
# forward on every SM (res0) or leaving 16, and the server's forward walking dynamically (+dyn).
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
R=$OUT/r; mkdir -p $R; cp .bench_data/g2k.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
T=$OUT/all.tgz
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=2 OUT=$R/c ONLY=build TAR=$T bash tests/multi_gpu/run.sh > $R/c_build.log 2>&1; t build rc=$?
( bash bench/kernels/build_timer.sh build-base .bench_data/base > $R/base_build.log 2>&1; echo "rc=$?" >> $R/base_build.log ) &
cmake --build build-gpu -j 12 --target cad_gpu_tests cad_gpu_cad_tests test_cad_comm cad_plugin_mpi > $R/k_build.log 2>&1; t test build rc=$?
timeout 90 build-gpu/bin/cad_gpu_tests --gtest_filter='*DynamicWalk*' > $R/k_walk.log 2>&1; t walk tests rc=$?
bash bench/kernels/build_timer.sh build-gpu > /dev/null 2>$R/timer_err.log
CAD_TIMER_DEFINES=-DCAD_TIMER_DYNAMIC_WALK CAD_TIMER_SUFFIX=_dyn bash bench/kernels/build_timer.sh build-gpu > /dev/null 2>>$R/timer_err.log
wait; t timers; tail -1 $R/base_build.log
LIBS="--lib base=build-base/lib/libcad_kernel_timer.so --lib static=build-gpu/lib/libcad_kernel_timer.so --lib dynamic=build-gpu/lib/libcad_kernel_timer_dyn.so"
timeout 120 python3 bench/kernels/ab_bench.py $LIBS --dense 16384,65536 --head-dims 128 --rounds 2 --deadline 100 \
  --filter prefix_aware_s4_ --filter prefix_aware_s8_ --md $R/ab.md --json $R/ab.json > $R/ab.log 2>&1; t ab rc=$?
tar -czf $T -C $R .
NGPU=2 OUT=$R/c SKIP_BUILD=1 ONLY=correctness TAR=$T bash tests/multi_gpu/run.sh > $R/c.log 2>&1; t correctness rc=$?
grep -E "passed|failed|FAILED" $R/c.log | tail -4
NGPU=2 OUT=$R/a SKIP_BUILD=1 ONLY=train CONTEXTS="65536" STEPS=5 LAYERS="65536:2" \
  CONFIGS=local,local_balanced,prefix_aware,prefix_aware+own+res0,prefix_aware+own+res16,prefix_aware+dyn \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=280 TAR=$T \
  bash tests/multi_gpu/run.sh > $R/a.log 2>&1; t train rc=$?
rm -f $R/c/build.log; tar -czf $T -C $R .
tail -22 $R/ab.md
python3 tests/multi_gpu/table.py $R/a 2>&1 | grep -E "^\| (64K|128K)" | cut -d'|' -f2-12
