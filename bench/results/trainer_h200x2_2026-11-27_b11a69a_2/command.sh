#!/bin/bash
# On 2 GPUs at 256K tokens per GPU: local, local_balanced (measured ideal), prefix_aware, +pp, distca.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
R=$OUT/r; mkdir -p $R; cp .bench_data/g2c.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
NGPU=2 OUT=$R/a ONLY=build,train CONTEXTS="262144" STEPS=4 LAYERS="262144:2" \
  CONFIGS=local,local_balanced,prefix_aware,prefix_aware+pp,distca \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=430 \
  bash tests/multi_gpu/run.sh > $R/a.log 2>&1
rm -f $R/a/build.log; tar -czf $OUT/all.tgz -C $R .
python3 tests/multi_gpu/table.py $R/a 2>&1 | head -12
