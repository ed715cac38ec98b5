#!/bin/bash
# 2 GPUs: correctness over NCCL with the packed instances (PackedExchangesGiveThePerTensorResults),
# Then the step table at 64K: fewer, larger collectives (packed_exchange) against per-tensor ones. The run before measured the
# server compute balanced to 1.005-1.007 on the GPU and the calls' time beyond compute 40-44 ms per step, the
# exchange's stall 33-42 ms of it. local, local_balanced, prefix_aware, prefix_aware+packed; 2 rounds, 2 layers, 5 steps.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$OUT/r; mkdir -p $R; cp .bench_data/g2w.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
T=$OUT/all.tgz
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=2 OUT=$R/c ONLY=build,correctness bash tests/multi_gpu/run.sh > $R/c.log 2>&1; t build+correctness rc=$?
tail -3 $R/c/summary.txt
grep -E "OK \] CadGpu\.(Packed|CallTimes)|FAILED|Failure" $R/c/cad_nccl.log | sort | uniq -c | head -12
CUDA_VISIBLE_DEVICES=0 timeout 200 mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np 2 \
  build-gpu/bin/cad_gpu_cad_tests --gtest_filter='CadGpu.Packed*:CadGpu.CallTimes*' > $R/staged_np2.log 2>&1
t host-staged np=2 rc=$? $(grep -E '^\[  (PASSED|FAILED)' $R/staged_np2.log | tr '\n' ' ')
NGPU=2 OUT=$R/a SKIP_BUILD=1 ONLY=train CONTEXTS="65536" STEPS=5 LAYERS="65536:2" ROUNDS=2 \
  CONFIGS=local,local_balanced,prefix_aware,prefix_aware+packed \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=300 TAR=$T bash tests/multi_gpu/run.sh > $R/a.log 2>&1
t train rc=$?
rm -f $R/c/build.log; tar -czf $T -C $R .
python3 tests/multi_gpu/table.py $R/a/round* 2>&1 | tail -6
for d in $R/a/round*; do python3 tests/multi_gpu/table.py $d | grep -A5 "comm ms\|server fwd ms" | grep "^| 64K"; done
