#!/bin/sh
# expect.sh STATUS PATTERN... -- COMMAND... : runs COMMAND, prints its output, and fails unless it exited
# with STATUS and its output (stdout and stderr) matches every extended-regex PATTERN. (ctest's
# PASS_REGULAR_EXPRESSION alone would ignore the exit status.)
set -u
want=$1; shift
patterns=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  patterns="$patterns$1
"
  shift
done
[ $# -gt 1 ] || { echo "expect.sh: no command after --"; exit 2; }
shift
out=$(mktemp) || exit 2
trap 'rm -f "$out"' EXIT
"$@" >"$out" 2>&1
got=$?
cat "$out"
failed=0
if [ "$got" -ne "$want" ]; then
  echo "FAIL: exited $got, expected $want: $*"
  failed=1
fi
printf '%s' "$patterns" | while IFS= read -r pattern; do
  grep -Eq -- "$pattern" "$out" || { echo "FAIL: output lacks /$pattern/"; exit 1; }
done || failed=1
exit $failed
