#!/usr/bin/env bash
# long_docs.sh -- documents longer than a rank on ONE GPU (not run by CI): examples/train_llama.py --max-doc-len,
# every step's documents packed over the ranks whole (cad.train.long_docs), through CAD's host-staged path with 2
# and 4 processes sharing the GPU (--communicator host: gloo, pinned host buffers), against one process training
# the same token stream with every document whole (local attention, the project's kernel). Steps 4, 7 and 8 hold
# a document over all 4 ranks, every step one over 2 (printed as "spans"). Checks: every run's 10 steps exist and
# each step's loss is within 2e-2 (relative, bf16) of the one process's; and a --memory-cap below a document's
# floor is refused by every rank before its step, naming the document (cad.packing.check_memory_cap).
#   1. build (CUDA, sm_90a) libcad_host and the plugins in $BUILD (default build-gpu), unless --skip-build;
#   2. the runs; results under $OUT (default ./gpu_long_docs_out): summary.txt, train_*.log/json, losses.txt.
# Exits non-zero on any failure. Usage: bash tests/gpu_python/long_docs.sh [--skip-build]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu_long_docs_out}"
BUILD="${BUILD:-build-gpu}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
export NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=2
# The trainer's batches: ../shared does not travel to a device machine; .bench_data/ holds a copy there.
export CAD_DATA="${CAD_DATA:-$PWD/../shared/data/doclen_pretrain.json}"
[ -f "$CAD_DATA" ] || CAD_DATA="$PWD/.bench_data/doclen_pretrain.json"
failed=0
record() {  # record NAME STATUS [LOG]
  local line="$1: $([ "$2" = 0 ] && echo passed || echo "FAILED (exit $2)")"
  echo "$line" | tee -a "$SUMMARY"
  [ "$2" = 0 ] || { failed=1; [ -n "${3:-}" ] && tail -30 "$3" | tee -a "$SUMMARY"; }
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$SUMMARY"
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%dT%H:%MZ)" | tee -a "$SUMMARY"

if [ "${1:-}" != --skip-build ]; then
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DCAD_PYTHON_TESTS=OFF &&
    cmake --build "$BUILD" -j "$(nproc)" --target cad_host cad_plugin_cad cad_plugin_cuda cad_plugin_host \
      cad_plugin_nccl cad_plugin_reference cad_plugin_colocated cad_plugin_per_doc_cp cad_plugin_distca \
      cad_plugin_prefix_aware; } > "$OUT/build.log" 2>&1
  rc=$?
  record "build" "$rc" "$OUT/build.log"
  [ "$rc" = 0 ] || exit 1
fi
export CAD_HOST_LIBRARY="$PWD/$BUILD/lib/libcad_host.so" PYTHONPATH="$PWD/host_adapter/python"
export CAD_PLUGIN_PATH="$PWD/$BUILD/lib/cad/plugins" CAD_LOG_LEVEL=warn

TOTAL=32768  # tokens of a step, over every rank
COMMON=(--device cuda --steps 10 --seed 3 --max-doc-len "$TOTAL" --layers 4 --hidden 512 --heads 8 --kv-heads 2
        --timeout-ms 120000)
train() {  # train NAME NPROC ARGS...
  local name="$1" n="$2"; shift 2
  timeout 900 python3 -m torch.distributed.run --standalone --nproc-per-node "$n" examples/train_llama.py \
    "${COMMON[@]}" --tokens-per-rank $((TOTAL / n)) --json-out "$OUT/train_$name.json" "$@" > "$OUT/train_$name.log" 2>&1
  record "train_llama --max-doc-len $TOTAL: $name" $? "$OUT/train_$name.log"
}
train one_process_local 1 --attention local
for balancer in prefix_aware colocated; do
  train "cad_host_2procs_$balancer" 2 --attention cad --communicator host --balancer "$balancer"
  train "cad_host_4procs_$balancer" 4 --attention cad --communicator host --balancer "$balancer"
done

python3 - "$OUT" "$TOTAL" > "$OUT/losses.txt" 2>&1 <<'PY'
import argparse, json, os, pathlib, sys
from cad.train import long_docs
out, total = pathlib.Path(sys.argv[1]), int(sys.argv[2])
lengths = json.loads(pathlib.Path(os.environ["CAD_DATA"]).read_text())
for n in (2, 4):
    a = argparse.Namespace(max_doc_len=total, context=total // n, seed=3, vocab=1024)
    print(f"spans over {n} ranks (most ranks one document lies on, per step):",
          [max(map(len, long_docs.long_step(lengths, a, n, s, 0).spans().values())) for s in range(10)])
bad = 0
try:
    want = json.loads((out / "train_one_process_local.json").read_text())["steps"]
except (OSError, KeyError, ValueError) as e:
    print(f"one process: missing ({e})"); sys.exit(1)
for n in (2, 4):
    for balancer in ("prefix_aware", "colocated"):
        name = f"cad_host_{n}procs_{balancer}"
        try:
            got = json.loads((out / f"train_{name}.json").read_text())["steps"]
        except (OSError, KeyError, ValueError) as e:
            print(f"{name}: missing ({e})"); bad += 1; continue
        if len(got) != len(want) or len(got) != 10:
            print(f"{name}: {len(got)} steps, one process {len(want)}"); bad += 1; continue
        worst = max(abs(s["loss"] - t["loss"]) / abs(t["loss"]) for s, t in zip(got, want))
        ok = worst < 2e-2
        bad += 0 if ok else 1
        print(f"{name} vs one process: worst relative loss difference over {len(got)} steps {worst:.2e} "
              f"({'ok' if ok else 'TOO LARGE'}); mean imbalance {sum(s['imbalance'] for s in got[1:]) / 9:.3f}")
sys.exit(1 if bad else 0)
PY
record "losses of CAD (2 and 4 processes on one GPU) against one process" $? "$OUT/losses.txt"
cat "$OUT/losses.txt" >> "$SUMMARY"

# A cap below the floor of step 0's largest document (372736 bytes at these shapes): refused before the step on every rank, naming the document.
timeout 300 python3 -m torch.distributed.run --standalone --nproc-per-node 2 examples/train_llama.py "${COMMON[@]}" \
  --tokens-per-rank $((TOTAL / 2)) --attention cad --communicator host --memory-cap 262144 \
  > "$OUT/train_memory_cap.log" 2>&1
rc=$?
if [ "$rc" != 0 ] && grep -q "no plan of this layout fits memory cap 262144 bytes: document" "$OUT/train_memory_cap.log" \
   && ! grep -q "^step" "$OUT/train_memory_cap.log"; then
  record "--memory-cap 262144 refused before step 0, naming the document" 0
else
  record "--memory-cap 262144 refused before step 0, naming the document (exit $rc)" 1 "$OUT/train_memory_cap.log"
fi
echo "---- summary ----"
cat "$SUMMARY"
exit $failed
