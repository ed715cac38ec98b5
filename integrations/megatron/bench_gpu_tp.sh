#!/usr/bin/env bash
# bench_gpu_tp.sh -- Megatron-Core with CAD under tensor parallelism, from Megatron's own DDP, distributed optimizer and
# schedules (train_gpt_cad.py --trainer megatron), on 4 GPUs (TP2 x DP2) or 8 GPUs (TP4 x DP2 and TP2 x DP4):
# Llama-3-8B shape, $LAYERS layers, $SEQ tokens per data-parallel rank and micro-batch, sequence parallelism
# (Transformer Engine's layer spec, CAD as its core attention) where transformer_engine imports.
#     OUT=<results dir> bash integrations/megatron/bench_gpu_tp.sh        (from the repository root)
# Configurations (CONFIGS, in this order): te (Megatron's fastest attention: TEDotProductAttention, THD; skipped with
# a note where transformer_engine does not import), local (CAD's kernels, no plans), local_balanced (the measured
# ideal), cad (a plan per micro-batch made ahead). Each layout is one torchrun; a layout whose GPUs are not there is
# skipped with a note.
# Knobs: LAYOUTS ("tp2dp2" on 4 GPUs, "tp4dp2 tp2dp4" on 8; default: what the GPUs allow), LAYERS=8 SEQ=65536
# STEPS=6 MICRO=2 VOCAB=32768 CONFIGS="te local local_balanced cad" SP=1 (sequence parallelism; 0: off, the local
# spec) RUN_S=600 (per layout). Build: $BUILD (default build-gpu) is used where it holds libcad_host.so and the CUDA
# plugins, else configured and built (CAD_ENABLE_CUDA=ON, sm_90a).
# Results: $OUT/<layout>.log, $OUT/<layout>_<config>.json, $OUT/summary.txt; exits non-zero if any layout fails or the
# losses of cad and te (or local) disagree by more than 2% (bf16).
set -uo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "bench_gpu_tp.sh: no arguments (knobs are environment variables: bench_gpu_tp.sh --help)" >&2; exit 2 ;;
esac
export NCCL_NVLS_ENABLE=0  # NVLink multicast off (the machines here refuse it)
ROOT=$PWD
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ -z "${LAYOUTS:-}" ]; then
  if [ "$GPUS" -ge 8 ]; then LAYOUTS="tp4dp2 tp2dp4"; elif [ "$GPUS" -ge 4 ]; then LAYOUTS="tp2dp2"; else LAYOUTS=""; fi
fi
LAYERS=${LAYERS:-8} SEQ=${SEQ:-65536} STEPS=${STEPS:-6} MICRO=${MICRO:-2} VOCAB=${VOCAB:-32768} SP=${SP:-1}
CONFIGS=${CONFIGS:-"te local local_balanced cad"} RUN_S=${RUN_S:-600}
BUILD=${BUILD:-$ROOT/build-gpu}
if [ ! -f "$BUILD/lib/libcad_host.so" ] || [ ! -f "$BUILD/lib/cad/plugins/cad_cuda.so" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    > "$OUT/build.log" 2>&1 && cmake --build "$BUILD" -j "$(nproc)" >> "$OUT/build.log" 2>&1 \
    || { echo "build failed (see $OUT/build.log)"; exit 1; }
fi
export CAD_HOST_LIBRARY=$BUILD/lib/libcad_host.so CAD_PLUGIN_PATH=$BUILD/lib/cad/plugins CAD_LOG_LEVEL=warn
export PYTHONPATH=$ROOT/host_adapter/python${PYTHONPATH:+:$PYTHONPATH}
if [ "$SP" = 1 ] && ! python3 -c "import transformer_engine" 2>/dev/null; then
  echo "transformer_engine does not import: sequence parallelism off (local spec; te skipped)" | tee -a "$OUT/summary.txt"
  SP=0
fi
status=0
[ -n "$LAYOUTS" ] || { echo "no layout fits $GPUS GPU(s) (4 or 8 needed)" | tee -a "$OUT/summary.txt"; exit 1; }
for layout in $LAYOUTS; do
  tp=${layout#tp}; tp=${tp%%dp*}; dp=${layout##*dp}; n=$((tp * dp))
  if [ "$n" -gt "$GPUS" ]; then echo "$layout: needs $n GPUs, $GPUS here: skipped" | tee -a "$OUT/summary.txt"; continue; fi
  configs=$(echo "$CONFIGS" | tr ' ' ',')
  sp=(); [ "$SP" = 1 ] && sp=(--sequence-parallel)
  timeout -k 10 "$RUN_S" torchrun --nproc-per-node "$n" integrations/megatron/train_gpt_cad.py --device cuda \
    --trainer megatron --model llama3-8b --layers "$LAYERS" --vocab "$VOCAB" --context "$SEQ" --steps "$STEPS" \
    --warmup-steps 2 --micro-batches "$MICRO" --tensor-parallel-size "$tp" "${sp[@]}" --configs "$configs" \
    --json-out "$OUT/${layout}_{config}.json" > "$OUT/$layout.log" 2>&1
  rc=$?
  echo "$layout (TP$tp x DP$dp, $n GPUs): exit $rc" | tee -a "$OUT/summary.txt"
  grep -E "vs |realised share|skipped" "$OUT/$layout.log" | tee -a "$OUT/summary.txt"
  [ "$rc" = 0 ] || status=1
  python3 - "$OUT" "$layout" <<'EOF' || status=1
import json, pathlib, sys
out, layout = pathlib.Path(sys.argv[1]), sys.argv[2]
runs = {p.stem[len(layout) + 1:]: json.loads(p.read_text())["summary"] for p in out.glob(f"{layout}_*.json")}
base = runs.get("te") or runs.get("megatron") or runs.get("local")
if "cad" not in runs or base is None:
    sys.exit(f"{layout}: cad or its baseline did not finish ({sorted(runs)})")
worst = max(abs(a - b) / abs(b) for a, b in zip(runs["cad"]["losses"], base["losses"]))
print(f"{layout}: cad losses within {worst:.2e} of {base['config']}")
sys.exit(1 if worst > 2e-2 else 0)
EOF
done
exit $status
