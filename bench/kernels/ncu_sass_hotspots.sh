#!/usr/bin/env bash
# ncu_sass_hotspots.sh -- on the GPU machine, from the repository root: Nsight Compute's per-instruction counters
# (SourceCounters: warp instructions executed and warp stall samples per SASS instruction) for the project's Hopper
# forward and backward on one case of cad_kernel_bench (default dense_causal_16k: one causal document of 16K tokens,
# Hq 32, Hkv 8, D 128, bf16), one profiled launch each. Writes per kernel K (fwd, bwd) $OUT/hotspots_K.md
# (bench/kernels/sass_hotspots.py: per opcode, and the most-stalled instructions) and, in $OUT/ncu_hotspots.tgz,
# ncu_K.ncu-rep, sass_K.csv (the per-instruction table) and the logs. Builds build-gpu's cad_kernel_bench
# (configured here if it is not). D=64 profiles the head dim 64 kernels instead, on cad_bwd_variant_bench's first case
# (Pretrain 64K buffer 0; cad_kernel_bench is D 128 only; CASE is then not read).
# Exits non-zero when the build, a profile or a summary failed.
#   usage: [OUT=dir] [CASE=dense_causal_16k] [D=128|64] bash bench/kernels/ncu_sass_hotspots.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
CASE=${CASE:-dense_causal_16k}
D=${D:-128}
case "$D" in
  128) BIN=cad_kernel_bench; ARGS=(bench/kernels/pretrain_batches.txt "$CASE"); SKIP=2 ;;  # past case_timer's 2 warm-ups
  64) BIN=cad_bwd_variant_bench; ARGS=(bench/kernels/pretrain_batches.txt 64 1); SKIP=1; CASE=pretrain_64k_buf0 ;;
  *) echo "D=$D: 128 or 64" >&2; exit 2 ;;
esac
B=build-gpu
W=$OUT/ncu_hotspots
mkdir -p "$W"
rc=0
if [ ! -f "$B/build.ninja" ]; then
  timeout 120 cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a > "$W/configure.log" 2>&1 || { echo "configure failed ($W/configure.log)"; exit 1; }
fi
timeout 400 cmake --build "$B" -j"$(nproc)" --target "$BIN" > "$W/build.log" 2>&1 ||
  { echo "build of $BIN failed ($W/build.log)"; tail -20 "$W/build.log"; exit 1; }
for k in fwd bwd; do
  # -s: past the case's warm-up launches (case_timer.h: 2 in cad_kernel_bench, 1 in cad_bwd_variant_bench).
  timeout 200 ncu --clock-control none -k regex:"attention_${k}_sm90" -s "$SKIP" -c 1 --section SourceCounters \
    --section WarpStateStats -f -o "$W/ncu_$k" "$B/bin/$BIN" "${ARGS[@]}" > "$W/ncu_$k.log" 2>&1
  r=$?; echo "$k: profile rc=$r"; [ "$r" = 0 ] || { rc=1; tail -5 "$W/ncu_$k.log"; continue; }
  ncu -i "$W/ncu_$k.ncu-rep" --page source --print-source sass --csv > "$W/sass_$k.csv" 2> "$W/sass_$k.err" ||
    { echo "$k: the per-instruction table failed"; cat "$W/sass_$k.err"; rc=1; continue; }
  python3 bench/kernels/sass_hotspots.py "$W/sass_$k.csv" --title "$k, $CASE, D $D" > "$OUT/hotspots_$k.md" ||
    { echo "$k: summary failed"; rc=1; continue; }
  head -45 "$OUT/hotspots_$k.md"
done
tar -czf "$OUT/ncu_hotspots.tgz" -C "$OUT" ncu_hotspots && rm -rf "$W"
exit $rc
