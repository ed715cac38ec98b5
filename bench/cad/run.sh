#!/usr/bin/env bash
# run.sh -- CAD's benchmarks on one GPU (not a test): the server batches of every balancer measured rank by
# rank (cad_server_bench) and the ping-pong overlap (ping_pong_bench). Tables go to $OUT/cad_bench.md and
# $OUT/cad_bench.json. Usage: bash bench/cad/run.sh [BUILD_DIR]   (built by tests/gpu_cad/run.sh, or here)
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD="${1:-build-gpu}"
OUT="${OUT:-$PWD/cad_bench_out}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
DIST="${DIST:-../shared/data/doclen_pretrain.json}"
[ -f "$DIST" ] || DIST=shared/data/doclen_pretrain.json
cmake --build "$BUILD" -j "$(nproc)" --target cad_server_bench ping_pong_bench > "$OUT/bench_build.log" 2>&1 ||
  { tail -30 "$OUT/bench_build.log"; exit 1; }
{
  echo "## CAD server batches ($(date -u +%F), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown))"
  echo '```'
  echo "$BUILD/bin/cad_server_bench --dist $DIST --ranks 4,8 --context 65536,131072 --reps 3 --json cad_bench.json --rate-table configs/calibration/h200.json"
  echo '```'
  timeout 420 "$BUILD/bin/cad_server_bench" --dist "$DIST" --ranks 4,8 --context 65536,131072 --reps 3 --rate-table configs/calibration/h200.json \
    --json "$OUT/cad_bench.json"
  echo "exit $?"
  echo
  echo "## Ping-pong"
  echo '```'
  echo "mpirun -np 1 $BUILD/bin/ping_pong_bench --dist $DIST --tokens 32768 --layers 4 --linear-us 800"
  timeout 120 mpirun --allow-run-as-root -np 1 -x NCCL_NVLS_ENABLE "$BUILD/bin/ping_pong_bench" --dist "$DIST" \
    --tokens 32768 --layers 4 --linear-us 800
  echo "exit $?"
  echo '```'
} 2>&1 | tee "$OUT/cad_bench.md"
