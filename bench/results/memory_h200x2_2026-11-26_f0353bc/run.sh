#!/usr/bin/env bash
# Validation run: build, CAD GPU tests (host-staged 1-2 procs, NCCL 1-2 GPUs), the package's GPU tests, and the
# current trainer's memory at 64K/128K on 2 GPUs (local vs CAD) after the per-call scratch change.
set -uo pipefail
L=$OUT/logs; mkdir -p $L; B=build-gpu
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
export CAD_DATA=$PWD/.bench_data/doclen_pretrain.json
pk() { tar czf $OUT/logs.tgz -C $L . ; }
nvidia-smi -L | tee $L/summary.txt
s=$(date +%s)
{ cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCAD_PYTHON_TESTS=OFF && cmake --build $B -j $(nproc) --target cad_gpu_cad_tests cad_host cad_plugin_cad cad_plugin_cuda cad_plugin_mpi cad_plugin_nccl cad_plugin_host cad_plugin_reference cad_plugin_colocated cad_plugin_per_doc_cp cad_plugin_distca cad_plugin_prefix_aware; } > $L/build.log 2>&1
echo "build rc=$? $(( $(date +%s)-s )) s" | tee -a $L/summary.txt; pk
M=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -x NCCL_NVLS_ENABLE)
for n in 1 2; do timeout 300 "${M[@]}" -np $n $B/bin/cad_gpu_cad_tests > $L/cad_np$n.log 2>&1; echo "staged np$n rc=$?" $(grep -E "^\[  (PASSED|FAILED)" $L/cad_np$n.log | tr '\n' ' ') | tee -a $L/summary.txt; done
for n in 1 2; do timeout 300 "${M[@]}" -np $n $B/bin/cad_gpu_cad_tests --nccl > $L/cad_nccl$n.log 2>&1; echo "nccl np$n rc=$?" $(grep -E "^\[  (PASSED|FAILED)|worst" $L/cad_nccl$n.log | tr '\n' ' ') | tee -a $L/summary.txt; done
pk
export CAD_HOST_LIBRARY=$PWD/$B/lib/libcad_host.so PYTHONPATH=$PWD/host_adapter/python CAD_PLUGIN_PATH=$PWD/$B/lib/cad/plugins CAD_LOG_LEVEL=warn
timeout 400 python3 -m pytest -q -x -p no:cacheprovider tests/gpu_python/test_gpu.py > $L/pytest_gpu.log 2>&1; echo "pytest gpu rc=$?" $(tail -1 $L/pytest_gpu.log) | tee -a $L/summary.txt; pk
tr() { timeout 400 python3 -m torch.distributed.run --standalone --nproc-per-node 2 examples/train_llama.py --device cuda --hidden 4096 --intermediate 14336 --heads 32 --kv-heads 8 --steps 4 "$@"; }
tr --configs local,prefix_aware,prefix_aware+pp --context 65536 --layers 4 --json-out $L/t_{config}_65536.json > $L/train64.log 2>&1; echo "train 64K rc=$?" | tee -a $L/summary.txt; pk
tr --configs local,prefix_aware --context 131072 --layers 2 --json-out $L/t_{config}_131072.json > $L/train128.log 2>&1; echo "train 128K rc=$?" | tee -a $L/summary.txt
grep -h "^summary" $L/train*.log | tee -a $L/summary.txt
python3 - $L <<'PY' | tee -a $L/summary.txt
import json,sys,pathlib
for f in sorted(pathlib.Path(sys.argv[1]).glob("t_*.json")):
    d=json.loads(f.read_text()); st=d["steps"][1:] or d["steps"]
    print(f.name, "peak GiB", [round(max(s["peak_memory_gib"]),2) for s in st][:3], "step s", round(sum(max(s["step_s"]) for s in st)/len(st),3))
PY
pk
