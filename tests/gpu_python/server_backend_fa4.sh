#!/usr/bin/env bash
# server_backend_fa4.sh -- CAD's servers through FlashAttention-4 on ONE GPU (not run by CI):
#   1. build (CUDA, sm_90a) libcad_host and the plugins it needs in $BUILD (default build-gpu), callback_attention
#      included;
#   2. server_backend_fa4.py check: fa4 and our kernel against the fp32 reference (O, LSE, dQ, dK, dV), world size 1
#      (nccl) and 2 (two processes sharing the GPU, host-staged);
#   3. server_backend_fa4.py bench: CAD's server compute per call on the Pretrain buffers of 64K, fa4 vs ours;
#   4. the trainer at world size 1 (Llama-3-8B shape, 8 layers, 64K, 2 micro-batches, full checkpointing, 4 steps):
#      --attention cad with --server-backend default and fa4, and --attention fa4 (the local FA4 baseline).
# FA4 must be importable: PYTHONPATH=SITE:SITE/nvidia_cutlass_dsl/dsl_packages with FA4's wheels unpacked in SITE
# (docs/kernels_fa4.md). Usage: FA4_SITE=SITE bash tests/gpu_python/server_backend_fa4.sh [--skip-build]
# Writes under $OUT (default ./server_backend_fa4_out): summary.txt, build.log, check*.json, bench*.json, train_*.json
# and logs; exits non-zero when any part failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/server_backend_fa4_out}"
BUILD="${BUILD:-build-gpu}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
export NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=4 FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
export CAD_DATA="${CAD_DATA:-$PWD/../shared/data/doclen_pretrain.json}"
[ -f "$CAD_DATA" ] || CAD_DATA="$PWD/.bench_data/doclen_pretrain.json"
failed=0
record() {  # record NAME STATUS LOG
  echo "$1: $([ "$2" = 0 ] && echo passed || echo "FAILED (exit $2)")" | tee -a "$SUMMARY"
  [ "$2" = 0 ] || { failed=1; tail -30 "$3" | tee -a "$SUMMARY"; }
}
{ date -u; git rev-parse HEAD; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } \
  | tee -a "$SUMMARY"
if [ "${1:-}" != --skip-build ]; then
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DCAD_PYTHON_TESTS=OFF &&
    cmake --build "$BUILD" -j "$(nproc)" --target cad_host cad_plugin_cad cad_plugin_cuda cad_plugin_host \
      cad_plugin_nccl cad_plugin_reference cad_plugin_prefix_aware cad_plugin_callback_attention; } > "$OUT/build.log" 2>&1
  rc=$?
  record build $rc "$OUT/build.log"
  [ "$rc" = 0 ] || exit 1
fi
export CAD_HOST_LIBRARY="$PWD/$BUILD/lib/libcad_host.so" CAD_PLUGIN_PATH="$PWD/$BUILD/lib/cad/plugins" CAD_LOG_LEVEL=warn
export PYTHONPATH="$PWD/host_adapter/python${FA4_SITE:+:$FA4_SITE:$FA4_SITE/nvidia_cutlass_dsl/dsl_packages}${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import cad.fa4 as f; print('fa4', f.version(), f.backward_available())" 2>&1 | tee -a "$SUMMARY"

timeout 1800 python3 tests/gpu_python/server_backend_fa4.py check --out "$OUT" > "$OUT/check.log" 2>&1
record "check: fa4 and ours vs the fp32 reference, world size 1 and 2" $? "$OUT/check.log"
timeout 1800 python3 tests/gpu_python/server_backend_fa4.py bench --out "$OUT" > "$OUT/bench.log" 2>&1
record "bench: server compute per call, fa4 vs ours" $? "$OUT/bench.log"
grep "fa4 / default" "$OUT/bench.log" | tee -a "$SUMMARY"

train() {  # train NAME ARGS...
  local name=$1; shift
  timeout 1800 torchrun --nproc-per-node 1 examples/train_llama.py --device cuda --model llama3-8b --layers 8 \
    --context 65536 --micro-batches 2 --checkpointing full --steps 4 --json-out "$OUT/train_$name.json" "$@" \
    > "$OUT/train_$name.log" 2>&1
  record "trainer world size 1: $name" $? "$OUT/train_$name.log"
}
train cad_default --attention cad --server-backend default
train cad_fa4 --attention cad --server-backend fa4
train local_fa4 --attention fa4
python3 - "$OUT" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for name in ("cad_default", "cad_fa4", "local_fa4"):
    path = out / f"train_{name}.json"
    if path.exists():
        steps = json.loads(path.read_text()).get("steps", [])
        ms = [round(1000 * max(s["step_s"]), 1) for s in steps[1:] if s.get("step_s")]  # the slowest rank
        server = [(s.get("call_forward_server_ms"), s.get("call_backward_server_ms")) for s in steps[1:]]
        print(f"{name}: step ms {ms}, server fwd/bwd ms {server}, losses {[s.get('loss') for s in steps]}")
PY
exit $failed
