#!/bin/bash
# GPU run, part 1 of 2 (one H200): stash the first part of the FA4 wheels' payload, build libcad_host and the cuda
# plugin (sm_90a), and check that our kernel runs from the build. Kept for part 2: build-fa4/, build-fa4-site/.
set -u
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee $OUT/gpu.txt
cp build-fa4-src/fa4.py host_adapter/python/cad/fa4.py
cp build-fa4-src/test_fa4.py tests/python/test_fa4.py
cp build-fa4-src/fa_anchor_bench.py bench/kernels/fa_anchor_bench.py
mkdir -p build-fa4-site/parts && cp build-fa4-whl1/part1 build-fa4-site/parts/part1 && t "part1 stashed ($(stat -c %s build-fa4-site/parts/part1) bytes)"
{ cmake -S . -B build-fa4 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
  cmake --build build-fa4 -j16 --target cad_host cad_plugin_cuda cad_plugin_reference; } > $OUT/build.log 2>&1
t "build rc=$?"; tail -3 $OUT/build.log
CAD_HOST_LIBRARY=$PWD/build-fa4/lib/libcad_host.so CAD_PLUGIN_PATH=$PWD/build-fa4/lib/cad/plugins CAD_LOG_LEVEL=warn \
PYTHONPATH=$PWD/host_adapter/python python3 - <<'PY' 2>&1 | tee $OUT/smoke.txt
import torch, cad, cad.fa4
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
q = torch.randn(4096, 32, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(4096, 8, 128, device="cuda", dtype=torch.bfloat16)
cu = torch.tensor([0, 1000, 4096], dtype=torch.int32, device="cuda")
o = cad.varlen_attn(q, k, k, cu)
from torch.nn.attention.varlen import varlen_attn
r = varlen_attn(q, k, k, cu, cu, 3096, 3096, window_size=(-1, 0))
print("ours vs torch varlen rel", float((o.float() - r.float()).norm() / r.float().norm()))
print("fa4 available:", cad.fa4.available())
PY
t done
