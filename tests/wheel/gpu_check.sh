#!/usr/bin/env bash
# gpu_check.sh -- the wheel's GPU parts on one GPU machine with nvcc and a CUDA PyTorch (not run by CI):
#   1. pip wheel . with CUDA (the kernels for sm_90a and sm_80: pyproject.toml), timed;
#   2. the wheel's cad_cuda.so and cad_cad.so carry sm_90a and sm_80 code (cuobjdump --list-elf), and it bundles
#      the CUDA runtime;
#   3. tests/wheel/check_wheel.sh: a fresh environment without a compiler, the CPU smoke test on 2 gloo ranks;
#   4. in that environment: smoke.py --gpu (local bf16 attention through the package's cuda backend against sdpa,
#      every CAD library from the package), then tests/gpu_python/test_gpu.py against the installed package.
# The wheel is built without build isolation (a GPU machine may have no network, and the nccl plugin finds
# PyTorch's NCCL through the python3 on PATH, which an isolated build hides): scikit-build-core must be importable,
# or CAD_WHEELHOUSE=DIR must hold its wheels (made where there is a network: pip download scikit-build-core -d DIR).
# Results under $OUT (default ./wheel_gpu_out): summary.txt, wheel_build.log, the wheel, test logs. Exits
# non-zero on any failure. Usage: bash tests/wheel/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/wheel_gpu_out}"
mkdir -p "$OUT"
rm -rf "$OUT/wheel" "$OUT/unpacked" "$OUT/venv"
summary="$OUT/summary.txt"
: > "$summary"
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
command -v nvcc >/dev/null || { echo "gpu_check.sh: nvcc not found" | tee -a "$summary"; exit 1; }
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$summary"
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(nvcc --version | tail -1)" | tee -a "$summary"

if ! python3 -c "import scikit_build_core" 2>/dev/null; then
  if [ -d "${CAD_WHEELHOUSE:-}" ]; then
    python3 -m pip install -q --no-index --find-links "$CAD_WHEELHOUSE" scikit-build-core
  else
    echo "gpu_check.sh: scikit-build-core is not importable; pip install scikit-build-core, or set CAD_WHEELHOUSE" \
         "to a directory with its wheels (pip download scikit-build-core -d DIR)" | tee -a "$summary"; exit 1
  fi
fi
start=$(date +%s)
if ! CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" python3 -m pip wheel --no-deps --no-build-isolation -w "$OUT/wheel" . \
     -C cmake.define.CAD_ENABLE_CUDA=ON > "$OUT/wheel_build.log" 2>&1; then
  tail -30 "$OUT/wheel_build.log" | tee -a "$summary"
  echo "pip wheel: FAILED" | tee -a "$summary"; exit 1
fi
wheel="$(ls "$OUT"/wheel/cad-*.whl)"
echo "pip wheel: $(basename "$wheel") in $(( $(date +%s) - start )) s" | tee -a "$summary"

python3 -m zipfile -e "$wheel" "$OUT/unpacked"
for so in cad_cuda.so cad_cad.so; do
  elfs="$(cuobjdump --list-elf "$OUT/unpacked/cad/lib/cad/plugins/$so")"
  for arch in sm_90a sm_80; do
    echo "$elfs" | grep -q "$arch" || { echo "$so: no $arch code" | tee -a "$summary"; exit 1; }
  done
done
ls "$OUT"/unpacked/cad/lib/libcudart.so.* > /dev/null || { echo "no bundled libcudart" | tee -a "$summary"; exit 1; }
echo "sm_90a and sm_80 code in cad_cuda.so and cad_cad.so; bundled: $(cd "$OUT/unpacked/cad/lib" && ls lib*.so.* | tr '\n' ' ')" \
  | tee -a "$summary"

bash tests/wheel/check_wheel.sh "$wheel" "$OUT/venv" 2>&1 | tee "$OUT/smoke_cpu.log"
echo "CPU smoke test in a fresh environment: passed" | tee -a "$summary"
clean=(env -u CAD_HOST_LIBRARY -u CAD_PLUGIN_PATH -u PYTHONPATH)
"${clean[@]}" "$OUT/venv/bin/python" tests/wheel/smoke.py --gpu 2>&1 | tee "$OUT/smoke_gpu.log"
echo "GPU smoke test: passed" | tee -a "$summary"
(cd tests/gpu_python && "${clean[@]}" "$OUT/venv/bin/python" -m pytest -q -p no:cacheprovider test_gpu.py) \
  > "$OUT/test_gpu.log" 2>&1 || { tail -30 "$OUT/test_gpu.log" | tee -a "$summary"; echo "test_gpu.py: FAILED" | tee -a "$summary"; exit 1; }
echo "test_gpu.py against the installed wheel: $(tail -1 "$OUT/test_gpu.log")" | tee -a "$summary"
