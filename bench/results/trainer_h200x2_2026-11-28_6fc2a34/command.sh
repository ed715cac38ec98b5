#!/bin/bash
# On 2 GPUs: CAD's calls by head groups (head_groups 2), the first measurement: build, the GPU correctness stage
# (grouped instances included), then 64K in 2 rounds: local, local_balanced (the ideal), prefix_aware,
# prefix_aware+hg2; 2 layers, 5 steps.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
R=$OUT/r; mkdir -p $R; cp .bench_data/g2p.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
T=$OUT/all.tgz
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=2 OUT=$R/c ONLY=build,correctness TAR=$T bash tests/multi_gpu/run.sh > $R/c.log 2>&1; t build+correctness rc=$?
cat $R/c/summary.txt
grep -E "HeadGroups|FAILED|Failure" $R/c/cad_nccl.log | head -20
NGPU=2 OUT=$R/a SKIP_BUILD=1 ONLY=train CONTEXTS="65536" STEPS=5 LAYERS="65536:2" ROUNDS=2 \
  CONFIGS=local,local_balanced,prefix_aware,prefix_aware+hg2 \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=200 TAR=$T \
  bash tests/multi_gpu/run.sh > $R/a.log 2>&1; t train rc=$?
rm -f $R/c/build.log; tar -czf $T -C $R .
tail -5 $R/a.log
for d in $R/a/round*; do python3 tests/multi_gpu/table.py $d 2>&1 | grep -E "^\| 64K" | cut -d'|' -f2-12; done
python3 tests/multi_gpu/table.py $R/a/round* 2>&1 | tail -8
