#!/bin/sh
# hostile_input_test.sh CAD -- inputs that used to crash, hang or report garbage are refused
# with a message naming the file and the key or entry: `cad plan` on lengths, contexts and rank counts
# the int64 cost model cannot represent (they printed negative costs or allocated until bad_alloc), a
# 200K-deep --dist file and a 100K-deep stack config (stack overflow), a number literal beyond a double
# (reported as INTERNAL with no file or key). The hardening issue's CLI section: `cad simulate` sizes and
# rates it cannot represent, /dev/zero as a length file, a `cad plan --plot` file name run as a command.
set -u
CAD=$1
. "$(dirname "$0")/../expect.sh"
deep() { n=$1; awk -v n="$n" 'BEGIN { for (i = 0; i < n; i++) printf "["; for (i = 0; i < n; i++) printf "]"; }'; }

# cad plan: what the model cannot represent is refused before anything big is allocated.
echo '[1000000000000000]' >"$OUT/huge_doc.json"
expect 1 "$CAD" plan --dist "$OUT/huge_doc.json" --context 65536 --ranks 4 && contains "huge_doc.json: entry [0] is 1000000000000000"
echo '[100000, 2000]' >"$OUT/ok.json"
expect 1 "$CAD" plan --dist "$OUT/ok.json" --context 1099511627776 --ranks 4 && contains "does not fit the cost model's int64"
lacks "0.125"
printf 'length\n1000000000000\n' >"$OUT/trillion.csv"
expect 1 "$CAD" plan --lengths "$OUT/trillion.csv" --ranks 2 && contains "does not fit the cost model's int64"
expect 2 "$CAD" plan --dist "$OUT/ok.json" --context 65536 --ranks 100000 && contains "--ranks: expected an integer in [1, 8192]"
deep 200000 >"$OUT/deep.json"
expect 1 "$CAD" plan --dist "$OUT/deep.json" --context 65536 --ranks 4 && contains "deep.json: nested more than"
# The largest values that fit still plan: 2^40 context on one rank with 2^20-token documents.
echo '[1048576]' >"$OUT/mega.json"
expect 0 "$CAD" plan --lengths "$OUT/mega.json" --ranks 1 --balancer colocated && contains "colocated"

# cad simulate: what the model cannot represent is refused before any work, naming the option and the
# range (these ran for minutes with no output, died of SIGFPE, read /dev/zero until memory ran out, or
# printed "total_s": null).
sim="simulate --dist $OUT/ok.json --context 4096"  # $OUT (mktemp) has no spaces
expect 2 "$CAD" $sim --gpus 65536 && contains "65536 data-parallel ranks; at most 8192 plan together"
expect 2 "$CAD" $sim --gpus 2097152 && contains "--gpus: expected an integer in [1, 1048576]"
expect 2 "$CAD" $sim --gpus 64 --tp 4294967296 --pp 4294967296 && contains "--tp: expected an integer in [1, 1024]"
expect 2 "$CAD" $sim --gpus 64 --gpus-per-node 1024 --tp 1024 --pp 1024 && contains "--tp 1024 x --pp 1024 is more than --gpus 64"
expect 2 "$CAD" $sim --gpus 8 --steps 1048576 && contains "--steps: expected an integer in [1, 10000]"
expect 2 "$CAD" $sim --gpus 8 --microbatches 1048576 && contains "--microbatches: expected an integer in [1, 4096]"
expect 2 "$CAD" $sim --gpus 8192 --microbatches 256 && contains "at most 128 micro-batches here"
expect 2 "$CAD" $sim --gpus 8 --gemm-tflops 1e-320 && contains "--gemm-tflops: expected a number in [0.001, 1e6], got '1e-320'"
expect 2 "$CAD" $sim --gpus 8 --net-gbps inf && contains "--net-gbps: expected a number in [0.001, 1e6]"
expect 2 "$CAD" $sim --gpus 8 --attention-tflops 650,nan && contains "--attention-tflops: expected a number in [0.001, 1e6]"
expect 1 "$CAD" simulate --gpus 8 --dist /dev/zero --context 4096 && contains "/dev/zero: not a regular file"
expect 1 "$CAD" plan --dist /dev/zero --context 4096 --ranks 2 && contains "/dev/zero: not a regular file"
# A legitimately long run (many steps) says what it is doing on stderr; --quiet keeps it silent.
awk 'BEGIN { printf "["; for (i = 0; i < 20000; i++) printf "%s%d", i ? ", " : "", (i * 7919) % 60000 + 100; print "]" }' \
  >"$OUT/many.json"
"$CAD" simulate --gpus 64 --dist "$OUT/many.json" --context 65536 --steps 10000 --balancers colocated,prefix_aware \
  --json >"$OUT/sim.json" 2>"$OUT/out" &
sim_pid=$!
sleep 3
kill "$sim_pid" 2>/dev/null
wait "$sim_pid" 2>/dev/null
contains "s] step "
contains " s left)"  # and the time the rest is expected to take

# Every file argument gets the regular-file and size check of --dist (bounded_file.h): a FIFO blocked
# open() forever, /dev/zero was read without bound (4.2 GB in 10 s), and a file past its cap is refused.
mkfifo "$OUT/fifo"
truncate -s 17M "$OUT/big.json"
for bad in "$OUT/fifo" /dev/zero; do
  expect 1 "$CAD" $sim --gpus 8 --trainer "$bad" && contains "$bad: not a regular file"
  expect 1 "$CAD" $sim --gpus 8 --rates "$bad" && contains "$bad: not a regular file"
  expect 1 "$CAD" $sim --gpus 8 --system "$bad" && contains "$bad: not a regular file"
  expect 1 "$CAD" $sim --gpus 8 --dist "$bad" && contains "$bad: not a regular file"
  expect 1 "$CAD" plan --lengths "$bad" --ranks 2 && contains "$bad: not a regular file"
  expect 1 "$CAD" plan --lengths "$OUT/ok.json" --ranks 2 --rate-table "$bad" && contains "$bad: not a regular file"
  expect 1 "$CAD" check-config "$bad" && contains "$bad: not a regular file"
done
expect 1 "$CAD" $sim --gpus 8 --trainer "$OUT/big.json" && contains "larger than 16 MiB"
expect 1 "$CAD" check-config "$OUT/big.json" && contains "larger than 16 MiB"
expect 1 "$CAD" plan --lengths "$OUT/ok.json" --ranks 2 --rate-table "$OUT/big.json" && contains "larger than 16 MiB"

# cad plan refuses the windows CAD refuses (a non-causal window is UNSUPPORTED there), rather than planning them.
expect 1 "$CAD" plan --lengths "$OUT/ok.json" --ranks 2 --window 4 --noncausal && contains "UNSUPPORTED"
contains "causal attention only"
expect 0 "$CAD" plan --lengths "$OUT/ok.json" --ranks 2 --window 4 && contains "window 4"
# A window at the int64 limit plans as no window (the cost model clamps, never wraps): the same costs per server.
expect 0 "$CAD" plan --lengths "$OUT/ok.json" --ranks 2 --balancer prefix_aware --window 9223372036854775807 &&
  sed -n '/^server/,$p' "$OUT/out" >"$OUT/costs_at_limit"
expect 0 "$CAD" plan --lengths "$OUT/ok.json" --ranks 2 --balancer prefix_aware &&
  sed -n '/^server/,$p' "$OUT/out" >"$OUT/costs_plain"
[ -s "$OUT/costs_plain" ] && cmp -s "$OUT/costs_plain" "$OUT/costs_at_limit" ||
  fail "--window 2^63-1 changed the per-server costs: $(cat "$OUT/costs_at_limit")"

# cad plan --plot: the file name reaches matplotlib as a path, never a shell or a plotting script (gnuplot
# ran '|touch pwned' as a command). Without python3 or matplotlib it fails with a message saying so.
if python3 -c "import matplotlib" 2>/dev/null; then
  cd "$OUT" || exit 1
  expect 0 "$CAD" plan --lengths ok.json --ranks 2 --balancer colocated --plot "|touch pwned" &&
    contains "plot written to |touch pwned"
  cd - >/dev/null || exit 1
  [ ! -e "$OUT/pwned" ] || fail "--plot ran a command from its file name"
  [ -s "$OUT/|touch pwned" ] || fail "--plot did not write the file '|touch pwned'"
  expect 0 "$CAD" plan --lengths "$OUT/ok.json" --ranks 2 --plot "$OUT/it's \"quoted\".svg" --json &&
    contains "plot written to $OUT/it's \"quoted\".svg"
  grep -q "<svg" "$OUT/it's \"quoted\".svg" || fail "--plot OUT.svg did not write an SVG"
  expect 1 "$CAD" plan --lengths "$OUT/ok.json" --ranks 2 --plot "$OUT/no/such/dir/x.png" && contains "cannot write"
fi
if command -v python3 >/dev/null; then
  # python3 without site-packages: as if matplotlib were not installed.
  mkdir -p "$OUT/bare" && printf '#!/bin/sh\nexec %s -S "$@"\n' "$(command -v python3)" >"$OUT/bare/python3"
  chmod +x "$OUT/bare/python3"
  expect 1 env PATH="$OUT/bare:/usr/bin:/bin" "$CAD" plan --lengths "$OUT/ok.json" --ranks 2 --plot "$OUT/x.png" &&
    contains "--plot needs matplotlib for python3"
fi
expect 1 env PATH="$OUT/empty" "$CAD" plan --lengths "$OUT/ok.json" --ranks 2 --plot "$OUT/x.png" &&
  contains "--plot needs python3 with matplotlib"

# Configs: nesting limited with the key path named, number literals beyond a double named by key.
{ printf '{"instances": [{"name": "r", "plugin": "reference", "config": {"x": '; deep 100000; printf '}}]}\n'; } >"$OUT/deep_config.json"
expect 1 "$CAD" check-config "$OUT/deep_config.json" && contains "deep_config.json: nested more than 64 levels deep (at instances[0].config.x[0]"
printf '{"instances": [{"name": "r", "plugin": "reference", "config": {"threads": 1e400}}]}\n' >"$OUT/huge_number.json"
expect 1 "$CAD" check-config "$OUT/huge_number.json" && contains "huge_number.json: not valid JSON"
contains "(at instances[0].config.threads)"
contains "[INVALID_CONFIG]"

finish hostile-input
