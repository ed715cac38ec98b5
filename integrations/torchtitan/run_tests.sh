#!/usr/bin/env bash
# run_tests.sh PYTHON VENV [TEST_FILE.py] [pytest arguments] -- TorchTitan's own trainer with CAD (TEST_FILE, one of
# this folder's; default test_titan_trainer.py), with
# torchtitan installed as users install it from PyPI into the virtual environment VENV, made from PYTHON with its
# site-packages visible (torch, pytest and what the cad package needs come from there). ctest runs this as
# python.torchtitan (tests/python/CMakeLists.txt) with `-k plans_are_made`: two micro-batches per step, each
# planned ahead, losses equal to CAD's local attention's; and as python.torchtitan.parallel with
# test_titan_parallel.py (context and tensor parallelism on 4 gloo ranks against one process unsplit).
#
# torchtitan 0.2.2 is the release whose trainer runs on torch 2.11 and later (0.3.0 needs a torch with
# torch.distributed.fsdp.DataParallelMeshDims). It pins a torch of its own, so it and the packages it imports are
# installed with --no-deps (CAD_TORCHTITAN overrides the list). An environment that already imports torchtitan is
# reused; PYTHON itself is used when it does. Where it cannot install (no network, no venv module) the script exits
# 77, which ctest reports as skipped, with the reason.
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 PYTHON VENV [TEST_FILE.py] [pytest arguments]" >&2
  exit 2
fi
PY=$1
VENV=$2
shift 2
TESTS=test_titan_trainer.py
case "${1:-}" in
  *.py) TESTS=$1; shift ;;
esac
HERE=$(cd "$(dirname "$0")" && pwd)
SKIP=77
PACKAGES=${CAD_TORCHTITAN:-"torchtitan==0.2.2 einops tyro docstring_parser typeguard torchdata"}
skip() { echo "SKIP python.torchtitan: $*"; exit "$SKIP"; }

# The packed-document data is the Pretrain recipe's lengths, found where the recipe looks for them
# (titan_common.default_data_path), as for the trainer tests: without it there is nothing to train on.
data=$("$PY" -c "import sys; sys.path.insert(0, sys.argv[1]); import titan_common; print(titan_common.default_data_path() or '')" \
       "$HERE" 2>/dev/null)
[ -n "$data" ] || skip "no Pretrain data (doclen_pretrain.json: set CAD_DATA, or ../shared/data beside the checkout)"

# shellcheck source=../python_with_package.sh
. "$HERE/../python_with_package.sh"
# shellcheck disable=SC2086 -- the list is words
python_with_package torchtitan "$PY" "$VENV" --no-deps $PACKAGES
echo "torchtitan $VERSION ($RUN)"
exec "$RUN" -m pytest -q -rs -p no:cacheprovider "$HERE/$TESTS" "$@"
