#!/bin/bash
# On 2 GPUs: ping-pong with the server's forward walking dynamically. Under ping-pong one nano-batch's
# exchange runs beside the other's attention; a persistent forward whose blocks find their SM held by the
# collective ends late under the static walk, not under the dynamic one. 64K, 2 layers, 5 steps:
# local, local_balanced (the ideal), prefix_aware (+dyn), forced ping-pong (+pp) with and without +dyn.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
R=$OUT/r; mkdir -p $R; cp .bench_data/g2n.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
T=$OUT/all.tgz
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=2 OUT=$R/c ONLY=build TAR=$T bash tests/multi_gpu/run.sh > $R/c_build.log 2>&1; t build rc=$?
NGPU=2 OUT=$R/a SKIP_BUILD=1 ONLY=train CONTEXTS="65536" STEPS=5 LAYERS="65536:2" \
  CONFIGS=local,local_balanced,prefix_aware,prefix_aware+dyn,prefix_aware+pp,prefix_aware+pp+dyn \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=300 TAR=$T \
  bash tests/multi_gpu/run.sh > $R/a.log 2>&1; t train rc=$?
rm -f $R/c/build.log; tar -czf $T -C $R .
python3 tests/multi_gpu/table.py $R/a 2>&1 | grep -E "^\| (64K|128K)" | cut -d'|' -f2-12
