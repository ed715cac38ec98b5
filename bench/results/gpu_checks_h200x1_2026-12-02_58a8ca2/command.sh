#!/bin/bash
# GPU check, part 1 of 2 (one H200): the GPU scripts on the tree as merged (tests/gpu/run_gpu_checks.sh without
# its sanitizer step; tests/gpu_cad/run.sh with its sanitizer step), the Python-side targets part 2 needs, and
# Nsight Compute on the project's sm_90a forward and backward (dense causal 16K), tests/gpu_python/test_gpu.py.
# Keeps the first part of the FA4 payload for part 2. Everything comes back as part1.tgz + steps.txt.
set -u
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*" | tee -a $OUT/steps.txt; }
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/build-data/doclen_pretrain.json
R=$OUT/part1; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > $R/gpu.txt
cp build-data/commit.txt $R/ 2>/dev/null
mkdir -p build-fa4-site/parts && cp build-fa4-a/cu13.part.aa build-fa4-site/parts/
OUT=$R/gpu_checks timeout 330 bash tests/gpu/run_gpu_checks.sh --no-sanitizer > $R/gpu_checks.log 2>&1
t "run_gpu_checks rc=$?"; tail -8 $R/gpu_checks.log
OUT=$R/gpu_cad timeout 230 bash tests/gpu_cad/run.sh > $R/gpu_cad.log 2>&1
t "gpu_cad rc=$?"; tail -8 $R/gpu_cad.log
B=build-gpu
cmake --build $B -j16 --target cad_host cad_plugin_cad cad_plugin_cuda cad_plugin_host cad_plugin_nccl \
  cad_plugin_reference cad_plugin_colocated cad_plugin_per_doc_cp cad_plugin_distca cad_plugin_prefix_aware \
  cad_plugin_callback_attention cad_kernel_bench > $R/build_python.log 2>&1
t "python targets build rc=$?"; tail -3 $R/build_python.log
BIN=$B/bin/cad_kernel_bench
SEC="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats"
cuobjdump -res-usage $BIN 2>&1 | grep -A1 -E "attention_(fwd|bwd)_sm90" > $R/res_usage.txt
for c in dense_causal_16k; do
  for k in fwd bwd; do
    timeout 100 ncu --clock-control none -k regex:attention_${k}_sm90 -s 2 -c 1 $SEC $BIN bench/kernels/pretrain_batches.txt $c \
      > $R/ncu_${c}_${k}.txt 2>&1
    t "ncu $c $k rc=$?"
  done
done
export CAD_HOST_LIBRARY=$PWD/$B/lib/libcad_host.so CAD_PLUGIN_PATH=$PWD/$B/lib/cad/plugins CAD_LOG_LEVEL=warn
PYTHONPATH=$PWD/host_adapter/python timeout 200 python3 -m pytest -q -s -p no:cacheprovider tests/gpu_python/test_gpu.py > $R/pytest_gpu.log 2>&1
t "test_gpu.py rc=$?"; tail -3 $R/pytest_gpu.log
rm -f $R/gpu_checks/build.log.gz
tar -czf $OUT/part1.tgz -C $OUT part1 && rm -rf $R; t done
