#!/usr/bin/env bash
# long_docs.sh -- documents longer than a GPU across the GPUs of one host (needs 2+ GPUs; not run by CI): the
# trainer users run (examples/train_llama.py, Llama-3-8B shape, FSDP2, full checkpointing, 2 micro-batches) with
# each step's documents packed over the ranks whole (--max-doc-len, cad.pack_documents) and attended whole through
# CAD, for every balancer that plans pieces: prefix_aware, per_doc_cp (TransformerEngine's head/tail layout),
# colocated (the all-gather-KV context parallelism) and distca; then TorchTitan's CP through CAD beside its own
# FlexAttention CP (integrations/torchtitan/bench_gpu.sh cad_cp flex_cp) on the same tokens per GPU.
# Knobs (environment): NGPU (default: every GPU), MAX_DOC_LEN (default 1048576 on 8 GPUs, 524288 on 4, 262144 on
# 2), TOKENS (tokens per GPU, default 131072), LAYERS (default 4), STEPS (default 3), OUT (required). Exits
# non-zero when a run fails. Usage: OUT=/tmp/r NGPU=8 bash tests/multi_gpu/long_docs.sh
set -uo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "long_docs.sh: no arguments (knobs are environment variables: long_docs.sh --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0
OUT=${OUT:?set OUT}
NGPU=${NGPU:-$(nvidia-smi -L 2>/dev/null | wc -l)}
[ "$NGPU" -ge 2 ] || { echo "long_docs.sh: needs 2 or more GPUs, $NGPU here" >&2; exit 1; }
case "$NGPU" in 2|3) dflt=262144 ;; 4|5|6|7) dflt=524288 ;; *) dflt=1048576 ;; esac
MAX_DOC_LEN=${MAX_DOC_LEN:-$dflt} TOKENS=${TOKENS:-131072} LAYERS=${LAYERS:-4} STEPS=${STEPS:-3}
mkdir -p "$OUT"
status=0 rc=0
NGPU=$NGPU OUT=$OUT/trainer ONLY=build,train CONFIGS=prefix_aware,per_doc_cp,colocated,distca CONTEXTS=$TOKENS \
  LAYERS="$TOKENS:$LAYERS" STEPS=$STEPS TRAINER_ARGS="--max-doc-len $MAX_DOC_LEN" bash tests/multi_gpu/run.sh \
  > "$OUT/trainer.log" 2>&1 || rc=$?
echo "trainer --max-doc-len $MAX_DOC_LEN over $NGPU GPUs: exit $rc" | tee -a "$OUT/summary.txt"
[ "$rc" = 0 ] || status=1; rc=0
NPROC=$NGPU CONFIGS="cad_cp flex_cp" SEQ=$TOKENS MAX_DOC_LEN=$MAX_DOC_LEN OUT=$OUT/torchtitan \
  bash integrations/torchtitan/bench_gpu.sh > "$OUT/torchtitan.log" 2>&1 || rc=$?
echo "torchtitan cad_cp / flex_cp over $NGPU GPUs: exit $rc" | tee -a "$OUT/summary.txt"
[ "$rc" = 0 ] || status=1
exit $status
