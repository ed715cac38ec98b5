#!/usr/bin/env bash
# quickstart.sh -- the README's two commands. On a fresh Debian 12 / Ubuntu 24.04 machine it installs what
# the build needs (apt), configures and builds, then either runs the main job or every test.
#
#   bash .ci/quickstart.sh demo   # set up, build what the demo runs (CPU), run `cad demo` (CAD on 4 MPI ranks)
#   bash .ci/quickstart.sh test   # set up, build twice (normal; AddressSanitizer+UBSan), test, check the wheel
#
# Environment: CAD_JOBS (parallel build jobs, default: nproc), CAD_ENABLE_CUDA (ON/OFF; test: default ON when
# nvcc is found; demo: default OFF, ON builds the whole tree with the CUDA kernels), CAD_SKIP_APT=1 (do not
# touch apt), CAD_SKIP_ASAN=1 (test: normal build only), CAD_SKIP_FUZZ=1 (test: no fuzzing), CAD_FUZZ_SECONDS
# (test: seconds per fuzz target, default 6), CAD_CUDA_ARCHS (test: CUDA architectures compiled, default 90a;
# the demo and the package use the project's). ccache, where installed, is not used (CCACHE_DISABLE=1).
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-}"
case "$mode" in
  demo|test) ;;
  -h|--help|"")
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    [ -n "$mode" ] && exit 0 || exit 2 ;;
  *) echo "quickstart.sh: unknown mode '$mode' (expected 'demo' or 'test')" >&2; exit 2 ;;
esac

log() { printf '\n== %s [%s]\n' "$*" "$(date +%H:%M:%S)"; }

# ---- 1. packages ----------------------------------------------------------------------------------------
# The demo needs the compiler, MPI and the libraries the host links; the tests add googletest and clang-14.
packages=(build-essential cmake ninja-build pkg-config libopenmpi-dev openmpi-bin libltdl-dev
          nlohmann-json3-dev libspdlog-dev)
[ "$mode" = test ] && packages+=(libgtest-dev binutils clang-14 libclang-rt-14-dev)
if [ "${CAD_SKIP_APT:-0}" != 1 ]; then
  missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
fi

# ---- 1b. Python (test): torch, transformers and pytest for the package's tests -----------------------------
# Installed into the python3 on PATH only when missing. PyPI's torch wheel is the one pip can reach here; the
# tests use it on the CPU. CAD_SKIP_PYTHON=1 skips the Python package and its tests.
python_ready=0
if [ "$mode" = test ] && [ "${CAD_SKIP_PYTHON:-0}" != 1 ] && command -v python3 >/dev/null 2>&1; then
  export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1
  if ! python3 -c "import torch" 2>/dev/null; then
    log "pip install torch"
    python3 -m pip install -q torch
  fi
  if ! python3 -c "import transformers, pytest, matplotlib, scikit_build_core" 2>/dev/null; then
    log "pip install transformers pytest matplotlib scikit-build-core"
    python3 -m pip install -q transformers pytest matplotlib scikit-build-core
  fi
  python_ready=1
fi

# ---- 2. build -------------------------------------------------------------------------------------------
jobs="${CAD_JOBS:-$(nproc)}"
cuda="${CAD_ENABLE_CUDA:-}"
# The demo runs on the CPU: it builds without CUDA unless CAD_ENABLE_CUDA=ON asks for the kernels.
[ "$mode" = demo ] && [ -z "$cuda" ] && cuda=OFF
if [ -z "$cuda" ]; then
  if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then cuda=ON; else cuda=OFF; fi
fi
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
# CI must not profit from caches a fresh machine would not have.
export CCACHE_DISABLE=1
# mpirun refuses root unless told; CI runs as root in a container.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

build() {  # build DIR [cmake args...] [-- targets...]
  local dir="$1"; shift
  local args=() targets=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
  [ $# -gt 0 ] && shift && targets=("$@")
  log "configure $dir (${args[*]})"
  cmake -S . -B "$dir" -G Ninja "${args[@]}"
  log "build $dir with $jobs jobs${targets[*]:+ (${targets[*]})}"
  cmake --build "$dir" -j "$jobs" ${targets[@]:+--target "${targets[@]}"}
}

if [ "$mode" = demo ]; then
  # Only what the demo runs: the `cad` command and the plugins configs/cad_cpu.json names, plus the
  # colocated baseline. With CAD_ENABLE_CUDA=ON the whole tree is built, kernels included.
  demo_targets=(cad cad_plugin_cad cad_plugin_mpi cad_plugin_reference cad_plugin_prefix_aware cad_plugin_colocated)
  [ "$cuda" = ON ] && demo_targets=(all)
  build build -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA="$cuda" -DCAD_BUILD_TESTS=OFF -- "${demo_targets[@]}"
  log "cad demo: CAD on 4 MPI ranks"
  exec mpirun --allow-run-as-root --oversubscribe -np 4 build/bin/cad demo --config configs/cad_cpu.json
fi

# test: a normal build (CUDA compiled and linked when available), then ASan+UBSan without CUDA. The
# sanitizer build keeps assertions (no NDEBUG) and uses -O1 with line tables only: readable reports at
# a fraction of the compile time of full debug info.
# CUDA code compiles and links here but runs only on a GPU machine, so the test build compiles one architecture
# (sm_90a; the sm_80 path's sources are the same files) unless CAD_CUDA_ARCHS says otherwise: half the CUDA
# compile time of the default "90a;80" on two cores.
# The tests that need only the CPU are built and run once, in the sanitizer build below (with assertions on); the
# Release build keeps the Python suites, the CUDA programs and the tests that change with CUDA
# (CAD_CPU_ONLY_TESTS, CMakeLists.txt). With CAD_SKIP_ASAN=1 the Release build runs them all.
cpu_only_tests=OFF; [ "${CAD_SKIP_ASAN:-0}" = 1 ] && cpu_only_tests=ON
build build -DCMAKE_BUILD_TYPE=Release -DCAD_ENABLE_CUDA="$cuda" -DCAD_BUILD_TESTS=ON "-DCMAKE_CUDA_ARCHITECTURES=${CAD_CUDA_ARCHS:-90a}" \
  -DCAD_CPU_ONLY_TESTS="$cpu_only_tests"
if [ "$python_ready" = 1 ]; then
  # The wheel, made from the Release build above rather than compiled again (CAD_PACKAGE_FROM_BUILD:
  # cmake/CadPackageFromBuild.cmake; scikit-build-core installed above, so no build isolation), then installed
  # into a fresh virtual environment without a compiler and checked there on the CPU (tests/wheel).
  log "pip wheel . (the Python package cad, from the libraries in build/)"
  rm -rf build/wheel
  python3 -m pip wheel -q --no-deps --no-build-isolation -w build/wheel . \
    -C cmake.define.CAD_PACKAGE_FROM_BUILD="$PWD/build"
  log "the wheel in a fresh virtual environment"
  bash tests/wheel/check_wheel.sh build/wheel/cad-*.whl
fi
log "tests (normal build)"
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 300
if [ "${CAD_SKIP_ASAN:-0}" != 1 ]; then
  # clang-14 (as the fuzzers): it builds this tree in about 80% of gcc's time on two cores, and CI's code then
  # passes two compilers' -Werror (gcc above).
  build build-asan -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DCAD_ENABLE_CUDA=OFF \
    -DCAD_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE= "-DCMAKE_C_FLAGS=-O1 -g1" "-DCMAKE_CXX_FLAGS=-O1 -g1"
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:detect_odr_violation=0:fast_unwind_on_malloc=0"
  export LSAN_OPTIONS="suppressions=$PWD/.ci/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  log "tests (AddressSanitizer + UndefinedBehaviorSanitizer build)"
  ctest --test-dir build-asan --output-on-failure -j "$jobs" --timeout 600
fi
if [ "${CAD_SKIP_FUZZ:-0}" != 1 ]; then
  # libFuzzer targets (tests/fuzz) built with clang under ASan+UBSan, each run for a bounded time from
  # the committed seeds; a crash or broken invariant fails CI and prints its reproducer.
  log "configure build-fuzz (clang-14, CAD_FUZZ=ON)"
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
    -DCAD_ENABLE_CUDA=OFF -DCAD_FUZZ=ON -DCMAKE_BUILD_TYPE= "-DCMAKE_C_FLAGS=-O1 -g1" "-DCMAKE_CXX_FLAGS=-O1 -g1"
  log "build the fuzz targets with $jobs jobs"
  cmake --build build-fuzz -j "$jobs" --target fuzzers
  log "fuzzing (${CAD_FUZZ_SECONDS:-6} s per target)"
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:detect_odr_violation=0"
  tests/fuzz/run_fuzzers.sh build-fuzz "${CAD_FUZZ_SECONDS:-6}"
fi
