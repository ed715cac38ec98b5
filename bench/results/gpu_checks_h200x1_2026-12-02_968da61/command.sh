#!/bin/bash
# GPU check of the merged tree (one H200): the kernel tests, large tests and conformance (run_gpu_checks.sh without
# its sanitizer step), the package's GPU tests, and the 1-GPU trainer step at 64K with local attention and CAD.
set -u
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*" | tee -a $OUT/steps.txt; }
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=${CAD_DATA:-$PWD/../shared/data/doclen_pretrain.json}
R=$OUT/final; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > $R/gpu.txt
OUT=$R/gpu_checks timeout 270 bash tests/gpu/run_gpu_checks.sh --no-sanitizer > $R/gpu_checks.log 2>&1
t "run_gpu_checks rc=$?"; tail -12 $R/gpu_checks.log
B=build-gpu
timeout 90 cmake --build $B -j16 --target cad_host cad_plugin_cad cad_plugin_cuda cad_plugin_host cad_plugin_nccl \
  cad_plugin_reference cad_plugin_colocated cad_plugin_prefix_aware cad_plugin_callback_attention > $R/build_python.log 2>&1
t "python targets build rc=$?"; tail -3 $R/build_python.log
export CAD_HOST_LIBRARY=$PWD/$B/lib/libcad_host.so CAD_PLUGIN_PATH=$PWD/$B/lib/cad/plugins CAD_LOG_LEVEL=warn
PYTHONPATH=$PWD/host_adapter/python timeout 100 python3 -m pytest -q -s -p no:cacheprovider tests/gpu_python/test_gpu.py > $R/pytest_gpu.log 2>&1
t "test_gpu.py rc=$?"; tail -2 $R/pytest_gpu.log
left=$(( 560 - ($(date +%s) - S) ))
PYTHONPATH=$PWD/host_adapter/python timeout $left torchrun --nproc-per-node 1 examples/train_llama.py --device cuda --model llama3-8b \
  --layers 8 --context 65536 --micro-batches 2 --checkpointing full --steps 4 --configs local,prefix_aware \
  --json-out $R/train_{config}.json > $R/train.log 2>&1
t "trainer rc=$?"; grep -E "step|ms" $R/train.log | tail -12
rm -f $R/gpu_checks/build.log.gz
tar -czf $OUT/final.tgz -C $OUT final && rm -rf $R; t done
