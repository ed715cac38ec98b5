#!/bin/sh
# install_test.sh CMAKE BUILD_DIR CONSUMER_SRC WORK_DIR CXX SANITIZE FALLBACK_PLUGIN
# Installs the build into WORK_DIR/prefix, builds the consumer project with find_package(cad) against
# it, and runs it: it loads an installed plugin by name (so the installed libcad_host finds its
# plugin directory), or FALLBACK_PLUGIN by path if no plugin was installed.
set -eu
CMAKE=$1 BUILD_DIR=$2 CONSUMER_SRC=$3 WORK=$4 CXX=$5 SANITIZE=$6 FALLBACK=$7
rm -rf "$WORK"
mkdir -p "$WORK"
PREFIX=$WORK/prefix
"$CMAKE" --install "$BUILD_DIR" --prefix "$PREFIX" >"$WORK/install.log"

for f in include/cad/cad_host.h include/cad/cad_host.hpp include/cad/cad_plugin_v1.h bin/cad; do
  [ -e "$PREFIX/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done
ls "$PREFIX"/lib*/libcad_host.so "$PREFIX"/lib*/cmake/cad/cad-config.cmake "$PREFIX"/lib*/cmake/cad/cad-config-version.cmake >/dev/null

FLAGS=""
if [ -n "$SANITIZE" ]; then FLAGS="-fsanitize=$SANITIZE"; fi
"$CMAKE" -S "$CONSUMER_SRC" -B "$WORK/consumer" -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_CXX_COMPILER="$CXX" \
  -DCMAKE_CXX_FLAGS="$FLAGS" -DCMAKE_EXE_LINKER_FLAGS="$FLAGS" >"$WORK/configure.log" 2>&1 ||
  { cat "$WORK/configure.log"; exit 1; }
"$CMAKE" --build "$WORK/consumer" >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; exit 1; }

# The first installed plugin, by name (cad_<name>.so), else the fallback by path.
plugin=$(ls "$PREFIX"/lib*/cad/plugins/cad_*.so 2>/dev/null | head -n 1 || true)
if [ -n "$plugin" ]; then
  name=$(basename "$plugin" .so)
  name=${name#cad_}
else
  name=$FALLBACK
fi
# Nothing from the build tree may help: no plugin path from the environment, and a plugin loaded by
# name must come from the prefix (found next to the installed libcad_host.so).
env -u CAD_PLUGIN_PATH "$WORK/consumer/cad_consumer" "$name" | tee "$WORK/consumer.out"
if [ -n "$plugin" ]; then
  grep -q "from $(cd "$PREFIX" && pwd -P)/" "$WORK/consumer.out" || { echo "FAIL: $name not loaded from the prefix"; exit 1; }
fi
# The installed `cad` runs from the prefix too.
env -u CAD_PLUGIN_PATH "$PREFIX/bin/cad" plugins >/dev/null
rm -rf "$WORK"
echo "install + find_package(cad) OK"
