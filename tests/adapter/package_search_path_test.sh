#!/bin/sh
# package_search_path_test.sh CMAKE SOURCE_DIR -- the Python package's libcad_host has no compiled-in plugin
# directory. pip builds it in a temporary directory under /tmp (the build tree, and a staging install
# prefix): compiling either in as a default search directory left deleted, world-writable /tmp paths on
# the installed package's plugin search path, where anyone could plant a cad_*.so. Configures the source
# tree as pip does (CAD_PYTHON_PACKAGE=ON, a prefix under the scratch directory) and reads the flags
# libcad_host is compiled with; the search path then is: the caller's, $CAD_PLUGIN_PATH, and the
# package's own lib/cad/plugins next to libcad_host.so (found at run time).
set -eu
CMAKE=$1 SRC=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$CMAKE" -S "$SRC" -B "$work/build" -G Ninja -DCAD_PYTHON_PACKAGE=ON -DCAD_ENABLE_CUDA=OFF -DCAD_ENABLE_MPI=OFF \
  -DCMAKE_INSTALL_PREFIX="$work/wheel/platlib/cad" -DCMAKE_INSTALL_LIBDIR=lib >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; echo "FAIL: configure"; exit 1; }
# The compile line of the library's search-path code.
flags=$(grep -A3 "build host_adapter/CMakeFiles/cad_host.dir/src/search_path.cpp.o" "$work/build/build.ninja" | grep "DEFINES" || true)
[ -n "$flags" ] || { echo "FAIL: no compile line for search_path.cpp in build.ninja"; exit 1; }
if echo "$flags" | grep -q "PLUGIN_DIR\|$work"; then
  echo "FAIL: the package's libcad_host compiles in a plugin directory of the temporary build:"
  echo "$flags" | tr ' ' '\n' | grep "PLUGIN_DIR\|$work"
  exit 1
fi
echo "PASS: the package's libcad_host has no compiled-in plugin directory"
