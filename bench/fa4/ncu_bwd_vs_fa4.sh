#!/usr/bin/env bash
# ncu_bwd_vs_fa4.sh -- on the GPU machine, after bench/fa4's runs 0-2 (FA4 installed in .whl/site, build-gpu built),
# from the repository root: Nsight Compute on the backward of one dense causal document of 16K tokens (Hq 32,
# Hkv 8, D 128, bf16) for the project's kernel (cad_kernel_bench, case dense_causal_16k) and for FA4's
# (flash_attn.cute through cad.fa4.varlen_attn, bench/fa4/fa4_bwd_once.py), the same sections and metrics for
# both, one profiled launch each: $OUT/ncu_ours_bwd.txt, $OUT/ncu_fa4_bwd.txt, and $OUT/ncu_bwd_side_by_side.md
# (the lines of both that name the same metric). Exits non-zero when the build, either profile or the table failed.
#   usage: [OUT=dir] bash bench/fa4/ncu_bwd_vs_fa4.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
B=build-gpu
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$PWD/build-srvdir/cute_cache"
export CAD_HOST_LIBRARY="$PWD/$B/lib/libcad_host.so" CAD_PLUGIN_PATH="$PWD/$B/lib/cad/plugins" CAD_LOG_LEVEL=warn
source bench/fa4/unpack.sh env
export PYTHONPATH="$PWD/host_adapter/python:$PYTHONPATH"
SEC=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats
     --section WarpStateStats --section InstructionStats --section LaunchStats --section Occupancy)
MET=(--metrics "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,\
l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,lts__t_sectors_op_red.sum,lts__t_sectors_op_read.sum,\
lts__t_sectors_op_write.sum,smsp__cycles_active.avg")
rc=0
cmake --build "$B" -j16 --target cad_kernel_bench > "$OUT/build.log" 2>&1 || { echo "build of cad_kernel_bench failed"; rc=1; }
timeout 150 ncu --clock-control none -k regex:attention_bwd_sm90 -s 2 -c 1 "${SEC[@]}" "${MET[@]}" \
  "$B/bin/cad_kernel_bench" bench/kernels/pretrain_batches.txt dense_causal_16k > "$OUT/ncu_ours_bwd.txt" 2>&1
r=$?; echo "ours: rc=$r"; [ "$r" = 0 ] || rc=1
# FA4's backward kernel is the one whose name holds "Backward" and "Sm90" (its pre/postprocess kernels are apart).
timeout 240 ncu --clock-control none -k regex:'Backward.*Sm90|Sm90.*Backward|bwd_sm90' -s 1 -c 1 "${SEC[@]}" "${MET[@]}" \
  python3 bench/fa4/fa4_bwd_once.py > "$OUT/ncu_fa4_bwd.txt" 2>&1
r=$?; echo "fa4: rc=$r"; [ "$r" = 0 ] || rc=1
grep -q "Section: GPU Speed Of Light" "$OUT/ncu_fa4_bwd.txt" || { echo "fa4: no kernel profiled"; grep -i "kernel\|error" "$OUT/ncu_fa4_bwd.txt" | head; rc=1; }
python3 - "$OUT" <<'PY'
import re, sys, pathlib
out = pathlib.Path(sys.argv[1])
def metrics(path):
    rows = {}
    for line in path.read_text(errors="replace").splitlines():
        m = re.match(r"\s{4}(\S.*?)\s{2,}(\S+)?\s+([\d.,]+)\s*$", line)
        if m:
            rows.setdefault(m.group(1).strip(), (m.group(2) or "", m.group(3)))
    return rows
a, b = metrics(out / "ncu_ours_bwd.txt"), metrics(out / "ncu_fa4_bwd.txt")
lines = ["| metric | unit | ours | FA4 |", "|---|---|---:|---:|"]
for k, (unit, v) in a.items():
    if k in b:
        lines.append(f"| {k} | {unit} | {v} | {b[k][1]} |")
(out / "ncu_bwd_side_by_side.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
[ $? = 0 ] || { echo "side-by-side table failed"; rc=1; }
exit $rc
