# expect.sh -- sourced by the shell tests: run a command, check its exit status and output.
#   expect STATUS CMD...   runs CMD (at most 60 s), output in $OUT/out; fails unless it exits STATUS
#   contains TEXT / lacks TEXT   the last output has / has not TEXT
#   finish NAME            prints the verdict and exits 0 only if nothing failed
OUT=$(mktemp -d) || exit 1
trap 'rm -rf "$OUT"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
show() { head -c 3000 "$OUT/out" | sed 's/^/    /'; }
expect() {
  want=$1; shift
  timeout 60 "$@" >"$OUT/out" 2>&1
  got=$?
  if [ "$got" -ne "$want" ]; then fail "'$*' exited $got, expected $want:"; show; return 1; fi
  return 0
}
contains() { grep -qF -- "$1" "$OUT/out" || { fail "output lacks '$1':"; show; }; }
lacks() { ! grep -qF -- "$1" "$OUT/out" || { fail "output has '$1':"; show; }; }
finish() {
  [ "$failures" -eq 0 ] && echo "all $1 checks passed"
  [ "$failures" -eq 0 ]
  exit $?
}
