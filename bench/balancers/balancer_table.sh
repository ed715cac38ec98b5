#!/usr/bin/env bash
# balancer_table.sh -- the imbalance/bytes tables of docs/balancers.md, from `cad plan` on one
# Pretrain-recipe batch (seed 1) per (servers, context).
#
#   bench/balancers/balancer_table.sh [CAD] [DIST] defaults   every balancer at its default config;
#                                                           cells are "max/mean after / GiB moved"
#   bench/balancers/balancer_table.sh [CAD] [DIST] matched    distca at tolerance 0.02 against
#                                                           prefix_aware at tolerance 0 (balance at least
#                                                           as good), with the bytes saved
set -euo pipefail
cad=${1:-build/bin/cad}
dist=${2:-$(cd "$(dirname "$0")/../.." && pwd)/../shared/data/doclen_pretrain.json}
mode=${3:-defaults}

# Prints "name before after GiB plan_ms" for each balancer row of a `cad plan` text report.
rows() {
  "$cad" plan --dist "$dist" --seed 1 --repeat 3 "$@" |
    awk '/^balancer/ {t = 1; next} t && NF == 7 {print $1, $2, $3, $4, $7} t && NF == 0 {t = 0}'
}

if [ "$mode" = defaults ]; then
  echo "| servers | context | before | colocated | per_doc_cp | distca | prefix_aware | prefix_aware plan ms |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
else
  echo "| servers | context | before | distca (tol 0.02) | prefix_aware (tol 0) | bytes saved |"
  echo "|---:|---:|---:|---:|---:|---:|"
fi
for ranks in 4 8 32 64; do
  for context in 65536 131072 262144 524288; do
    if [ "$mode" = defaults ]; then
      rows --context "$context" --ranks "$ranks" --balancer all |
        awk -v r="$ranks" -v c="$context" \
          '{before = $2; cell[$1] = sprintf("%.3f / %.2f", $3, $4); ms[$1] = $5}
           END {printf "| %d | %dK | %.3f | %s | %s | %s | %s | %.2f |\n", r, c / 1024, before, cell["colocated"],
                       cell["per_doc_cp"], cell["distca"], cell["prefix_aware"], ms["prefix_aware"]}'
    else
      { rows --context "$context" --ranks "$ranks" --balancer distca --tolerance 0.02
        rows --context "$context" --ranks "$ranks" --balancer prefix_aware --tolerance 0; } |
        awk -v r="$ranks" -v c="$context" \
          '{before = $2; after[$1] = $3; gib[$1] = $4}
           END {printf "| %d | %dK | %.3f | %.3f / %.2f | %.3f / %.2f | %.1f%% |\n", r, c / 1024, before,
                       after["distca"], gib["distca"], after["prefix_aware"], gib["prefix_aware"],
                       100 * (1 - gib["prefix_aware"] / gib["distca"])}'
    fi
  done
done
