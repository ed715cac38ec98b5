#!/bin/sh
# run_fuzzers.sh BUILD_DIR [SECONDS] -- runs every fuzz target of BUILD_DIR (configured with CAD_FUZZ=ON)
# for SECONDS each (default 35), starting from the committed seeds in tests/fuzz/corpus/<target>/. New
# inputs go to a temporary directory (the committed corpus is not modified; add interesting ones by
# hand). A crash, sanitizer report or broken invariant fails the run and prints the reproducer's path:
#   BUILD_DIR/bin/<target> <reproducer>     runs it again
set -u
BIN=$1/bin
SECONDS_EACH=${2:-35}
SRC=$(cd "$(dirname "$0")" && pwd)
WORK=${CAD_FUZZ_WORK:-$(mktemp -d)}
failures=0
for target in fuzz_segments fuzz_plan fuzz_handles fuzz_config fuzz_doc_lengths; do
  mkdir -p "$WORK/$target"
  log="$WORK/$target.log"
  # The outer timeout only guards against a fuzzer that ignores -max_total_time (a hang in a target
  # is reported by -timeout as a crash).
  timeout -s KILL $((SECONDS_EACH + 60)) "$BIN/$target" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$WORK/$target-" "$WORK/$target" "$SRC/corpus/$target" >"$log" 2>&1
  status=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  cov=$(grep -E '^#[0-9]+' "$log" | tail -1 | grep -o 'cov: [0-9]*')
  if [ "$status" -eq 0 ]; then
    echo "$target: OK, ${runs:-?} inputs in ${SECONDS_EACH} s, ${cov:-cov: ?}"
  else
    failures=$((failures + 1))
    echo "FAIL: $target exited $status; the end of its log ($log):"
    tail -n 40 "$log" | sed 's/^/    /'
    ls "$WORK"/"$target"-* 2>/dev/null | sed 's/^/    reproducer: /'
  fi
done
[ "$failures" -eq 0 ]
