#!/bin/bash
# 2 GPUs: the new data path (one collective per direction, own rows off the wire) against the
# old (b8371a0's per-tensor collectives, built beside it) over NCCL and over the copy engines: 64K, 2 rounds
# alternating (new: local, local_balanced, prefix_aware, prefix_aware+ce; old: prefix_aware, prefix_aware+ce), then
# 128K once (new: local, local_balanced, prefix_aware+ce).
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$OUT/r; mkdir -p $R; cp .bench_data/g2zg.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
T=$OUT/all.tgz
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=2 OUT=$R/c ONLY=build bash tests/multi_gpu/run.sh > $R/c.log 2>&1; t build rc=$?
rm -rf /tmp/old && mkdir /tmp/old && tar --exclude=./build-gpu --exclude=./.bench_data -cf - . | tar -xf - -C /tmp/old
cp -r .bench_data/old/plugins /tmp/old/
(cd /tmp/old && NGPU=2 OUT=/tmp/old_out ONLY=build bash tests/multi_gpu/run.sh > $R/old_build.log 2>&1); t old build rc=$?
for round in 1 2; do
  NGPU=2 OUT=$R/new$round SKIP_BUILD=1 ONLY=train CONTEXTS="65536" STEPS=5 LAYERS="65536:2" \
    CONFIGS=local,local_balanced,prefix_aware,prefix_aware+ce \
    TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=200 bash tests/multi_gpu/run.sh > $R/new$round.log 2>&1
  t train new round $round rc=$?
  NGPU=2 OUT=$R/old$round BUILD=/tmp/old/build-gpu SKIP_BUILD=1 ONLY=train CONTEXTS="65536" STEPS=5 LAYERS="65536:2" \
    CONFIGS=prefix_aware,prefix_aware+ce \
    TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=120 bash tests/multi_gpu/run.sh > $R/old$round.log 2>&1
  t train old round $round rc=$?
  tar -czf $T -C $R .
done
for d in new1 old1 new2 old2; do echo "== $d"; grep -E "^\| 64K" $R/$d/table.md | head -4 | cut -c1-100; done
NGPU=2 OUT=$R/k128 SKIP_BUILD=1 ONLY=train CONTEXTS="131072" STEPS=4 LAYERS="131072:1" \
  CONFIGS=local,local_balanced,prefix_aware+ce \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=150 bash tests/multi_gpu/run.sh > $R/k128.log 2>&1
t train 128K rc=$?
rm -f $R/c/build.log; tar -czf $T -C $R .
grep -E "^\| 128K" $R/k128/table.md | head -4 | cut -c1-140
