#!/bin/bash
# On 2 GPUs: the dynamic walk in the step. Build; the GPU correctness stage over NCCL (its keep
# instances run the own tasks in place on a cuda instance leaving 16 SMs and walking dynamically, as the
# package does); the trainer at 64K, 2 layers, 5 steps: local, local_balanced (the measured ideal), prefix_aware,
# +dyn (the server's forward walking dynamically), the own tasks in place on every SM (res0) / leaving 16 (res16),
# both with +dyn; then an A/B of the forward kernels (HEAD before the walk / static / dynamic), 4 rounds.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
R=$OUT/r; mkdir -p $R; cp .bench_data/g2l.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
T=$OUT/all.tgz
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=2 OUT=$R/c ONLY=build,correctness TAR=$T bash tests/multi_gpu/run.sh > $R/c.log 2>&1; t build+correctness rc=$?
grep -E "passed|failed|FAILED" $R/c.log | tail -3
( bash bench/kernels/build_timer.sh build-base .bench_data/base > $R/base_build.log 2>&1
  bash bench/kernels/build_timer.sh build-gpu > /dev/null 2>$R/timer_err.log
  CAD_TIMER_DEFINES=-DCAD_TIMER_DYNAMIC_WALK CAD_TIMER_SUFFIX=_dyn bash bench/kernels/build_timer.sh build-gpu > /dev/null 2>>$R/timer_err.log ) &
NGPU=2 OUT=$R/a SKIP_BUILD=1 ONLY=train CONTEXTS="65536" STEPS=5 LAYERS="65536:2" \
  CONFIGS=local,local_balanced,prefix_aware,prefix_aware+dyn,prefix_aware+own+res0,prefix_aware+own+res16+dyn,prefix_aware+own+res0+dyn \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=260 TAR=$T \
  bash tests/multi_gpu/run.sh > $R/a.log 2>&1; t train rc=$?
wait; t timers
rm -f $R/c/build.log; tar -czf $T -C $R .
python3 tests/multi_gpu/table.py $R/a 2>&1 | grep -E "^\| (64K|128K)" | cut -d'|' -f2-12
LIBS="--lib base=build-base/lib/libcad_kernel_timer.so --lib static=build-gpu/lib/libcad_kernel_timer.so --lib dynamic=build-gpu/lib/libcad_kernel_timer_dyn.so"
LEFT=$(( 560 - ($(date +%s) - S) ))
timeout $LEFT python3 bench/kernels/ab_bench.py $LIBS --dense 16384,65536 --head-dims 128 --rounds 4 --deadline $(( LEFT - 15 )) \
  --filter prefix_aware_s4_ --filter prefix_aware_s8_ --filter prefix_aware_s16_t64k --md $R/ab.md --json $R/ab.json > $R/ab.log 2>&1; t ab rc=$?
tar -czf $T -C $R .
tail -8 $R/ab.md
