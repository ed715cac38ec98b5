#!/bin/sh
# detection_test.sh CMAKE SUITES_DIR PYTHON -- the Python suites follow what is importable at each
# configure, and a suite that cannot run is a visible skip. Configures a scratch project that includes
# SUITES_DIR (tests/python) twice in one build directory, as `.ci/quickstart.sh demo` then `test` do:
# first with a python that cannot import torch (before `test` installed it), then with the real one.
# It used to cache OFF at the first configure: the second registered nothing, and ctest said 100% passed.
set -eu
CMAKE=$1 SUITES=$2 PYTHON=$(command -v "$3")
if ! "$PYTHON" -c "import torch, transformers, pytest" 2>/dev/null; then
  echo "SKIP: $PYTHON cannot import torch, transformers and pytest (needed for the second configure)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# A python3 that cannot import torch while $work/hide exists, and is the real one otherwise.
cat >"$work/python3" <<EOS
#!/bin/sh
if [ -e "$work/hide" ]; then
  case "\$*" in *"import torch"*) echo "ModuleNotFoundError: No module named 'torch'" >&2; exit 1 ;; esac
fi
exec "$PYTHON" "\$@"
EOS
chmod +x "$work/python3"
mkdir "$work/src"
cat >"$work/src/CMakeLists.txt" <<EOS
cmake_minimum_required(VERSION 3.25)
project(detection_scratch LANGUAGES NONE)
enable_testing()
add_library(cad_host SHARED IMPORTED)
set_target_properties(cad_host PROPERTIES IMPORTED_LOCATION \${CMAKE_BINARY_DIR}/libcad_host.so)
set(CAD_PLUGIN_OUTPUT_DIRECTORY \${CMAKE_BINARY_DIR})
add_subdirectory($SUITES suites)
EOS
configure() { "$CMAKE" -S "$work/src" -B "$work/build" -DPython3_EXECUTABLE="$work/python3" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; fail "configure failed"; }; }

# 1. torch missing: every suite is registered, as a skip that names the missing module.
touch "$work/hide"
configure
(cd "$work/build" && ctest -R '^python\.one_process$' -V) >"$work/ctest1.log" 2>&1 || true
grep -q "SKIP python.one_process: .*No module named 'torch'" "$work/ctest1.log" ||
  { cat "$work/ctest1.log"; fail "without torch, python.one_process is not a skip naming the missing module"; }
grep -q "Skipped" "$work/ctest1.log" || { cat "$work/ctest1.log"; fail "ctest does not report python.one_process as Skipped"; }

# 2. torch installed since: the same build directory now registers the real suites.
rm "$work/hide"
configure
(cd "$work/build" && ctest --show-only=json-v1) >"$work/tests.json"
"$PYTHON" - "$work/tests.json" <<'EOS' || fail "after torch was installed, the suites were not registered"
import json, sys
tests = {t["name"]: t["command"] for t in json.load(open(sys.argv[1]))["tests"]}
cmd = tests.get("python.one_process", [])
print("python.one_process:", " ".join(cmd))
sys.exit(0 if "pytest" in cmd else 1)
EOS

# 3. An explicit choice is kept: -DCAD_PYTHON_TESTS=OFF is a skip saying so, even with torch importable.
"$CMAKE" -S "$work/src" -B "$work/build" -DCAD_PYTHON_TESTS=OFF >"$work/configure.log" 2>&1 || fail "configure failed"
(cd "$work/build" && ctest -R '^python\.llama$' -V) >"$work/ctest3.log" 2>&1 || true
grep -q "SKIP python.llama: turned off with -DCAD_PYTHON_TESTS=OFF" "$work/ctest3.log" ||
  { cat "$work/ctest3.log"; fail "-DCAD_PYTHON_TESTS=OFF is not reported as a skip"; }
echo "PASS python detection"
