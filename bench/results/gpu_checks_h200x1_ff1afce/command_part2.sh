#!/bin/bash
# GPU check, part 2 of 2 (one H200, warm after part 1): the Python package on the GPU (tests/gpu_python's
# test_gpu.py, CAD host-staged over mpi with 2 processes, the tiny trainer over NCCL against local), then the
# 1-GPU step table with FlashAttention-4 as a local baseline: Llama-3-8B shape, 8 layers, FSDP2, full
# checkpointing, 2 micro-batches, 64K tokens: local, torch_varlen, fa4, prefix_aware (CAD at world size 1).
set -u
S=$(date +%s); t() { echo "[$(( $(date +%s) - S )) s] $*" | tee -a $OUT/steps.txt; }
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CAD_DATA=$PWD/build-data/doclen_pretrain.json OMP_NUM_THREADS=4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=build-gpu
cmake --build $B -j16 --target cad_host cad_plugin_cad cad_plugin_cuda cad_plugin_host cad_plugin_nccl \
  cad_plugin_reference cad_plugin_colocated cad_plugin_per_doc_cp cad_plugin_distca cad_plugin_prefix_aware > $OUT/build.log 2>&1
t "build rc=$?"
SITE=$PWD/build-fa4-site; mkdir -p $SITE/pkgs $SITE/cache
cat $SITE/parts/cu13.part.aa build-fa4-b/cu13.part.ab | xz -d | tar x -C $SITE/pkgs; t "fa4 cu13 libs rc=$?"
xz -d < build-fa4-b/small.tar.xz | tar x -C $SITE/pkgs; t "fa4 small wheels rc=$?"
export CAD_HOST_LIBRARY=$PWD/$B/lib/libcad_host.so CAD_PLUGIN_PATH=$PWD/$B/lib/cad/plugins CAD_LOG_LEVEL=warn
export PYTHONPATH=$PWD/host_adapter/python
timeout 200 python3 -m pytest -q -s -p no:cacheprovider tests/gpu_python/test_gpu.py > $OUT/pytest_gpu.log 2>&1
t "test_gpu.py rc=$?"; tail -4 $OUT/pytest_gpu.log
CAD_TEST_DEVICE=cuda timeout 120 mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np 2 \
  -x CAD_TEST_DEVICE -x CAD_HOST_LIBRARY -x PYTHONPATH -x CAD_PLUGIN_PATH python3 tests/python/mpi_check.py > $OUT/mpi_np2.log 2>&1
t "mpi_check np2 rc=$?"; tail -3 $OUT/mpi_np2.log
for a in cad local; do
  timeout 90 python3 -m torch.distributed.run --standalone --nproc-per-node 1 examples/train_llama.py --device cuda \
    --steps 10 --context 8192 --layers 4 --hidden 512 --heads 8 --kv-heads 2 --attention $a --json-out $OUT/tiny_$a.json > $OUT/tiny_$a.log 2>&1
  t "tiny trainer $a rc=$?"; tail -2 $OUT/tiny_$a.log
done
export PYTHONPATH=$PWD/host_adapter/python:$SITE/pkgs:$SITE/pkgs/nvidia_cutlass_dsl/dsl_packages
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$SITE/cache
python3 -c "import cad.fa4, torch; print('fa4:', cad.fa4.available(torch.device('cuda')))" 2>&1 | tail -2 | tee -a $OUT/steps.txt
left=$(( 560 - ($(date +%s) - S) ))
NGPU=1 OUT=$OUT/train SKIP_BUILD=1 ONLY=train BUILD=$B CONTEXTS=65536 STEPS=3 LAYERS=65536:8 \
  CONFIGS=local,torch_varlen,fa4,prefix_aware TRAIN_BUDGET_S=$left bash tests/multi_gpu/run.sh > $OUT/train.log 2>&1
t "train rc=$?"; tail -20 $OUT/train.log
t done
