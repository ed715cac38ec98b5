#!/usr/bin/env bash
# balancer_table.sh -- the tables of docs/balancers.md, from `cad plan` on one Pretrain-recipe batch
# (seed 1) per (servers, context). Imbalance is max/mean per server of FLOPs and of predicted
# attention time (forward + backward, from the rate table).
#
#   bench/balancers/balancer_table.sh [CAD] [DIST] [MODE] [RATES]
#     MODE defaults   every balancer at its default config, and prefix_aware balancing predicted time;
#                     cells are "FLOPs max/mean / time max/mean / GiB moved"
#     MODE matched    distca at tolerance 0.02 against prefix_aware at tolerance 0 and at the tolerance
#                     that matches distca's max/mean, with the bytes saved
#     MODE plantime   plan time at 512 servers x 128K (best of 5, one core), every balancer
#     MODE memcap     32 servers x 128K under memory caps from prefix_aware's uncapped peak down to
#                     below colocated's: "FLOPs max/mean / GiB moved" or the refusal
#     MODE window     sliding windows (--window 4096, 8192) and the global (causal) layer beside them, 4-512
#                     servers x 64K/128K: "FLOPs max/mean / GiB moved" per balancer (no rate table: the
#                     rates are measured for unwindowed kernels)
#   RATES defaults to configs/calibration/h200.json.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cad=${1:-build/bin/cad}
dist=${2:-$root/../shared/data/doclen_pretrain.json}
mode=${3:-defaults}
rates=${4:-$root/configs/calibration/h200.json}

# Prints "name flops_before flops_after time_before time_after GiB plan_ms" per balancer row of a
# `cad plan --rate-table` text report.
rows() {
  "$cad" plan --dist "$dist" --seed 1 --rate-table "$rates" "$@" |
    awk '/^balancer/ {t = 1; next} t && NF == 9 {print $1, $2, $3, $4, $5, $6, $9} t && NF == 0 {t = 0}'
}

case "$mode" in
defaults)
  echo "| servers | context | before (FLOPs / time) | colocated | per_doc_cp | distca | prefix_aware | prefix_aware, time-balanced | prefix_aware plan ms (FLOPs / time) |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for ranks in 4 8 32 64; do
    for context in 65536 131072 262144 524288; do
      { rows --context "$context" --ranks "$ranks" --balancer all --repeat 3
        rows --context "$context" --ranks "$ranks" --balancer prefix_aware --balance-time --repeat 3 |
          sed 's/^prefix_aware/prefix_aware_time/'; } |
        awk -v r="$ranks" -v c="$context" \
          '{before = sprintf("%.3f / %.3f", $2, $4); cell[$1] = sprintf("%.3f / %.3f / %.2f", $3, $5, $6); ms[$1] = $7}
           END {printf "| %d | %dK | %s | %s | %s | %s | %s | %s | %.2f / %.2f |\n", r, c / 1024, before,
                       cell["colocated"], cell["per_doc_cp"], cell["distca"], cell["prefix_aware"],
                       cell["prefix_aware_time"], ms["prefix_aware"], ms["prefix_aware_time"]}'
    done
  done
  ;;
matched)
  echo "| servers | context | before | distca (tol 0.02) | prefix_aware (tol 0) | bytes saved | prefix_aware at distca's balance | bytes saved |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
  for ranks in 4 8 32 64; do
    for context in 65536 131072 262144 524288; do
      d=$(rows --context "$context" --ranks "$ranks" --balancer distca --tolerance 0.02)
      tol=$(echo "$d" | awk '{printf "%.6f", ($3 > 1 ? $3 - 1 : 0)}')
      { echo "$d"
        rows --context "$context" --ranks "$ranks" --balancer prefix_aware --tolerance 0
        rows --context "$context" --ranks "$ranks" --balancer prefix_aware --tolerance "$tol" |
          sed 's/^prefix_aware/prefix_aware_matched/'; } |
        awk -v r="$ranks" -v c="$context" \
          '{before = $2; after[$1] = $3; gib[$1] = $6}
           END {printf "| %d | %dK | %.3f | %.3f / %.2f | %.3f / %.2f | %.1f%% | %.3f / %.2f | %.1f%% |\n", r, c / 1024,
                       before, after["distca"], gib["distca"], after["prefix_aware"], gib["prefix_aware"],
                       100 * (1 - gib["prefix_aware"] / gib["distca"]), after["prefix_aware_matched"],
                       gib["prefix_aware_matched"], 100 * (1 - gib["prefix_aware_matched"] / gib["distca"])}'
    done
  done
  ;;
plantime)
  echo "| balancer | FLOPs max/mean | time max/mean | GiB moved | plan ms (best of 5) |"
  echo "|---|---:|---:|---:|---:|"
  { taskset -c 0 "$cad" plan --dist "$dist" --seed 1 --rate-table "$rates" --context 131072 --ranks 512 \
      --balancer all --repeat 5 | awk '/^balancer/ {t = 1; next} t && NF == 9 {print $1, $3, $5, $6, $9}'
    taskset -c 0 "$cad" plan --dist "$dist" --seed 1 --rate-table "$rates" --context 131072 --ranks 512 \
      --balancer prefix_aware --balance-time --repeat 5 |
      awk '/^balancer/ {t = 1; next} t && NF == 9 {print "prefix_aware,_time-balanced", $3, $5, $6, $9}'; } |
    awk '{gsub("_", " ", $1); printf "| %s | %.3f | %.3f | %.2f | %.1f |\n", $1, $2, $3, $4, $5}'
  ;;
memcap)
  peak=$("$cad" plan --dist "$dist" --seed 1 --context 131072 --ranks 32 --balancer prefix_aware --json |
           python3 -c 'import json, sys; print(max(json.load(sys.stdin)["balancers"][0]["memory_received"]))')
  floor=$("$cad" plan --dist "$dist" --seed 1 --context 131072 --ranks 32 --balancer colocated --json |
            python3 -c 'import json, sys; print(max(json.load(sys.stdin)["balancers"][0]["memory_received"]))')
  echo "prefix_aware's uncapped peak: $peak bytes; colocated's: $floor bytes"
  echo
  echo "| cap (x uncapped peak) | cap GiB | distca | prefix_aware | prefix_aware plan ms |"
  echo "|---:|---:|---:|---:|---:|"
  for f in 1.00 0.90 0.80 0.75 0.70 0.65 0.60 0.55 0.50 0.45 0.40 0.35 0.31 0.25; do
    cap=$(python3 -c "print(int($f * $peak))")
    "$cad" plan --dist "$dist" --seed 1 --context 131072 --ranks 32 --memory-cap "$cap" --json \
      --balancer distca 2>/dev/null > /tmp/cad_memcap_d.json || true
    "$cad" plan --dist "$dist" --seed 1 --context 131072 --ranks 32 --memory-cap "$cap" --json \
      --balancer prefix_aware 2>/dev/null > /tmp/cad_memcap_p.json || true
    python3 - "$f" "$cap" <<'EOF'
import json, sys
f, cap = sys.argv[1], int(sys.argv[2])
def cell(path):
    b = json.load(open(path))["balancers"][0]
    if b["status"] != "OK":
        return "refused", "-"
    return "%.3f / %.2f" % (b["imbalance"], b["bytes_total"] / 2**30), "%.1f" % b["plan_ms"]
d, _ = cell("/tmp/cad_memcap_d.json")
p, ms = cell("/tmp/cad_memcap_p.json")
print("| %s | %.3f | %s | %s | %s |" % (f, cap / 2**30, d, p, ms))
EOF
  done
  ;;
window)
  echo "| servers | context | window | colocated | per_doc_cp | distca | prefix_aware |"
  echo "|---:|---:|---:|---:|---:|---:|---:|"
  for ranks in 4 8 32 64 128 512; do
    for context in 65536 131072; do
      for window in -1 4096 8192; do
        "$cad" plan --dist "$dist" --seed 1 --context "$context" --ranks "$ranks" --window "$window" --balancer all |
          awk -v r="$ranks" -v c="$context" -v w="$window" \
            '/^balancer/ {t = 1; next} t && NF == 7 {cell[$1] = sprintf("%.3f / %.2f", $3, $4)} t && NF == 0 {t = 0}
             END {printf "| %d | %dK | %s | %s | %s | %s | %s |\n", r, c / 1024, (w < 0 ? "global" : w),
                         cell["colocated"], cell["per_doc_cp"], cell["distca"], cell["prefix_aware"]}'
      done
    done
  done
  ;;
*)
  echo "unknown mode '$mode' (defaults, matched, plantime, memcap)" >&2
  exit 2
  ;;
esac
