#!/bin/bash
# 2 GPUs: one collective per direction with a rank's own rows never on the wire (new) against
# one collective per tensor (old = b8371a0's device path, built beside it): checks of the new path, then 64K,
# 2 rounds each, new (local, local_balanced, prefix_aware+ce, prefix_aware+ce+tol0.005) and old (local,
# prefix_aware+ce), on the same machine one after the other.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$OUT/r; mkdir -p $R; cp .bench_data/g2zf.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
T=$OUT/all.tgz
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=2 OUT=$R/c ONLY=build,correctness,faults bash tests/multi_gpu/run.sh > $R/c.log 2>&1; t checks rc=$?
grep -E "passed|FAIL|fail" $R/c/summary.txt | tail -12
rm -f $R/c/build.log; tar -czf $T -C $R .
# the old device path, built beside
rm -rf /tmp/old && mkdir /tmp/old && tar --exclude=./build-gpu --exclude=./.bench_data -cf - . | tar -xf - -C /tmp/old
cp -r .bench_data/old/plugins /tmp/old/
(cd /tmp/old && NGPU=2 OUT=/tmp/old_out ONLY=build bash tests/multi_gpu/run.sh > $R/old_build.log 2>&1); t old build rc=$?
for round in 1 2; do
  NGPU=2 OUT=$R/new$round SKIP_BUILD=1 ONLY=train CONTEXTS="65536" STEPS=5 LAYERS="65536:2" \
    CONFIGS=local,local_balanced,prefix_aware+ce,prefix_aware+ce+tol0.005 \
    TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=200 bash tests/multi_gpu/run.sh > $R/new$round.log 2>&1
  t train new round $round rc=$?
  NGPU=2 OUT=$R/old$round BUILD=/tmp/old/build-gpu SKIP_BUILD=1 ONLY=train CONTEXTS="65536" STEPS=5 LAYERS="65536:2" \
    CONFIGS=local,prefix_aware+ce \
    TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=120 bash tests/multi_gpu/run.sh > $R/old$round.log 2>&1
  t train old round $round rc=$?
  tar -czf $T -C $R .
done
for d in new1 old1 new2 old2; do echo "== $d"; grep -E "^\| 64K" $R/$d/table.md | head -5 | cut -c1-120; done
