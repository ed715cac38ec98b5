# stage_log.sh -- sourced by run.sh and pipeline.sh once OUT is set (from the repository root): the run's summary
# file, NCCL's environment, the Pretrain data file, and `record NAME STATUS` for each stage (a line in the summary,
# `failed` set on a non-zero status, and with TAR=FILE everything under OUT packed into FILE, so that a run cut
# short still returns what it did).
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export CAD_DATA="${CAD_DATA:-$PWD/../shared/data/doclen_pretrain.json}"
[ -f "$CAD_DATA" ] || CAD_DATA="$PWD/.bench_data/doclen_pretrain.json"
failed=0
pack() { if [ -n "${TAR:-}" ]; then tar -czf "$TAR.tmp" -C "$OUT" . && mv -f "$TAR.tmp" "$TAR"; fi; }
record() {  # record NAME STATUS
  echo "$1: $([ "$2" = 0 ] && echo passed || echo "FAILED (exit $2)") [$(date +%H:%M:%S)]" | tee -a "$SUMMARY"
  [ "$2" = 0 ] || failed=1
  pack
}
