#!/usr/bin/env bash
# host_staged_one_gpu.sh -- the host-bound link stand-in on ONE GPU: the all-to-all curve (1 MiB .. 1 GiB per
# rank) of CAD's host-staged path (bench_nccl_all_to_all over cad_mpi.so: device -> pinned host, OpenMPI's
# shared-memory all_to_all_v, host -> device) with 2 and then 4 processes sharing GPU 0
# (bench/nccl/slow_links.py --share-gpu --standins host_staged). Not run by CI.
#   1. build (CUDA, sm_90a) only bench_nccl_all_to_all and cad_mpi.so, -j16, into $BUILD (default build-gpu);
#   2. np 2 and np 4, each under its own time limit (a cut run keeps the sizes it finished: the bench flushes
#      each row);
#   3. $OUT gets four files: summary.md (both tables: latency at 1 MiB, bus bandwidth, the InfiniBand class of
#      the per-rank bandwidth), summary.json ({"np2": ..., "np4": ...}, slow_links.py's summaries), machine.txt
#      (GPU, commit, times) and host_staged.tar.gz (every csv, summary and log, under np2/ and np4/).
# Usage, from the repository root: OUT=/some/dir bash bench/nccl/host_staged_one_gpu.sh [--skip-build]
# Expected: about 1.5-2.5 minutes with the build on a 16-core host; exits 1 if the build, a run or a byte check
# failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/host_staged_out}"
BUILD="${BUILD:-build-gpu}"
mkdir -p "$OUT"
WORK="$(mktemp -d)"  # the runs' own files; only the four above land in $OUT (few files come back from a run)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
failed=0
{ nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader;
  git log -1 --format='commit %h %cI' 2>/dev/null; date -u +'start %Y-%m-%dT%H:%M:%SZ'; } | tee "$OUT/machine.txt"

if [ "${1:-}" != --skip-build ]; then
  start=$(date +%s)
  timeout 170 bash -c "cmake -S . -B '$BUILD' -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90a -DCAD_BUILD_TESTS=OFF && \
    cmake --build '$BUILD' -j 16 --target bench_nccl_all_to_all cad_plugin_mpi" > "$WORK/build.log" 2>&1
  rc=$?
  echo "build rc=$rc in $(( $(date +%s) - start )) s" | tee -a "$OUT/machine.txt"
  if [ "$rc" != 0 ]; then
    tail -40 "$WORK/build.log"
    tar -C "$WORK" -czf "$OUT/host_staged.tar.gz" build.log
    exit 1
  fi
fi

for n in 2 4; do
  start=$(date +%s)
  timeout 90 python3 bench/nccl/slow_links.py --gpus "$n" --share-gpu --standins host_staged \
    --cad-bench "$BUILD/bin/bench_nccl_all_to_all" --mpi-plugin "$BUILD/lib/cad/plugins/cad_mpi.so" \
    --out "$WORK/np$n" > "$WORK/np$n.log" 2>&1
  rc=$?
  echo "np $n: rc=$rc in $(( $(date +%s) - start )) s" | tee -a "$OUT/machine.txt"
  [ "$rc" = 0 ] || { failed=1; tail -20 "$WORK/np$n.log"; }
done

python3 - "$WORK" "$OUT" <<'EOF'
import json, os, sys
work, out = sys.argv[1], sys.argv[2]
merged, text = {}, []
for n in (2, 4):
    d = os.path.join(work, f"np{n}")
    if os.path.exists(os.path.join(d, "summary.json")):
        with open(os.path.join(d, "summary.json")) as f:
            merged[f"np{n}"] = json.load(f)
    if os.path.exists(os.path.join(d, "summary.md")):
        with open(os.path.join(d, "summary.md")) as f:
            text.append(f"{n} processes sharing GPU 0:\n\n" + f.read())
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(merged, f, indent=1)
with open(os.path.join(out, "summary.md"), "w") as f:
    f.write("\n".join(text))
EOF
echo "---- summary ----"
cat "$OUT/summary.md"
cp "$OUT/machine.txt" "$WORK/"
(cd "$WORK" && tar -czf "$OUT/host_staged.tar.gz" --ignore-failed-read ./*)
exit $failed
