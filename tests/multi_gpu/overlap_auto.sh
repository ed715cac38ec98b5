#!/usr/bin/env bash
# overlap_auto.sh -- the trainer's --overlap auto (+ovauto, cad.OverlapChoice) on the slow-link stand-in and on
# NVLink, beside unsplit CAD and the head groups measured best there (+hg4), with local and local_balanced (the
# measured ideal). 2 GPUs (NGPU to change), Llama-3-8B shapes, 64K tokens per GPU, 2 layers, 5 steps (step 0 warms
# up, the choice observes step 1, runs from step 2, is confirmed or reverted after it).
#   p2p_off: NCCL_P2P_DISABLE=1, every byte through host memory (bench/results/trainer_h200x2_2026-11-28_6fc2a34_4, _5: unsplit CAD 0.988x
#            local, stall 8.8% of the step; +hg4 1.010x): the choice should take head groups there;
#   nvlink:  NCCL as it is (stall 2.5-4.2%): the choice should stay off and cost nothing.
# Fails (exit 1) where a stage fails, or a +ovauto run wrote no final overlap_decision (tests/multi_gpu/run.sh's
# train stage and tables; timings decide nothing here: read the tables). Logs and JSON under $OUT/<link>/.
# Usage: OUT=/tmp/ov bash tests/multi_gpu/overlap_auto.sh   (SKIP_BUILD=1: the plugins are built in build-gpu already)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/overlap_auto_out}"
NGPU="${NGPU:-2}"
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
failed=0
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  NGPU=$NGPU OUT="$OUT/build" ONLY=build bash tests/multi_gpu/run.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
CONFIGS="${CONFIGS:-local,local_balanced,prefix_aware,prefix_aware+hg4,prefix_aware+ovauto}"
for link in p2p_off nvlink; do
  env_for=()
  [ "$link" = p2p_off ] && env_for=(NCCL_P2P_DISABLE=1)
  env "${env_for[@]}" NGPU=$NGPU OUT="$OUT/$link" SKIP_BUILD=1 ONLY=train CONTEXTS=65536 STEPS="${STEPS:-5}" \
    LAYERS=65536:2 CONFIGS="$CONFIGS" TRAINER_ARGS="--sync-attention-timing off ${TRAINER_ARGS:-}" TRAIN_BUDGET_S="${TRAIN_BUDGET_S:-240}" \
    bash tests/multi_gpu/run.sh > "$OUT/$link.log" 2>&1
  rc=$?
  echo "$link: run.sh exit $rc"
  [ "$rc" = 0 ] || failed=1
  # The choice as the run wrote it: its mode, the steps it changed at, and why.
  python3 - "$OUT/$link" <<'PY' || failed=1
import glob, json, sys
paths = glob.glob(f"{sys.argv[1]}/train_prefix_aware_autooverlap_*.json")
if not paths:
    sys.exit(f"{sys.argv[1]}: no +ovauto JSON")
for path in paths:
    decision = json.load(open(path))["summary"].get("overlap_decision")
    if not decision or not decision.get("final"):
        sys.exit(f"{path}: no final overlap_decision: {decision}")
    print(f"{path}: {decision['mode']} (head groups {decision['head_groups']}), changes at steps "
          f"{json.load(open(path))['summary']['overlap_steps']}: {decision['reason']}")
PY
  grep -E "^\| 64K" "$OUT/$link/table.md" 2>/dev/null | cut -d'|' -f2-12
done
exit $failed
