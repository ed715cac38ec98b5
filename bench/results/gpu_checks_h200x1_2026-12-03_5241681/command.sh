#!/bin/bash
# GPU checks of the backward's two statistics copies (one H200): the A/B of the one-copy reads against the pairs
# (bench/kernels/bwd_variants.sh: builds, kernel tests, large tests, racecheck, 3 timing rounds), then the whole
# tree's checks on the default build (tests/gpu/run_gpu_checks.sh with its sanitizers) and the package's GPU tests.
set -u
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*" | tee -a $OUT/steps.txt; }
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader > $OUT/gpu.txt
OUT=$OUT/ab VARIANTS="1_p0 1" ROUNDS=3 timeout 230 bash bench/kernels/bwd_variants.sh > $OUT/ab.log 2>&1
t "bwd_variants rc=$?"; tail -4 $OUT/ab.log
R=$OUT/checks; mkdir -p $R
OUT=$R timeout 250 bash tests/gpu/run_gpu_checks.sh > $OUT/gpu_checks.log 2>&1
t "run_gpu_checks rc=$?"; tail -14 $OUT/gpu_checks.log
B=build-gpu
left=$(( 575 - ($(date +%s) - S) ))
if [ "$left" -gt 60 ]; then
  timeout 60 cmake --build $B -j16 --target cad_host cad_plugin_cad cad_plugin_cuda cad_plugin_host cad_plugin_nccl \
    cad_plugin_reference cad_plugin_colocated cad_plugin_prefix_aware cad_plugin_callback_attention > $OUT/build_python.log 2>&1
  t "python targets build rc=$?"
  export CAD_HOST_LIBRARY=$PWD/$B/lib/libcad_host.so CAD_PLUGIN_PATH=$PWD/$B/lib/cad/plugins CAD_LOG_LEVEL=warn
  left=$(( 580 - ($(date +%s) - S) ))
  PYTHONPATH=$PWD/host_adapter/python timeout $left python3 -m pytest -q -s -p no:cacheprovider tests/gpu_python/test_gpu.py > $OUT/pytest_gpu.log 2>&1
  t "test_gpu.py rc=$?"; tail -2 $OUT/pytest_gpu.log
else
  t "test_gpu.py not run: ${left} s left"
fi
rm -f $R/build.log.gz
cp $OUT/ab/summary.md $OUT/ab_summary.md 2>/dev/null
# At most 8 files come back from the GPU machine: the rest travels as one archive.
tar -czf $OUT/rest.tgz -C $OUT ab checks build_python.log 2>/dev/null && rm -rf $OUT/ab $OUT/checks $OUT/build_python.log
t done
