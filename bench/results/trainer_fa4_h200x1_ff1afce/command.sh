#!/bin/bash
# 1-GPU step table with FlashAttention-4 as a local baseline (one H200): Llama-3-8B shape, 8 layers, FSDP2, full
# checkpointing, 2 micro-batches of 64K tokens, 3 steps (step 0 warms up); local (the project's kernel),
# torch_varlen, fa4 and prefix_aware (CAD at world size 1); two rounds, the second in rotated order.
set -u
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*" | tee -a $OUT/steps.txt; }
SITE=$PWD/build-fa4-site
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/build-data/doclen_pretrain.json CAD_LOG_LEVEL=warn
export CAD_HOST_LIBRARY=$PWD/build-gpu/lib/libcad_host.so CAD_PLUGIN_PATH=$PWD/build-gpu/lib/cad/plugins
export PYTHONPATH=$PWD/host_adapter/python:$SITE/pkgs:$SITE/pkgs/nvidia_cutlass_dsl/dsl_packages
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$SITE/cache
round() {  # round N CONFIGS
  mkdir -p $OUT/round$1
  timeout $2 python3 -m torch.distributed.run --standalone --nproc-per-node 1 examples/train_llama.py --device cuda \
    --model llama3-8b --parallel fsdp2 --checkpointing full --micro-batches 2 --steps 3 --profile-step -1 \
    --configs $3 --context 65536 --layers 8 --json-out $OUT/round$1/train_{config}_65536.json > $OUT/round$1/train.log 2>&1
  t "round $1 ($3) rc=$?"
}
round 1 300 local,torch_varlen,fa4,prefix_aware
left=$(( 540 - ($(date +%s) - S) ))
[ $left -gt 200 ] && round 2 $(( left - 20 )) fa4,prefix_aware,local,torch_varlen
python3 tests/multi_gpu/table.py $OUT/round* > $OUT/table.md 2>&1; t "table rc=$?"
head -30 $OUT/table.md
tar -czf $OUT/records.tgz -C $OUT $(cd $OUT && ls -d round*) && rm -rf $OUT/round*
t done
