#!/bin/bash
# ONE H200; two-GPU machines not lent: (a) what was left untested on a GPU that one GPU
# can check: the host-staged path over the one-collective exchange and its pinned buffers sized by
# workspace_sizes' wire (tests/gpu_cad/run.sh: 1-4 processes on the GPU, faults, sanitizer), CAD over NCCL with
# one rank; (b) do the GEMMs run slower under CAD than under local attention with no peer at all? One rank,
# 64K, 2 layers, a profiled step with timelines, local_balanced and prefix_aware in both orders (2 rounds).
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$OUT/r; mkdir -p $R; cp .bench_data/g1a.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpus.txt
T=$OUT/all.tgz
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=1 OUT=$R/c ONLY=build,correctness bash tests/multi_gpu/run.sh > $R/c.log 2>&1; t build+correctness rc=$?
grep -E "passed|FAIL" $R/c/summary.txt | tail -8
OUT=$R/g timeout 200 bash tests/gpu_cad/run.sh --skip-build > $R/g.log 2>&1; t gpu_cad rc=$?
cat $R/g/summary.txt
rm -f $R/c/build.log; tar -czf $T -C $R .
left=$(( 570 - ($(date +%s) - S) ))
NGPU=1 OUT=$R/a SKIP_BUILD=1 ONLY=train CONTEXTS="65536" STEPS=4 LAYERS="65536:2" ROUNDS=2 PROFILE_STEP=2 \
  CONFIGS=local_balanced,prefix_aware \
  TRAINER_ARGS="--sync-attention-timing off --profile-trace" TRAIN_BUDGET_S=$left bash tests/multi_gpu/run.sh > $R/a.log 2>&1
t train rc=$?
gzip -9 $R/a/round*/*trace*.json
tar -czf $T -C $R .
python3 tests/multi_gpu/table.py $R/a/round* 2>&1 | head -30
for f in $R/a/round*/*trace_rank0.json.gz; do echo "== $f"; python3 tests/multi_gpu/trace_calls.py $f 2>&1 | tail -25; done
