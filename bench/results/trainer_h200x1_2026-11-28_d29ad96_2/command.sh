#!/bin/bash
# ONE H200: what ping-pong's split costs where there is no exchange to hide (one rank, 64K,
# 2 layers): local and prefix_aware, each unsplit and forced split (+pp), and prefix_aware+ppauto (the trainer's
# fix b40b85b: it must stay unsplit and cost nothing); 2 rounds (rotated order), a profiled step with timelines.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$OUT/r; mkdir -p $R; cp .bench_data/g1b.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpus.txt
T=$OUT/all.tgz
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=1 OUT=$R/c ONLY=build bash tests/multi_gpu/run.sh > $R/c.log 2>&1; t build rc=$?
rm -f $R/c/build.log
left=$(( 575 - ($(date +%s) - S) ))
NGPU=1 OUT=$R/a SKIP_BUILD=1 ONLY=train CONTEXTS="65536" STEPS=4 LAYERS="65536:2" ROUNDS=2 PROFILE_STEP=2 \
  CONFIGS=local,local+pp,prefix_aware,prefix_aware+pp,prefix_aware+ppauto \
  TRAINER_ARGS="--sync-attention-timing off --profile-trace" TRAIN_BUDGET_S=$left TAR=$T bash tests/multi_gpu/run.sh > $R/a.log 2>&1
t train rc=$?
gzip -9 $R/a/round*/*trace*.json
tar -czf $T -C $R .
python3 tests/multi_gpu/table.py $R/a/round* 2>&1 | head -14
for f in $R/a/round1/*trace_rank0.json.gz; do python3 tests/multi_gpu/trace_calls.py $f 2>&1 | grep -E "^##|busy by family"; done
