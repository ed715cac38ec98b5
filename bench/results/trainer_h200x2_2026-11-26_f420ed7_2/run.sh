#!/usr/bin/env bash
# Validation of per-call workspaces (cuda backend plans keep tables only; CAD wire buffers per exchange, early
# release after the server backward): GPU tests, then the trainer's peak memory at 64K and 256K, local vs CAD.
set -uo pipefail
L=$OUT/logs; mkdir -p $L; B=build-gpu
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
export CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
pk() { tar czf $OUT/logs.tgz -C $L . ; }
nvidia-smi -L | tee $L/summary.txt
s=$(date +%s)
{ cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCAD_PYTHON_TESTS=OFF && cmake --build $B -j $(nproc) --target cad_gpu_cad_tests cad_gpu_tests cad_host cad_plugin_cad cad_plugin_cuda cad_plugin_mpi cad_plugin_nccl cad_plugin_host cad_plugin_reference cad_plugin_colocated cad_plugin_per_doc_cp cad_plugin_distca cad_plugin_prefix_aware; } > $L/build.log 2>&1
echo "build rc=$? $(( $(date +%s)-s )) s" | tee -a $L/summary.txt; pk
M=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -x NCCL_NVLS_ENABLE)
for n in 1 2; do timeout 300 "${M[@]}" -np $n $B/bin/cad_gpu_cad_tests > $L/cad_np$n.log 2>&1; echo "staged np$n rc=$?" $(grep -E "^\[  (PASSED|FAILED)" $L/cad_np$n.log | tr '\n' ' ') | tee -a $L/summary.txt; done
for n in 1 2; do timeout 300 "${M[@]}" -np $n $B/bin/cad_gpu_cad_tests --nccl > $L/cad_nccl$n.log 2>&1; echo "nccl np$n rc=$?" $(grep -E "^\[  (PASSED|FAILED)|worst" $L/cad_nccl$n.log | tr '\n' ' ') | tee -a $L/summary.txt; done
timeout 300 $B/bin/cad_gpu_tests > $L/gpu_tests.log 2>&1; echo "cad_gpu_tests rc=$?" $(grep -E "^\[  (PASSED|FAILED)" $L/gpu_tests.log | tr '\n' ' ') | tee -a $L/summary.txt
pk
export CAD_HOST_LIBRARY=$PWD/$B/lib/libcad_host.so PYTHONPATH=$PWD/host_adapter/python CAD_PLUGIN_PATH=$PWD/$B/lib/cad/plugins CAD_LOG_LEVEL=warn
timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/gpu_python/test_gpu.py > $L/pytest_gpu.log 2>&1; echo "pytest gpu rc=$?" $(tail -1 $L/pytest_gpu.log) | tee -a $L/summary.txt; pk
tr() { timeout 300 python3 -m torch.distributed.run --standalone --nproc-per-node 2 examples/train_llama.py --device cuda --model llama3-8b --parallel fsdp2 --checkpointing full --micro-batches 2 --steps 3 "$@"; }
tr --configs local,prefix_aware,prefix_aware+pp --context 262144 --layers 1 --json-out $L/train_{config}_262144.json > $L/t256.log 2>&1; echo "train 256K rc=$?" | tee -a $L/summary.txt; pk
tr --configs local,prefix_aware --context 65536 --layers 2 --json-out $L/train_{config}_65536.json > $L/t64.log 2>&1; echo "train 64K rc=$?" | tee -a $L/summary.txt
python3 tests/multi_gpu/table.py $L > $L/table.md 2>&1; grep -E "^\| (64K|256K)" $L/table.md | cut -d'|' -f2-9 | tee -a $L/summary.txt
pk
