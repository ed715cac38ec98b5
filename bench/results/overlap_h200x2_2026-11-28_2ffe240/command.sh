#!/bin/bash
# 2 GPUs: does a transfer beside the persistent attention kernel slow it, and less with the copy
# engines than with NCCL? bench/comm/copy_engine_overlap.py, default sizes and 128K tokens per GPU.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R; cp .bench_data/g2x.sh $R/command.sh
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=2 OUT=$R/c ONLY=build bash tests/multi_gpu/run.sh > $R/c.log 2>&1; t build rc=$?
export PYTHONPATH=$PWD/host_adapter/python CAD_HOST_LIBRARY=$PWD/build-gpu/lib/libcad_host.so CAD_PLUGIN_PATH=$PWD/build-gpu/lib/cad/plugins
timeout 200 python3 bench/comm/copy_engine_overlap.py > $R/overlap.md 2>&1; t overlap rc=$?
cat $R/overlap.md | tail -12
timeout 150 python3 bench/comm/copy_engine_overlap.py --mib 32 --copies 384 > $R/overlap_32mib.md 2>&1; t overlap 32 MiB rc=$?
tail -6 $R/overlap_32mib.md
rm -f $R/c/build.log
