#!/bin/bash
# GPU check, part 1 of 2 (one H200): the GPU scripts on the tree as it now stands (tools/, planning/, guards/,
# the CAD plugin split by step, cad.Context): the kernel and conformance checks (tests/gpu/run_gpu_checks.sh,
# no sanitizer), CAD's CUDA data path on 1-4 processes sharing the GPU (tests/gpu_cad/run.sh, with its
# sanitizer step). Keeps part of the FA4 payload for part 2.
set -u
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*" | tee -a $OUT/steps.txt; }
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/build-data/doclen_pretrain.json
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > $OUT/gpu.txt
cp build-data/commit.txt $OUT/ 2>/dev/null
mkdir -p build-fa4-site/parts && cp build-fa4-a/cu13.part.aa build-fa4-site/parts/
OUT=$OUT/gpu_checks timeout 330 bash tests/gpu/run_gpu_checks.sh --no-sanitizer > $OUT/gpu_checks.log 2>&1
t "run_gpu_checks rc=$?"; tail -25 $OUT/gpu_checks.log
OUT=$OUT/gpu_cad timeout 230 bash tests/gpu_cad/run.sh > $OUT/gpu_cad.log 2>&1
t "gpu_cad rc=$?"; tail -25 $OUT/gpu_cad.log
rm -f $OUT/gpu_checks/build.log.gz; t done
