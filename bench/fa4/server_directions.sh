#!/usr/bin/env bash
# server_directions.sh -- CAD's server backend chosen per direction, on ONE H200, unattended (not run by CI). Four
# choices over the same batches: ours/ours (server_backend "default"), FA4/FA4 ("fa4"), our forward with FA4's
# backward ("default+fa4"), and the local FA4 baseline (the trainer's --attention fa4, no CAD). Stages, one device
# run each, in this order on one warm machine (ignored folders .whl/ and build-*/ stay between the runs):
#   build            CUDA build of the targets the Python side needs (build-gpu); checks .whl/fa4a arrived
#   calls            FA4 installed (.whl/fa4b now there too); check: each choice, fa4+default included, against
#                    the fp32 torch server backend (O, LSE, dQ, dK, dV) at world size 1; per server call: the
#                    choices' forward and backward server compute on one Pretrain buffer of 64K and of 128K, 5
#                    timed rounds each, the choices' order rotated every round; then the trainer at 64K, round 1
#   train CTX:ROUND ...  the 1-GPU trainer (Llama-3-8B shape, 8 layers, full checkpointing, 2 micro-batches) at
#                    CTX tokens: the four configurations in one process, their order rotated by ROUND; one process
#                    per CTX:ROUND given, in the order given
# Every stage but build ends with the tables of everything measured so far ($OUT/table.md, server_directions_table.py).
# Results accumulate in build-srvdir/ (kept between runs); each stage writes $OUT/summary.txt, its logs as
# $OUT/STAGE.tgz, and exits non-zero when a part failed. Every part has a hard time limit (`timeout`).
set -uo pipefail
cd "$(dirname "$0")/../.."
stage="${1:?usage: server_directions.sh build|calls|train CTX:ROUND...}"
shift
OUT="${OUT:-$PWD/server_directions_out}"
BUILD=build-gpu
KEEP="$PWD/build-srvdir"
mkdir -p "$OUT" "$KEEP"
name="$stage$(printf '_%s' "$@" | tr ':' r)"
[ "$stage" = train ] || name=$stage
LOG="$KEEP/$name"
BUDGET_S="${BUDGET_S:-560}"  # the whole stage ends within this (one run on the GPU machine is at most 600 s)
rm -rf "$LOG" && mkdir -p "$LOG"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4 FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
export FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$KEEP/cute_cache"  # FA4's compiled kernels, kept for later stages
for CAD_DATA in "$PWD/../shared/data/doclen_pretrain.json" "$PWD/.whl/fa4a/doclen_pretrain.json" \
    "$KEEP/fa4a/doclen_pretrain.json"; do
  [ -f "$CAD_DATA" ] && break
done
export CAD_DATA
S=$(date +%s)
failed=0
say() { echo "[$(( $(date +%s) - S )) s] $*" | tee -a "$SUMMARY"; }
record() {  # record NAME STATUS LOG
  say "$1: $([ "$2" = 0 ] && echo passed || echo "FAILED (exit $2)")"
  [ "$2" = 0 ] || { failed=1; tail -25 "$3" | tee -a "$SUMMARY"; }
}
left() {  # left CAP: CAP seconds, or what the stage's budget still allows (30 s kept for the tables)
  local rest=$(( BUDGET_S - ($(date +%s) - S) - 30 ))
  [ "$rest" -lt "$1" ] && echo $(( rest > 10 ? rest : 10 )) || echo "$1"
}
finish() {
  if [ "$stage" != build ]; then
    timeout 30 python3 bench/fa4/server_directions_table.py "$KEEP" > "$OUT/table.md" 2> "$LOG/table.log"
    record "tables (table.md)" $? "$LOG/table.log"
    cat "$OUT/table.md"
  fi
  ( cd "$KEEP" && tar -czf "$OUT/$name.tgz" --exclude=cute_cache "$(basename "$LOG")" $(ls -d train_* 2>/dev/null) \
      $(ls -d calls 2>/dev/null | grep -vx "$(basename "$LOG")") )
  say "done (exit $failed)"
  exit $failed
}
python_env() {
  export CAD_HOST_LIBRARY="$PWD/$BUILD/lib/libcad_host.so" CAD_PLUGIN_PATH="$PWD/$BUILD/lib/cad/plugins" CAD_LOG_LEVEL=warn
  source bench/fa4/unpack.sh env
  export PYTHONPATH="$PWD/host_adapter/python:$PYTHONPATH"
}
# The four configurations of the trainer, rotated by the round: --configs takes them in this order.
CONFIGS=(prefix_aware prefix_aware+fa4srv prefix_aware+fa4bwd fa4)
train() {  # train CTX ROUND STEPS CAP_S
  local ctx=$1 round=$2 steps=$3 limit n=${#CONFIGS[@]} order=() i
  limit=$(left "$4")
  for ((i = 0; i < n; i++)); do order+=("${CONFIGS[(i + round - 1) % n]}"); done
  local list; list=$(IFS=,; echo "${order[*]}")
  mkdir -p "$KEEP/train_${ctx}_r$round"
  timeout "$limit" torchrun --nproc-per-node 1 examples/train_llama.py --device cuda --model llama3-8b --layers 8 \
    --context "$ctx" --micro-batches 2 --checkpointing full --steps "$steps" --configs "$list" \
    --json-out "$KEEP/train_${ctx}_r$round/{config}.json" > "$LOG/train_${ctx}_r$round.log" 2>&1
  record "trainer ${ctx} round $round ($list, $steps steps)" $? "$LOG/train_${ctx}_r$round.log"
}
{ date -u; git describe --always --dirty --abbrev=12 2>/dev/null; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } \
  | tee -a "$SUMMARY"
case "$stage" in
  build)
    bash bench/fa4/unpack.sh check > "$LOG/unpack_check.log" 2>&1
    record "FA4 part 1 here" $? "$LOG/unpack_check.log"
    rm -rf "$KEEP/fa4a" && cp -r .whl/fa4a "$KEEP/fa4a"  # kept where no later folder sent replaces it
    { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
        -DCAD_BUILD_TESTS=OFF -DCAD_PYTHON_TESTS=OFF &&
      timeout 500 cmake --build "$BUILD" -j "$(nproc)" --target cad_host cad_plugin_cad cad_plugin_cuda \
        cad_plugin_host cad_plugin_nccl cad_plugin_reference cad_plugin_prefix_aware cad_plugin_callback_attention; } \
      > "$LOG/build.log" 2>&1
    record build $? "$LOG/build.log"
    finish ;;
  calls)
    timeout "$(left 90)" bash bench/fa4/unpack.sh install > "$LOG/unpack.log" 2>&1
    record "FA4 installed" $? "$LOG/unpack.log"
    [ "$failed" = 0 ] || finish
    python_env
    timeout "$(left 130)" python3 tests/gpu_python/server_backend_fa4.py check --worlds 1 --out "$LOG" \
      --backends default,fa4,default+fa4,fa4+default > "$LOG/check.log" 2>&1
    record "check: default, fa4, default+fa4, fa4+default vs the fp32 reference (world size 1)" $? "$LOG/check.log"
    for ctx in 65536 131072; do
      timeout "$(left 100)" python3 tests/gpu_python/server_backend_fa4.py bench --worlds 1 --context $ctx --rounds 5 \
        --out "$LOG" --backends default,fa4,default+fa4 > "$LOG/bench_$ctx.log" 2>&1
      record "per call, $ctx tokens" $? "$LOG/bench_$ctx.log"
      grep "median ms" "$LOG/bench_$ctx.log" | tee -a "$SUMMARY"
    done
    train 65536 1 4 200
    finish ;;
  train)
    [ $# -gt 0 ] || { echo "server_directions.sh train CTX:ROUND ..." >&2; exit 2; }
    python_env
    for pair in "$@"; do
      ctx=${pair%%:*} round=${pair#*:}
      if [ "$ctx" -gt 65536 ]; then train "$ctx" "$round" 3 300; else train "$ctx" "$round" 4 200; fi
    done
    finish ;;
  *) echo "server_directions.sh: unknown stage '$stage'" >&2; exit 2 ;;
esac
