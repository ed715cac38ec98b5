#!/bin/bash
# On 2 GPUs: the own tasks run in place with their forward leaving 16 (default) or 32 SMs to the inbound
# collective beside it, against every task through the exchange (+sendown); local and local_balanced (the
# measured ideal); 64K and 128K tokens per GPU, 2 layers, 5 steps. First the GPU correctness stage.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
R=$OUT/r; mkdir -p $R; cp .bench_data/g2i.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
T=$OUT/all.tgz
NGPU=2 OUT=$R/c ONLY=build,correctness TAR=$T bash tests/multi_gpu/run.sh > $R/c.log 2>&1
NGPU=2 OUT=$R/a SKIP_BUILD=1 ONLY=train CONTEXTS="65536 131072" STEPS=5 LAYERS="65536:2 131072:2" \
  CONFIGS=local,local_balanced,prefix_aware,prefix_aware+sendown,prefix_aware+res32 \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=250 TAR=$T \
  bash tests/multi_gpu/run.sh > $R/a.log 2>&1
rm -f $R/c/build.log; tar -czf $T -C $R .
grep -E "passed|failed|FAILED" $R/c.log | tail -4
python3 tests/multi_gpu/table.py $R/a 2>&1 | grep -E "^\| (64K|128K)" | cut -d'|' -f2-12
