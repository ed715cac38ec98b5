#!/bin/sh
# cli_test.sh CAD CONFIG_DIR FIXTURE_DIR BROKEN_DIR [SANITIZE] -- the `cad` command end to end: --help
# of every subcommand, usage errors, `cad plugins`, `cad check-config` on every configs/*.json, and
# `cad demo` on the test fixture plugin.
set -u
CAD=$1 CONFIG_DIR=$2 FIXTURE_DIR=$3 BROKEN_DIR=$4 SANITIZE=${5:-}
OUT=$(mktemp -d) || exit 1
trap 'rm -rf "$OUT"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect STATUS CMD... : run CMD, output in $OUT/out, check its exit status.
expect() {
  want=$1; shift
  "$@" >"$OUT/out" 2>&1
  got=$?
  if [ "$got" -ne "$want" ]; then fail "'$*' exited $got, expected $want:"; sed 's/^/    /' "$OUT/out"; return 1; fi
  return 0
}
# contains TEXT: the last command's output contains TEXT.
contains() { grep -qF -- "$1" "$OUT/out" || { fail "output lacks '$1':"; sed 's/^/    /' "$OUT/out"; }; }
lacks() { ! grep -qF -- "$1" "$OUT/out" || { fail "output has '$1':"; sed 's/^/    /' "$OUT/out"; }; }

expect 0 "$CAD" --help && contains "commands:"
commands=$(sed -n '/^commands:/,$p' "$OUT/out" | awk 'NR > 1 && NF > 0 { print $1 }')
[ -n "$commands" ] || fail "cad --help lists no commands"
for c in plugins check-config demo; do
  echo "$commands" | grep -qx "$c" || fail "cad --help does not list '$c'"
done
for c in $commands; do
  expect 0 "$CAD" "$c" --help && contains "usage: cad $c"
done
expect 2 "$CAD" && contains "usage: cad <command>"
expect 2 "$CAD" no-such-command && contains "cad: unknown command 'no-such-command'"
expect 2 "$CAD" plugins --no-such-option && contains "unknown option --no-such-option"
expect 2 "$CAD" demo --tokens many && contains "--tokens: expected an integer"
expect 2 "$CAD" check-config && contains "expected exactly one config FILE"
# --version: the project version (CMake's) and the plugin ABI version this host loads.
expect 0 "$CAD" --version && contains "cad 0." && contains "(plugin ABI 1."
expect 0 "$CAD" --help && contains "cad --version"

# plugins: the fixture is described; every broken plugin is listed with its reason.
expect 0 "$CAD" plugins --path "$FIXTURE_DIR:$BROKEN_DIR" && contains "test_attention"
contains "cad_table_major2.so: built for plugin ABI 2, this host supports ABI 1"
contains "cad_notelf.so: not a shared object (no ELF header)"
expect 0 "$CAD" plugins --json --path "$FIXTURE_DIR" && contains '"name": "test_attention"'
expect 0 "$CAD" plugins

# check-config on every shipped config, then on a broken stack.
for config in "$CONFIG_DIR"/*.json; do
  if [ -n "$SANITIZE" ] && grep -q '"plugin": *"mpi"' "$config"; then
    # OpenMPI keeps allocations until exit by design; `cad` loads libmpi only through the plugin, so
    # after the host unloads it LeakSanitizer sees them as "<unknown module>" and no suppression by
    # library name can match. Our own leaks are checked by every other run here and by test_adapter.
    expect 0 env ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" "$CAD" check-config "$config" && contains ": OK, "
  else
    expect 0 "$CAD" check-config "$config" && contains ": OK, "
  fi
done
# A typo in an optional key (host, communicator, CAD) is only warned about, so the warning names the key
# meant; --strict makes unknown keys an error for CI. The sanitizer build skips these (libmpi, as above).
if [ -z "$SANITIZE" ]; then
  sed -e 's/"log_level"/"loglevel"/' -e 's/"timeout_ms"/"timeout"/' -e 's/"keep_forward_tensors"/"keep_forward_tensor"/' \
    "$CONFIG_DIR/cad_cpu.json" >"$OUT/typos.json"
  expect 0 "$CAD" check-config "$OUT/typos.json" && contains ": OK, "
  contains "unknown key 'loglevel' ignored (did you mean 'log_level'?)"
  contains "unknown key 'timeout' ignored (did you mean 'timeout_ms'?)"
  contains "unknown key 'keep_forward_tensor' ignored (did you mean 'keep_forward_tensors'?)"
  expect 1 "$CAD" check-config --strict "$OUT/typos.json" && contains "--strict: $OUT/typos.json has 3 unknown key(s)"
  contains "FAILED (--strict: unknown keys)"
  expect 0 "$CAD" check-config --strict "$CONFIG_DIR/cad_cpu.json" && contains ": OK, "
  # --strict sees the warnings even where the log level would hide them.
  expect 1 env CAD_LOG_LEVEL=error "$CAD" check-config --strict "$OUT/typos.json" && contains "3 unknown key(s)"
fi
printf '{"colour": 1, "instances": [{"name": "r", "plugin": "reference", "config": {"num_thread": 1}}]}\n' >"$OUT/far.json"
expect 0 "$CAD" check-config "$OUT/far.json" && contains "unknown key 'colour' ignored"
lacks "'colour' ignored (did you mean"
contains "unknown key 'num_thread' ignored (did you mean 'num_threads'?)"
expect 1 "$CAD" check-config "$OUT/far.json" --strict && contains "2 unknown key(s)"

# An unknown balancer name lists the valid ones and the nearest, before any work.
echo '[1000, 2000, 3000]' >"$OUT/lengths.json"
expect 2 "$CAD" plan --lengths "$OUT/lengths.json" --ranks 2 --balancer prefix-aware &&
  contains "--balancer: unknown balancer 'prefix-aware' (did you mean 'prefix_aware'?); valid names: all, colocated, per_doc_cp, distca, prefix_aware"
expect 2 "$CAD" plan --lengths "$OUT/lengths.json" --ranks 2 --balancer reference && contains "'reference' is not a balancer plugin (its kind is attention)"
expect 2 "$CAD" simulate --gpus 8 --dist "$OUT/lengths.json" --context 4096 --balancers colocated,prefix-aware &&
  contains "--balancers: unknown balancer 'prefix-aware' (did you mean 'prefix_aware'?)"

printf '{"instances": [{"name": "x", "plugin": "%s/cad_create_fails.so"}]}\n' "$BROKEN_DIR" >"$OUT/broken.json"
expect 1 "$CAD" check-config "$OUT/broken.json" && contains "create failed: broken on purpose"
printf '{"instances": [{"name": "t", "plugin": "test_attention"}], "attention": "t"}\n' >"$OUT/fixture.json"
expect 0 "$CAD" check-config "$OUT/fixture.json" --path "$FIXTURE_DIR" && contains "attention: t"

# demo through the fixture (O = Q, so it runs anywhere).
expect 0 "$CAD" demo --config "$OUT/fixture.json" --path "$FIXTURE_DIR" --tokens 300 --heads 4 --kv-heads 2 --head-dim 16 &&
  contains "300 tokens" && contains "sum |x|"

if [ "$failures" -ne 0 ]; then echo "$failures check(s) failed"; exit 1; fi
echo "all cad CLI checks passed"
