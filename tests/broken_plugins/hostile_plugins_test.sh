#!/bin/sh
# hostile_plugins_test.sh CAD HOSTILE_DIR LENGTHS -- hostile plugins are reported, the `cad` command stays
# up. Each fixture in HOSTILE_DIR misbehaves in one way (see hostile/*.c*).
set -u
CAD=$1 DIR=$2 LENGTHS=$3
. "$(dirname "$0")/../expect.sh"
export CAD_PLUGIN_PROBE_TIMEOUT_MS=1500

# cad plugins: every file listed, the hostile ones as broken with the cause; the listing itself succeeds.
expect 0 "$CAD" plugins --path "$DIR"
contains "cad_init_crash.so: crashed while loading (signal SIG"
contains "cad_init_exit0.so: ended the process while loading (exit status 0)"
contains "cad_init_hang.so: hung while loading (killed after 1500 ms"
contains "cad_entry_throws.so: the entry function let an exception escape through the C ABI: entry threw on purpose"
contains "misbehaving"
expect 0 "$CAD" plugins --json --path "$DIR"
contains '"ok": false'

# cad conformance: a plugin that breaks loading is reported broken (not a crash, not a silent success).
for p in init_crash init_exit0 init_hang entry_throws; do
  expect 1 "$CAD" conformance "$DIR/cad_$p.so" && contains "conformance: the plugin cannot be loaded"
done
expect 0 "$CAD" plugins --json --path "$DIR" && contains "latin1_"
# ... one that throws a non-std exception from create is named, the kit does not abort.
expect 1 "$CAD" conformance "$DIR/cad_create_throws_int.so" && contains "cad_create_throws_int.so: a non-standard C++ exception escaped"
# ... the kit does not destroy what a failed create left in *out_ctx (it used to crash on it).
expect 1 "$CAD" conformance "$DIR/cad_ctx_on_failed_create.so" && contains "*out_ctx was modified on failure"
# ... a plugin that needs a device this machine lacks: not testable here, distinct status 4.
expect 4 "$CAD" conformance "$DIR/cad_device_error.so" && contains "cannot be tested here: no usable device"

# ... one whose create calls _exit(0) (no atexit handler runs): the kit runs in a child process, and a child
# that ends without a verdict is a failure (status 3), never a silent success.
expect 3 "$CAD" conformance "$DIR/cad_create_exit0.so" && contains "cad conformance: the command ended without a verdict"
# ... one that calls the host services with a NULL host_ctx: the kit's services refuse it (they crashed).
expect 1 "$CAD" conformance "$DIR/cad_null_host_ctx.so" && contains "conformance: " && lacks "SIGSEGV"

# The host: create throwing, destroy throwing, exit(0) while loading -- errors naming file and instance.
printf '{"instances": [{"name": "x", "plugin": "%s/cad_create_throws_int.so"}]}\n' "$DIR" >"$OUT/c1.json"
expect 1 "$CAD" check-config "$OUT/c1.json" && contains "instances[0] ('x'): plugin $DIR/cad_create_throws_int.so: create let an exception escape"
printf '{"instances": [{"name": "y", "plugin": "%s/cad_destroy_throws.so"}]}\n' "$DIR" >"$OUT/c2.json"
expect 0 "$CAD" check-config "$OUT/c2.json" && contains "cad_destroy_throws.so: destroy of instance 'y' let an exception escape"
printf '{"instances": [{"name": "z", "plugin": "%s/cad_init_exit0.so"}]}\n' "$DIR" >"$OUT/c3.json"
expect 3 "$CAD" check-config "$OUT/c3.json" && contains "a plugin called exit() while loading"
printf '{"instances": [{"name": "e", "plugin": "%s/cad_create_exit0.so"}]}\n' "$DIR" >"$OUT/c4.json"
expect 3 "$CAD" check-config "$OUT/c4.json" && contains "cad check-config: the command ended without a verdict"
printf '{"instances": [{"name": "n", "plugin": "%s/cad_null_host_ctx.so"}]}\n' "$DIR" >"$OUT/c5.json"
expect 0 "$CAD" check-config "$OUT/c5.json" && contains "OK, 1 instance(s)"

# cad plan: a balancer's OK without a plan, and a NULL last_error, are errors naming the plugin.
expect 1 "$CAD" plan --lengths "$LENGTHS" --ranks 2 --balancer "$DIR/cad_balancer_null_plan.so" && contains "plan returned OK but no plan"
expect 1 "$CAD" plan --lengths "$LENGTHS" --ranks 2 --balancer "$DIR/cad_balancer_null_last_error.so" && contains "last_error returned NULL"

finish hostile-plugin
