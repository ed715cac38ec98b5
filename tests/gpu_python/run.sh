#!/usr/bin/env bash
# run.sh -- the Python package on ONE GPU (not run by CI):
#   1. build (CUDA, sm_90a) libcad_host and the plugins in $BUILD (default build-gpu);
#   2. tests/gpu_python/test_gpu.py: bf16 local vs sdpa, CAD with 2 and 3 processes sharing the GPU over the
#      "host" communicator (host-staged), CAD over NCCL with one rank, torch.compile, bad input; then CAD
#      host-staged over the "mpi" communicator (mpirun -np 2 and 3, tests/python/mpi_check.py on the GPU);
#   3. the CPU suites of tests/python against the same build (CAD on CPU, Llama cad == local);
#   4. examples/train_llama.py for 20 steps on the GPU: one rank over NCCL (cad and local), and 2 ranks sharing
#      the GPU over the host communicator.
# Needs torch (with CUDA), pytest and transformers importable. Logs under $OUT (default ./gpu_python_out):
# summary.txt (printed at the end), build.log, pytest_*.log, train_*.log/json. Usage: bash run.sh [--skip-build]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu_python_out}"
BUILD="${BUILD:-build-gpu}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
export NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=4
# The trainer's batches: ../shared does not travel to a device machine; .bench_data/ holds a copy there.
export CAD_DATA="${CAD_DATA:-$PWD/../shared/data/doclen_pretrain.json}"
[ -f "$CAD_DATA" ] || CAD_DATA="$PWD/.bench_data/doclen_pretrain.json"
failed=0
record() {  # record NAME STATUS [LOG]
  local line="$1: $([ "$2" = 0 ] && echo passed || echo "FAILED (exit $2)")"
  [ -n "${3:-}" ] && line="$line -- $(grep -E '[0-9]+ (passed|failed)|^summary' "$3" | tail -1)"
  echo "$line" | tee -a "$SUMMARY"
  [ "$2" = 0 ] || { failed=1; [ -n "${3:-}" ] && tail -30 "$3" | tee -a "$SUMMARY"; }
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$SUMMARY"
python3 -c "import torch, transformers, pytest; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__)" 2>&1 | tee -a "$SUMMARY"

if [ "${1:-}" != --skip-build ]; then
  start=$(date +%s)
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DCAD_PYTHON_TESTS=OFF &&
    cmake --build "$BUILD" -j "$(nproc)" --target cad_host cad_plugin_cad cad_plugin_cuda cad_plugin_host \
      cad_plugin_nccl cad_plugin_reference cad_plugin_colocated cad_plugin_per_doc_cp cad_plugin_distca \
      cad_plugin_prefix_aware; } > "$OUT/build.log" 2>&1
  rc=$?
  echo "build rc=$rc in $(( $(date +%s) - start )) s" | tee -a "$SUMMARY"
  if [ "$rc" != 0 ]; then tail -40 "$OUT/build.log"; exit 1; fi
fi
export CAD_HOST_LIBRARY="$PWD/$BUILD/lib/libcad_host.so" PYTHONPATH="$PWD/host_adapter/python"
export CAD_PLUGIN_PATH="$PWD/$BUILD/lib/cad/plugins" CAD_LOG_LEVEL=warn

timeout 900 python3 -m pytest -q -s -p no:cacheprovider tests/gpu_python/test_gpu.py > "$OUT/pytest_gpu.log" 2>&1
record "gpu: bf16 local, CAD host-staged 2/3 processes on one GPU, CAD nccl 1 rank, compile, bad input" $? \
  "$OUT/pytest_gpu.log"
grep -E "max error|imbalance" "$OUT/pytest_gpu.log" | sort -u | head -40 >> "$SUMMARY"
for n in 2 3; do  # processes sharing the GPU, host-staged over the mpi communicator (no torch.distributed)
  CAD_TEST_DEVICE=cuda timeout 300 mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np "$n" \
    -x CAD_TEST_DEVICE -x CAD_HOST_LIBRARY -x PYTHONPATH -x CAD_PLUGIN_PATH python3 tests/python/mpi_check.py \
    > "$OUT/mpi_np$n.log" 2>&1
  record "gpu: CAD host-staged over mpi, $n processes on one GPU, bf16 vs sdpa" $? "$OUT/mpi_np$n.log"
done
timeout 900 python3 -m pytest -q -p no:cacheprovider tests/python > "$OUT/pytest_cpu.log" 2>&1
record "cpu suites (tests/python)" $? "$OUT/pytest_cpu.log"

train() {  # train NAME NPROC ARGS...
  local name="$1" n="$2"; shift 2
  timeout 900 python3 -m torch.distributed.run --standalone --nproc-per-node "$n" examples/train_llama.py \
    --device cuda --steps 20 --context 8192 --layers 4 --hidden 512 --heads 8 --kv-heads 2 \
    --json-out "$OUT/train_$name.json" "$@" > "$OUT/train_$name.log" 2>&1
  record "train_llama $name (20 steps)" $? "$OUT/train_$name.log"
}
train cad_nccl_1rank 1 --attention cad --communicator nccl
train local_1rank 1 --attention local
train cad_host_2ranks_shared_gpu 2 --attention cad --communicator host
train local_2ranks_shared_gpu 2 --attention local --communicator host
# The loss comparison is a check too: a pair missing or apart by 2e-2 or more fails the run.
python3 - "$OUT" > "$OUT/losses.txt" 2>&1 <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
bad = 0
for a, b in (("cad_nccl_1rank", "local_1rank"), ("cad_host_2ranks_shared_gpu", "local_2ranks_shared_gpu")):
    try:
        x, y = (json.loads((out / f"train_{n}.json").read_text())["steps"] for n in (a, b))
    except (OSError, KeyError, ValueError) as e:
        print(f"losses {a} vs {b}: missing ({e})"); bad += 1; continue
    if not x or len(x) != len(y):
        print(f"losses {a} vs {b}: {len(x)} and {len(y)} steps"); bad += 1; continue
    worst = max(abs(s["loss"] - t["loss"]) / abs(t["loss"]) for s, t in zip(x, y))
    ok = worst < 2e-2
    bad += 0 if ok else 1
    print(f"losses {a} vs {b}: worst relative difference over {len(x)} steps {worst:.2e} "
          f"({'ok' if ok else 'TOO LARGE'})")
sys.exit(1 if bad else 0)
PY
record "losses of CAD against local attention" $? "$OUT/losses.txt"
cat "$OUT/losses.txt" >> "$SUMMARY"
echo "---- summary ----"
cat "$SUMMARY"
exit $failed
