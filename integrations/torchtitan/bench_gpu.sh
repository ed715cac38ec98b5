#!/usr/bin/env bash
# bench_gpu.sh -- TorchTitan's own trainer on 2 GPUs ($NPROC) with CAD attention against TorchTitan's and PyTorch's attention
# (results in docs/integrations.md). torchtitan 0.2.2 (the PyPI release that runs on torch 2.11) through
# titan_cad_spec.py (TrainSpecs + launcher = torchtitan.train.main with a step-timing trainer) and llama3_cad.toml:
# Llama 3 8B shape, $LAYERS layers, vocab $VOCAB, $SEQ tokens per GPU (one packed row of Pretrain-recipe documents,
# no download), FSDP2 + per-op selective AC as TorchTitan's Llama 3 8B TOML, compile off unless COMPILE=1.
#     OUT=<results dir> bash integrations/torchtitan/bench_gpu.sh        (from the repository root)
# Configurations (CONFIGS, in this order by default; each under RUN_S seconds, all under DEADLINE_S):
#   cad             model.name llama3_cad: CAD, prefix_aware ($BALANCER), a plan per micro-batch made ahead
#   local           llama3_cad_local: the project's kernels without plans (each rank its own documents)
#   local_balanced  llama3_cad_local on training.dataset pretrain_synthetic_balanced: every rank's row cut into
#                   documents of the mean rank's attention work, the measured ideal (as train_llama.py's)
#   torch_varlen    llama3_torch_varlen: torch varlen_attn (K/V repeated), eager
#   flex            llama3_titan flavor 8B_flex: TorchTitan's FlexAttention, block_causal document mask
#   titan_varlen    llama3_titan flavor 8B_varlen: TorchTitan's VarlenAttentionWrapper as is (compiled varlen_attn,
#                   K/V not repeated: may fail on GQA with torch 2.11)
# Context and tensor parallelism (not in the default CONFIGS: a set of their own, e.g. NPROC=8 CONFIGS="cad_cp flex_cp"):
#   cad_cp          llama3_cad with parallelism.context_parallel_degree $CP (default $NPROC) on training.dataset
#                   pretrain_stream: the step's documents packed whole over the data x context ranks, $SEQ tokens per
#                   GPU (the CP group's row is $SEQ * $CP), the longest document $MAX_DOC_LEN (default that row):
#                   NPROC=8 SEQ=131072 trains 1M-token documents over 8 GPUs
#   flex_cp         TorchTitan's own CP on the same row length: llama3_titan flavor 8B_flex with context_parallel_degree
#                   $CP (torch's context_parallel, FlexAttention's block_causal mask, EOS-delimited documents)
#   cad_tp          llama3_cad with parallelism.tensor_parallel_degree $TP (default 2), sequence parallel as TorchTitan
#                   sets it, FSDP2 over the other $NPROC / $TP ranks; $SEQ tokens per TP group
#   local_tp        llama3_cad_local with the same TP: the project's kernels without plans, its baseline
# Knobs: NPROC=2 (GPUs) CP=$NPROC TP=2 MAX_DOC_LEN LAYERS=4 SEQ=65536 STEPS=6 VOCAB=32768 COMPILE=0 AC_OPTION=op (selective_ac_option; "2" = every 2nd layer
# fully) SHAPE=8B (debugmodel: TorchTitan's small shape, for a CPU dry run with CAD_TT_DEVICE=cpu SKIP_BUILD=1
# BUILD=<a CPU build> SITE=<a scratch dir>) DEADLINE_S=290 RUN_S=80 WHEELS=.whl.
# Packages: torchtitan and what it imports, --no-deps into $SITE, from the wheels in $WHEELS where it has them (GPU
# machines here reach no index), else from PyPI.
# Build: $BUILD (default build-gpu, tests/multi_gpu/run.sh's) is used as it is when it holds libcad_host.so and the
# plugins (FORCE_BUILD=1 rebuilds); otherwise configured and built.
# Results: $OUT/r.tgz (logs, one JSON per configuration, table.md), $OUT/summary.txt.
set -uo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "bench_gpu.sh: no arguments (knobs are environment variables: bench_gpu.sh --help)" >&2; exit 2 ;;
esac
ROOT=$PWD
OUT=${OUT:?set OUT}
R=$OUT/r
mkdir -p "$R"
START=$(date +%s)
DEADLINE_S=${DEADLINE_S:-290}
RUN_S=${RUN_S:-80}
CONFIGS=${CONFIGS:-cad local local_balanced torch_varlen flex titan_varlen}
LAYERS=${LAYERS:-4} SEQ=${SEQ:-65536} STEPS=${STEPS:-6} VOCAB=${VOCAB:-32768} COMPILE=${COMPILE:-0} AC_OPTION=${AC_OPTION:-op} SHAPE=${SHAPE:-8B}
SITE=${SITE:-/tmp/site}
NPROC=${NPROC:-2} CP=${CP:-${NPROC:-2}} TP=${TP:-2}
SUMMARY=$R/summary.txt
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
pk() { tar -czf "$OUT/r.tgz" -C "$OUT" r 2>/dev/null; cp "$SUMMARY" "$OUT/summary.txt"; }
left() { echo $(( DEADLINE_S - ($(date +%s) - START) )); }
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
[ -n "${CAD_DATA:-}" ] || for f in "$ROOT/../shared/data/doclen_pretrain.json" "$ROOT/.bench_data/doclen_pretrain.json"; do
  [ -f "$f" ] && export CAD_DATA=$f && break; done

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } 2>&1 | tee -a "$SUMMARY"

# ---- packages: the carried wheels (torchtitan and what it imports) into $SITE ------------------------------------
WHEELS=${WHEELS:-.whl}
PKGS=(torchtitan==0.2.2 einops tyro docstring_parser typeguard torchdata)
if ls "$WHEELS"/torchtitan-*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE \
    "$WHEELS"/torchtitan-*.whl "$WHEELS"/einops-*.whl "$WHEELS"/tyro-*.whl "$WHEELS"/docstring_parser-*.whl \
    "$WHEELS"/typeguard-*.whl "$WHEELS"/torchdata-*.whl > "$R/pip.log" 2>&1
else
  python3 -m pip install -q --no-deps --no-compile --no-cache-dir --upgrade --target $SITE "${PKGS[@]}" > "$R/pip.log" 2>&1
fi || { note "pip failed"; tail -5 "$R/pip.log" | tee -a "$SUMMARY"; pk; exit 1; }
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
# fallbacks, only where the machine lacks them (typeguard 4.6 wants typing_extensions >= 4.14)
for m in requests:requests urllib3:urllib3 idna:idna charset_normalizer:charset_normalizer certifi:certifi packaging:packaging; do
  mod=${m%%:*} whl=${m##*:}
  python3 -c "import $mod" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE $WHEELS/fallback/${whl}-*.whl >> "$R/pip.log" 2>&1; note "fallback wheel: $whl"; }
done
python3 -c "import typeguard, tyro" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $SITE $WHEELS/fallback/typing_extensions-*.whl >> "$R/pip.log" 2>&1; note "fallback wheel: typing_extensions"; }

# ---- build ----------------------------------------------------------------------------------------------------------
BUILD=${BUILD:-$ROOT/build-gpu}
s=$(date +%s)
rc=0
if [ "${FORCE_BUILD:-0}" != 1 ] && [ -f "$BUILD/lib/libcad_host.so" ] && [ -f "$BUILD/lib/cad/plugins/cad_prefix_aware.so" ] &&
   [ -f "$BUILD/lib/cad/plugins/cad_nccl.so" ] && [ -f "$BUILD/lib/cad/plugins/cad_cuda.so" ]; then
  SKIP_BUILD=1; note "build: $BUILD has cad_host and the plugins: not rebuilt (FORCE_BUILD=1 rebuilds)"
fi
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  { [ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90a; } > "$R/build.log" 2>&1 &&
  timeout -k 10 $(( $(left) - 60 )) cmake --build "$BUILD" -j "$(nproc)" --target cad_host cad_plugin_cad cad_plugin_cuda \
    cad_plugin_nccl cad_plugin_host cad_plugin_reference cad_plugin_prefix_aware cad_plugin_distca >> "$R/build.log" 2>&1
  rc=$?
fi
note "build: rc=$rc in $(( $(date +%s) - s )) s"
if [ "$rc" != 0 ]; then tail -30 "$R/build.log" | tee -a "$SUMMARY"; pk; exit 1; fi
export CAD_HOST_LIBRARY=$BUILD/lib/libcad_host.so CAD_PLUGIN_PATH=$BUILD/lib/cad/plugins CAD_LOG_LEVEL=warn
export PYTHONPATH=$PYTHONPATH:$ROOT/host_adapter/python:$ROOT/integrations/torchtitan
python3 -c "import torchtitan, cad, titan_cad_spec; print('torchtitan', torchtitan.__version__)" > "$R/import.log" 2>&1
note "import: rc=$? $(tail -1 "$R/import.log")"

# ---- runs -----------------------------------------------------------------------------------------------------------
EXTRA=()
[ "$COMPILE" = 1 ] && EXTRA+=(--compile.enable)
note "configs: $CONFIGS; layers $LAYERS, seq $SEQ per GPU, steps $STEPS, vocab $VOCAB, compile $COMPILE, AC selective/$AC_OPTION"
export CAD_TT_LAYERS=$LAYERS CAD_TT_VOCAB=$VOCAB CAD_TT_BALANCER=${BALANCER:-prefix_aware}
port=29611
for c in $CONFIGS; do
  case "$c" in
    cad) model=(--model.name llama3_cad --model.flavor $SHAPE) ;;
    local) model=(--model.name llama3_cad_local --model.flavor $SHAPE) ;;
    local_balanced) model=(--model.name llama3_cad_local --model.flavor $SHAPE --training.dataset pretrain_synthetic_balanced) ;;
    torch_varlen) model=(--model.name llama3_torch_varlen --model.flavor $SHAPE) ;;
    flex) model=(--model.name llama3_titan --model.flavor ${SHAPE}_flex) ;;
    titan_varlen) model=(--model.name llama3_titan --model.flavor ${SHAPE}_varlen) ;;
    cad_cp) model=(--model.name llama3_cad --model.flavor $SHAPE --training.dataset pretrain_stream
                   --parallelism.context_parallel_degree "$CP") ;;
    flex_cp) model=(--model.name llama3_titan --model.flavor ${SHAPE}_flex --parallelism.context_parallel_degree "$CP") ;;
    cad_tp) model=(--model.name llama3_cad --model.flavor $SHAPE --parallelism.tensor_parallel_degree "$TP") ;;
    local_tp) model=(--model.name llama3_cad_local --model.flavor $SHAPE --parallelism.tensor_parallel_degree "$TP") ;;
    *) note "$c: unknown configuration"; continue ;;
  esac
  l=$(left); t=$(( RUN_S < l ? RUN_S : l ))
  if [ "$t" -lt 40 ]; then note "$c: SKIPPED (${l} s left)"; continue; fi
  s=$(date +%s)
  seq=$SEQ
  case "$c" in *_cp) seq=$(( SEQ * CP )) ;; esac  # TorchTitan's seq_len under CP: the CP group's row
  CAD_TT_MAX_DOC_LEN=${MAX_DOC_LEN:-$seq} CAD_TT_JSON=$R/$c.json timeout -k 10 "$t" \
    python3 -m torch.distributed.run --nproc-per-node "$NPROC" --master-port $port \
    integrations/torchtitan/titan_cad_spec.py --job.config_file integrations/torchtitan/llama3_cad.toml "${model[@]}" \
    --training.seq_len "$seq" --training.steps "$STEPS" --debug.seed 7 --job.dump_folder "$R/dump_$c" \
    --activation_checkpoint.selective_ac_option "$AC_OPTION" "${EXTRA[@]}" > "$R/$c.log" 2>&1
  rc=$?
  port=$((port + 1))
  how="rc=$rc"; [ "$rc" = 124 ] && how="TIMED OUT after $t s"
  note "$c: $how in $(( $(date +%s) - s )) s"
  grep -E "^CAD_TT step" "$R/$c.log" | tee -a "$SUMMARY"
  [ "$rc" != 0 ] && grep -E "Error|error:" "$R/$c.log" | grep -v lspci | tail -4 | cut -c1-400 | tee -a "$SUMMARY"
  [ -f "$R/$c.json" ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('  %s/%s: mean step after the first %.3f s, peak %.1f GiB, last loss %s' % (d['model'], d['flavor'], d['mean_step_s_after_first'], max(r.get('peak_gib', 0) for r in d['steps']), d['steps'][-1]['loss']))" "$R/$c.json" | tee -a "$SUMMARY"
  pk
done
python3 "$ROOT/integrations/torchtitan/bench_table.py" "$R" > "$R/table.md" 2>> "$SUMMARY" && cat "$R/table.md" >> "$SUMMARY"
note "total $(( $(date +%s) - START )) s"
rm -rf "$R"/dump_*
pk
echo "---- summary ----"
cat "$OUT/summary.txt"
