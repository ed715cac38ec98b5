#!/bin/bash
# 2 GPUs: the tasks a rank holds run in place while the copy engines move the rest (with NCCL
# its kernels waited behind them): 64K, 2 rounds: local, local_balanced, prefix_aware, prefix_aware+ce,
# prefix_aware+ce+own+res0 (own tasks on every SM). No bandwidth runs this time.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$OUT/r; mkdir -p $R; cp .bench_data/g2za.sh $R/command.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt
T=$OUT/all.tgz
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*"; }
M=(mpirun --allow-run-as-root -np 2 --mca btl self,vader -x NCCL_NVLS_ENABLE)
NGPU=2 OUT=$R/c ONLY=build bash tests/multi_gpu/run.sh > $R/c.log 2>&1; t build rc=$?
cmake --build build-gpu -j 32 --target cad cad_gpu_cad_tests test_cad_comm cad_plugin_mpi bench_nccl_all_to_all > $R/b2.log 2>&1; t build2 rc=$?
timeout 120 "${M[@]}" build-gpu/bin/cad conformance build-gpu/lib/cad/plugins/cad_nccl.so --config '{"copy_engines": true}' > $R/conf_ce.log 2>&1
t conformance copy_engines rc=$?; grep -E "passed|failed|FAIL" $R/conf_ce.log | tail -2
timeout 300 "${M[@]}" build-gpu/bin/cad_gpu_cad_tests --nccl --copy-engines --gtest_filter='-CadGpuFault.*' > $R/cad_ce.log 2>&1
t cad gpu tests copy_engines rc=$?; grep -E "^\[  (PASSED|FAILED)|Failure" $R/cad_ce.log | head -4
tar -czf $T -C $R .
NGPU=2 OUT=$R/a SKIP_BUILD=1 ONLY=train CONTEXTS="65536" STEPS=5 LAYERS="65536:2" ROUNDS=2 \
  CONFIGS=local,local_balanced,prefix_aware,prefix_aware+ce,prefix_aware+ce+own+res0 \
  TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=320 TAR=$T bash tests/multi_gpu/run.sh > $R/a.log 2>&1
t train rc=$?
rm -f $R/c/build.log; tar -czf $T -C $R .
python3 tests/multi_gpu/table.py $R/a/round* 2>&1 | tail -6
for d in $R/a/round*; do python3 tests/multi_gpu/table.py $d | grep -A6 "comm ms\|server fwd ms" | grep "^| 64K"; done
