#!/bin/bash
# Head groups' GPU checks after the review: the GPU CAD tests over NCCL on 2 GPUs (graph replay with 2 head groups
# included) and the pack kernel tests (copy_row_slices, sum_rows into a slice).
export NCCL_NVLS_ENABLE=0
R=$OUT/r; mkdir -p $R; cp .bench_data/g2u.sh $R/command.sh
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
NGPU=2 OUT=$R/c ONLY=build,correctness bash tests/multi_gpu/run.sh > $R/c.log 2>&1; t build+correctness rc=$?
cat $R/c/summary.txt | tail -4
grep -E "OK \] CadGpu|FAILED|Failure" $R/c/cad_nccl.log | sort | uniq -c | head -20
B=$(grep -o 'BUILD:-[^}]*' tests/multi_gpu/run.sh | head -1 | cut -c8-)
cmake --build "${B:-build-multi-gpu}" -j 32 --target cad_gpu_tests > $R/k_build.log 2>&1; t kernel tests build rc=$?
timeout 120 "${B:-build-multi-gpu}/bin/cad_gpu_tests" --gtest_filter='GpuPack.*' > $R/pack.log 2>&1; t pack tests rc=$?
tail -3 $R/pack.log; grep -E "FAILED|Failure" $R/pack.log | head
rm -f $R/c/build.log
