#!/bin/bash
# GPU run, part 2 of 2 (one H200, warm after part 1): assemble and unpack the FA4 payload (part1 from part 1 of the run + part2),
# FA3's forward and the small wheels; run tests/python/test_fa4.py on the GPU, then bench/kernels/fa_anchor_bench.py.
# On a cold machine (no part1, no build) it builds again and benches without FA4 (the table says why).
set -u
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export CAD_BENCH_COMMIT="$(cat build-fa4-src/commit.txt)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee $OUT/gpu.txt
cp build-fa4-src/fa4.py host_adapter/python/cad/fa4.py
cp build-fa4-src/test_fa4.py tests/python/test_fa4.py
cp build-fa4-src/fa_anchor_bench.py bench/kernels/fa_anchor_bench.py
SITE=$PWD/build-fa4-site; W=build-fa4-whl2; mkdir -p $SITE/pkgs $SITE/cache
if [ -f $SITE/parts/part1 ]; then
  cat $SITE/parts/part1 $W/part2 | xz -d | tar x -C $SITE/pkgs; t "cutlass-dsl cu13 libs rc=$?"
else
  t "part1 missing (a cold machine): FA4 cannot be assembled"
fi
xz -d < $W/small.tar.xz | tar x -C $SITE/pkgs; t "small wheels rc=$?"
xz -d < $W/fa3.tar.xz | tar x -C $SITE/pkgs; t "fa3-fwd rc=$?"
if [ ! -f build-fa4/lib/libcad_host.so ]; then
  { cmake -S . -B build-fa4 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
    cmake --build build-fa4 -j16 --target cad_host cad_plugin_cuda cad_plugin_reference; } > $OUT/build.log 2>&1
  t "rebuild rc=$?"
fi
export PYTHONPATH=$PWD/host_adapter/python:$SITE/pkgs:$SITE/pkgs/nvidia_cutlass_dsl/dsl_packages
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$SITE/cache
export CAD_HOST_LIBRARY=$PWD/build-fa4/lib/libcad_host.so CAD_PLUGIN_PATH=$PWD/build-fa4/lib/cad/plugins CAD_LOG_LEVEL=warn
python3 -c "import cad.fa4; print('fa4:', cad.fa4.available())" 2>&1 | tail -3
(cd tests/python && timeout 150 python3 -m pytest -q -p no:cacheprovider -rs test_fa4.py) > $OUT/test_fa4.log 2>&1
t "test_fa4 rc=$?"; tail -8 $OUT/test_fa4.log
timeout 330 python3 bench/kernels/fa_anchor_bench.py --build build-fa4 --data build-fa4-src/doclen_pretrain.json \
  --rounds 5 --budget-s ${BUDGET_S:-230} --out $OUT/fa_anchor_bench.json > $OUT/fa_anchor_bench.log 2>&1
t "bench rc=$?"; grep -E "^\| |stopping|round . done" $OUT/fa_anchor_bench.log | head -60
t done
