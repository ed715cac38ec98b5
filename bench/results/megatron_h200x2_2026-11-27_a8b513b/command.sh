#!/bin/bash
# Megatron-Core 0.19.2 on 2 GPUs: the realised share at 64K (local, local_balanced, cad), 4 layers, 5 steps.
# synced/: as is; unsynced/: EXTRA="--sync-attention-timing off" (the option was added between the two calls).
# Run from the repository root with .whl (megatron_core-0.19.2 wheel) and .bench_data (doclen_pretrain.json) carried.
set -u
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4 CAD_LOG_LEVEL=warn
R=$OUT/r; mkdir -p $R; S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/megatron_core-*.whl > $R/pip.log 2>&1
export PYTHONPATH=/tmp/site
{ cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCAD_PYTHON_TESTS=OFF &&
  cmake --build build-gpu -j 32 --target cad_host cad_plugin_cad cad_plugin_cuda cad_plugin_nccl cad_plugin_host cad_plugin_reference cad_plugin_prefix_aware; } > $R/build.log 2>&1
echo "build rc=$? after $(( $(date +%s) - S )) s" | tee $R/summary.txt
export CAD_HOST_LIBRARY=$PWD/build-gpu/lib/libcad_host.so CAD_PLUGIN_PATH=$PWD/build-gpu/lib/cad/plugins PYTHONPATH=/tmp/site:$PWD/host_adapter/python
timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node 2 integrations/megatron/train_gpt_cad.py \
  --device cuda --model llama3-8b --vocab 16384 --micro-batches 1 --layers 4 --context 65536 --steps 5 \
  --data .bench_data/doclen_pretrain.json --configs local,local_balanced,cad ${EXTRA:-} --json-out "$R/train_64k_{config}.json" > $R/train.log 2>&1
echo "train rc=$? after $(( $(date +%s) - S )) s" | tee -a $R/summary.txt
grep -E '^\[(local|cad)|agree|realised|Error' $R/train.log | tail -20 | tee -a $R/summary.txt
tar -czf $OUT/r.tgz -C $OUT r
