#!/bin/bash
# Megatron-Core's own trainer path of integrations/megatron/train_gpt_cad.py on one H200 (world size 1, TP 1, PP 1):
# Megatron's DistributedDataParallel, distributed optimizer and get_forward_backward_func, with Megatron's local
# attention and with CAD, megatron-core 0.16.1 installed from its wheel.
set -u
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*" | tee -a $OUT/steps.txt; }
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl; t "pip rc=$?"
B=build-gpu
{ cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCAD_BUILD_TESTS=OFF &&
  cmake --build $B -j16 --target cad_host cad_plugin_cad cad_plugin_cuda cad_plugin_nccl cad_plugin_reference cad_plugin_prefix_aware cad_plugin_host; } > $OUT/build.log 2>&1
t "build rc=$?"; tail -2 $OUT/build.log
export CAD_HOST_LIBRARY=$PWD/$B/lib/libcad_host.so CAD_PLUGIN_PATH=$PWD/$B/lib/cad/plugins CAD_LOG_LEVEL=warn
export PYTHONPATH=$PWD/host_adapter/python:/tmp/site
timeout 150 torchrun --nproc-per-node 1 integrations/megatron/train_gpt_cad.py --device cuda --trainer megatron \
  --model llama3-8b --layers 2 --vocab 32768 --context 16384 --steps 4 --warmup-steps 1 --micro-batches 2 \
  --tensor-parallel-size 1 --data build-data/doclen_pretrain.json --configs cad,local --json-out $OUT/megatron_{config}.json > $OUT/megatron.log 2>&1
t "train_gpt_cad --trainer megatron rc=$?"; tail -25 $OUT/megatron.log
t done
