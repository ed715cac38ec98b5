#!/bin/bash
# On 2 GPUs at 256K tokens per GPU: prefix_aware at its default 2% tolerance and at 0.5%, against distca and
# local; then the pipeline at 4 x 32K (both bubble pools).
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
R=$OUT/r; mkdir -p $R; cp .bench_data/g2g.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
T=$OUT/all.tgz
NGPU=2 OUT=$R/a ONLY=build,train CONTEXTS="262144" STEPS=4 LAYERS="262144:2" \
  CONFIGS=local,prefix_aware,prefix_aware+tol0.005,distca \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=330 \
  bash tests/multi_gpu/run.sh > $R/a.log 2>&1
rm -f $R/a/build.log; tar -czf $T -C $R .
PP=2 OUT=$R/p32 SKIP_BUILD=1 BUILD=build-gpu CONTEXTS=32768 MICRO_BATCHES=4 CONFIGS=local,cad_bubble,1f1b_local,1f1b_cad_bubble STEPS=4 \
  TRAINER_ARGS="--sync-attention-timing off" PIPE_BUDGET_S=120 TAR=$T bash tests/multi_gpu/pipeline.sh > $R/p32.log 2>&1
tar -czf $T -C $R .
python3 tests/multi_gpu/table.py $R/a 2>&1 | head -10; tail -8 $R/p32.log
