#!/usr/bin/env bash
# crosscheck.sh -- our `distca` balancer against DistCA's own planner code, task for task.
#
#   bench/balancers/distca_crosscheck/crosscheck.sh DISTCA_CHECKOUT [CAD] [SEEDS]
#
# For each seed x ranks (4, 8, 32) x context (8K, 64K) x tolerance (0.1, 0.02, 0): a random batch of
# whole even-length documents filling each rank exactly (DistCA's planner asserts even lengths and
# builds its own items for documents split across ranks, so only this layout is common ground), planned
# by DistCA's Planner.plan_items and by `cad plan --balancer distca --min-shard 0` (no minimum shard, as
# DistCA); the two task lists must be identical. Needs python3 and a DistCA checkout; not a CI test.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
distca=${1:?usage: crosscheck.sh DISTCA_CHECKOUT [CAD] [SEEDS]}
cad=${2:-$here/../../../build/bin/cad}
seeds=${3:-12}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
same=0
differ=0
for seed in $(seq 1 "$seeds"); do
  for ranks in 4 8 32; do
    for context in 8192 65536; do
      for tol in 0.1 0.02 0; do
        python3 - "$seed" "$ranks" "$context" "$work" <<'PY'
import json, random, sys
seed, ranks, context, work = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = random.Random(seed * 1000 + ranks)
batches = []
for _ in range(ranks):
    docs, left, heavy = [], context, rng.random() < 0.3  # some ranks hold long documents
    while left > 0:
        length = min(left, 2 * rng.randint(1, (context if heavy else context // 8) // 2))
        docs.append(length)
        left -= length
    batches.append(docs)
json.dump(batches, open(work + "/batches.json", "w"))
json.dump([l for b in batches for l in b], open(work + "/lengths.json", "w"))
PY
        python3 "$here/run_distca_planner.py" "$distca/distca/planner/planner.py" "$work/batches.json" "$tol" \
          > "$work/theirs.txt"
        "$cad" plan --lengths "$work/lengths.json" --ranks "$ranks" --context "$context" --balancer distca \
          --tolerance "$tol" --min-shard 0 --json --tasks 2>/dev/null |
          python3 -c 'import json, sys
for r in sorted(json.load(sys.stdin)["balancers"][0]["task_list"], key=lambda r: (r[3], r[0], r[1])): print(*r)' \
          > "$work/ours.txt"
        if cmp -s "$work/theirs.txt" "$work/ours.txt"; then
          same=$((same + 1))
        else
          differ=$((differ + 1))
          echo "seed $seed, $ranks ranks, context $context, tolerance $tol: plans differ"
          diff "$work/theirs.txt" "$work/ours.txt" | head -6
        fi
      done
    done
  done
done
echo "$same identical plans, $differ different"
[ "$differ" -eq 0 ]
