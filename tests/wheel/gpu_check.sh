#!/usr/bin/env bash
# gpu_check.sh -- the wheel's GPU parts on one GPU machine with nvcc and a CUDA PyTorch (not run by CI), unattended,
# offline, under a hard time limit:
#   1. pip wheel . with CUDA (the kernels for sm_90a and sm_80: pyproject.toml), timed, with no index and no build
#      isolation (a GPU machine may have no network, and the nccl plugin finds PyTorch's NCCL through the python3
#      on PATH, which an isolated build hides);
#   2. the wheel's cad_cuda.so and cad_cad.so carry sm_90a and sm_80 code (cuobjdump --list-elf), and it bundles
#      the CUDA runtime;
#   3. tests/wheel/check_wheel.sh: a fresh environment without a compiler (it sees python3's torch), the CPU smoke
#      test on 2 gloo ranks;
#   4. in that environment: smoke.py --gpu (local bf16 attention through the package's cuda backend against sdpa,
#      every CAD library from the package), then tests/gpu_python/test_gpu.py against the installed package.
# Needs on the machine: nvcc, cmake >= 3.25, ninja, and importable by python3: torch (CUDA), pytest and
# scikit-build-core (or CAD_WHEELHOUSE=DIR holding scikit-build-core's wheel and its needs, made where there is a
# network: pip download scikit-build-core -d DIR).
# Results under $OUT (default ./wheel_gpu_out), at most 6 files: summary.txt (what passed, the times, the wheel's
# name, size and sha256), wheel_build.log, smoke_cpu.log, smoke_gpu.log, test_gpu.log. The wheel, its unpacked
# copy and the environment live in a temporary directory, removed at the end. Exits non-zero on any failure, and
# with 124 where the limit stopped it (CAD_GPU_CHECK_LIMIT_S, default 540 s; on one H200 with 16 cores the whole
# check takes about 3 minutes, the build most of it).
# Usage, from anywhere: bash tests/wheel/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
repo="$PWD"
OUT="${OUT:-$PWD/wheel_gpu_out}"
mkdir -p "$OUT"
OUT="$(realpath "$OUT")"
summary="$OUT/summary.txt"

if [ "${CAD_GPU_CHECK_BODY:-0}" != 1 ]; then
  # The outer call: the body below under a hard limit, so that a hung build or test cannot outlast the machine.
  : > "$summary"
  limit="${CAD_GPU_CHECK_LIMIT_S:-540}"
  rc=0
  # timeout puts the body in a process group of its own (its pid) and kills that group at the limit; the steps'
  # own limits below are --foreground, so everything they start stays in it, and whatever a step left running is
  # ended with the group once the body returns.
  CAD_GPU_CHECK_BODY=1 OUT="$OUT" timeout -k 10 "$limit" bash "$0" "$@" &
  body=$!
  wait "$body" || rc=$?
  kill -KILL -- "-$body" 2>/dev/null || true
  case "$rc" in
    0) echo "gpu_check.sh: passed" | tee -a "$summary" ;;
    124|137) echo "gpu_check.sh: stopped at its limit of $limit s (exit $rc)" | tee -a "$summary" ;;
    *) echo "gpu_check.sh: FAILED (exit $rc)" | tee -a "$summary" ;;
  esac
  exit "$rc"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
say() { echo "$*" | tee -a "$summary"; }
fail() { say "$*"; exit 1; }
begin=$(date +%s)
elapsed() { echo "$(( $(date +%s) - begin )) s"; }
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
command -v nvcc >/dev/null || fail "gpu_check.sh: nvcc not found"
command -v cuobjdump >/dev/null || fail "gpu_check.sh: cuobjdump not found"
# NVLink multicast stays off on shared machines, also in the children the tests start.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INDEX=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$summary"
say "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $(nvcc --version | tail -1);" \
    "$(python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)')"
say "$(nproc) cores; cmake $(cmake --version | head -1 | awk '{print $3}'); ninja $(ninja --version 2>/dev/null || echo missing)"

if ! python3 -c "import scikit_build_core" 2>/dev/null; then
  if [ -d "${CAD_WHEELHOUSE:-}" ]; then
    python3 -m pip install -q --no-index --find-links "$CAD_WHEELHOUSE" scikit-build-core
  else
    fail "gpu_check.sh: scikit-build-core is not importable by python3; pip install scikit-build-core, or set" \
         "CAD_WHEELHOUSE to a directory with its wheels (pip download scikit-build-core -d DIR)"
  fi
fi
python3 -c "import pytest" 2>/dev/null || fail "gpu_check.sh: pytest is not importable by python3 (test_gpu.py needs it)"
say "scikit-build-core $(python3 -c 'import scikit_build_core; print(scikit_build_core.__version__)')"

# ---- 1. the wheel ---------------------------------------------------------------------------------------------
start=$(date +%s)
if ! CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" timeout --foreground -k 10 420 python3 -m pip wheel --no-deps --no-index --no-build-isolation \
     -w "$work/wheel" . -C cmake.define.CAD_ENABLE_CUDA=ON > "$OUT/wheel_build.log" 2>&1; then
  tail -30 "$OUT/wheel_build.log" | tee -a "$summary"
  fail "pip wheel: FAILED after $(( $(date +%s) - start )) s"
fi
wheel="$(ls "$work"/wheel/cad-*.whl)"
say "pip wheel: $(basename "$wheel") in $(( $(date +%s) - start )) s, $(du -k "$wheel" | cut -f1) KiB," \
    "sha256 $(sha256sum "$wheel" | cut -c1-16)"

# ---- 2. what the wheel carries --------------------------------------------------------------------------------
python3 -m zipfile -e "$wheel" "$work/unpacked"
for so in cad_cuda.so cad_cad.so; do
  [ -f "$work/unpacked/cad/lib/cad/plugins/$so" ] || fail "$so: not in the wheel"
  elfs="$(cuobjdump --list-elf "$work/unpacked/cad/lib/cad/plugins/$so")"
  for arch in sm_90a sm_80; do
    echo "$elfs" | grep -q "$arch" || fail "$so: no $arch code (cuobjdump --list-elf: $(echo "$elfs" | tr '\n' ' '))"
  done
done
ls "$work"/unpacked/cad/lib/libcudart.so.* > /dev/null 2>&1 || fail "no bundled libcudart in the wheel"
say "sm_90a and sm_80 code in cad_cuda.so and cad_cad.so; bundled: $(cd "$work/unpacked/cad/lib" && ls lib*.so.* | tr '\n' ' ')"

# ---- 3. a fresh environment, the CPU smoke test ---------------------------------------------------------------
venv="$work/venv"
timeout --foreground -k 10 180 bash tests/wheel/check_wheel.sh "$wheel" "$venv" > "$OUT/smoke_cpu.log" 2>&1 \
  || { tail -30 "$OUT/smoke_cpu.log" | tee -a "$summary"; fail "CPU smoke test in a fresh environment: FAILED"; }
say "CPU smoke test in a fresh environment: passed ($(elapsed) so far)"

# ---- 4. the same environment on the GPU -----------------------------------------------------------------------
clean=(env -u CAD_HOST_LIBRARY -u CAD_PLUGIN_PATH -u PYTHONPATH)
(cd "$work" && cp "$repo/tests/wheel/smoke.py" . && timeout --foreground -k 10 120 "${clean[@]}" "$venv/bin/python" smoke.py --gpu) \
  > "$OUT/smoke_gpu.log" 2>&1 || { tail -30 "$OUT/smoke_gpu.log" | tee -a "$summary"; fail "GPU smoke test: FAILED"; }
say "GPU smoke test: passed ($(grep -m1 'cuda backend' "$OUT/smoke_gpu.log" | cut -c1-120))"
(cd tests/gpu_python && timeout --foreground -k 10 240 "${clean[@]}" "$venv/bin/python" -m pytest -q -p no:cacheprovider test_gpu.py) \
  > "$OUT/test_gpu.log" 2>&1 || { tail -30 "$OUT/test_gpu.log" | tee -a "$summary"; fail "test_gpu.py: FAILED"; }
say "test_gpu.py against the installed wheel: $(tail -1 "$OUT/test_gpu.log")"
say "total $(elapsed)"
