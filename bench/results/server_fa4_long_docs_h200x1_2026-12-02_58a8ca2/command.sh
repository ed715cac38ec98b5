#!/bin/bash
# GPU check, part 2 of 2 (one H200, warm after part 1, which built build-gpu): FA4 unpacked from the two parts of its
# payload; CAD's servers through FA4 (tests/gpu_python/server_backend_fa4.sh: check against the fp32 reference at
# world size 1 and 2, server compute per call, the 8-layer Llama-3-8B-shape trainer at 64K with --server-backend
# default / fa4 and the local FA4 baseline); long documents through the host-staged path with 2 and 4 processes
# sharing the GPU (tests/gpu_python/long_docs.sh). Everything comes back as part2.tgz + steps.txt.
set -u
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*" | tee -a $OUT/steps.txt; }
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/build-data/doclen_pretrain.json
R=$OUT/part2; mkdir -p $R
SITE=$PWD/build-fa4-site; mkdir -p $SITE/pkgs $SITE/cache
cat $SITE/parts/cu13.part.aa build-fa4-b/cu13.part.ab | xz -d | tar x -C $SITE/pkgs; t "fa4 cu13 libs rc=$?"
xz -d < build-fa4-b/small.tar.xz | tar x -C $SITE/pkgs; t "fa4 small wheels rc=$?"
export FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$SITE/cache
OUT=$R/server_fa4 FA4_SITE=$SITE/pkgs BUILD=build-gpu timeout 380 bash tests/gpu_python/server_backend_fa4.sh --skip-build \
  > $R/server_fa4.log 2>&1
t "server_backend_fa4 rc=$?"; cat $R/server_fa4/summary.txt 2>/dev/null | tail -14
OUT=$R/long_docs BUILD=build-gpu timeout 170 bash tests/gpu_python/long_docs.sh --skip-build > $R/long_docs.log 2>&1
t "long_docs rc=$?"; tail -8 $R/long_docs/summary.txt 2>/dev/null
tar -czf $OUT/part2.tgz -C $OUT part2 && rm -rf $R; t done
