#!/usr/bin/env bash
# run_tests.sh PYTHON VENV [pytest arguments] -- the Megatron-Core integration's tests (test_cad_megatron.py,
# test_cad_megatron_masks.py: every mask type, attention masks, inputs and config fields, and
# test_cad_megatron_cp.py: context parallelism over data x context ranks, and test_cad_megatron_tp.py: tensor,
# pipeline and context parallel layouts on 4 ranks), with
# megatron-core installed as users install it: `pip install megatron-core` (the released package, PyPI) into the
# virtual environment VENV, made from PYTHON with its site-packages visible (torch, pytest and what the cad package
# needs come from there; pip adds only what is missing). An environment that already imports megatron.core is
# reused; PYTHON itself is used when it does. ctest runs this as python.megatron (tests/python/CMakeLists.txt).
#
# megatron-core 0.17 and later need Python >= 3.12, so pip picks the newest release this Python can install
# (0.16.1 on Python 3.11). CAD_MEGATRON_CORE overrides the requirement (default "megatron-core>=0.16,<0.20": the
# releases this integration was checked with). Where it cannot install (no network, no release for this Python,
# no venv module) the script exits 77, which ctest reports as skipped, with the reason.
# CAD_MEGATRON_DEVICE=cuda runs the tests on 2 GPUs (NCCL, bf16) instead of the CPU.
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 PYTHON VENV [pytest arguments]" >&2
  exit 2
fi
PY=$1
VENV=$2
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
SKIP=77
REQUIREMENT=${CAD_MEGATRON_CORE:-"megatron-core>=0.16,<0.20"}
skip() { echo "SKIP python.megatron: $*"; exit "$SKIP"; }

# shellcheck source=../python_with_package.sh
. "$HERE/../python_with_package.sh"
python_with_package megatron-core "$PY" "$VENV" "$REQUIREMENT"
echo "megatron-core $VERSION ($RUN)"
# -rs: a test skipped inside (e.g. megatron.core installed but not importable) says why.
exec "$RUN" -m pytest -q -rs -p no:cacheprovider "$HERE/test_cad_megatron.py" "$HERE/test_cad_megatron_masks.py" \
  "$HERE/test_cad_megatron_cp.py" "$HERE/test_cad_megatron_tp.py" "$@"
