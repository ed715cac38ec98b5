#!/usr/bin/env bash
# run_tests.sh PYTHON VENV [pytest arguments] -- TorchTitan's own trainer with CAD (test_titan_trainer.py), with
# torchtitan installed as users install it from PyPI into the virtual environment VENV, made from PYTHON with its
# site-packages visible (torch, pytest and what the cad package needs come from there). ctest runs this as
# python.torchtitan (tests/python/CMakeLists.txt) with `-k plans_are_made`: two micro-batches per step, each
# planned ahead, losses equal to CAD's local attention's.
#
# torchtitan 0.2.2 is the release whose trainer runs on torch 2.11 and later (0.3.0 needs a torch with
# torch.distributed.fsdp.DataParallelMeshDims). It pins a torch of its own, so it and the packages it imports are
# installed with --no-deps (CAD_TORCHTITAN overrides the list). An environment that already imports torchtitan is
# reused; PYTHON itself is used when it does. Where it cannot install (no network, no venv module) the script exits
# 77, which ctest reports as skipped, with the reason.
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
PACKAGES=${CAD_TORCHTITAN:-"torchtitan==0.2.2 einops tyro docstring_parser typeguard torchdata"}
skip() { echo "SKIP python.torchtitan: $*"; exit "$SKIP"; }

installed() { "$1" -c "import importlib.metadata as m; print(m.version('torchtitan'))" 2>/dev/null; }

# The packed-document data is the Pretrain recipe's lengths (titan_common.default_data_path: $CAD_DATA,
# ../shared/data, .bench_data), as for the trainer tests: without it there is nothing to train on.
REPO=$(cd "$HERE/../.." && pwd)
data=""
for candidate in "${CAD_DATA:-}" "$REPO/../shared/data/doclen_pretrain.json" "$REPO/.bench_data/doclen_pretrain.json"; do
  if [ -n "$candidate" ] && [ -f "$candidate" ]; then data=$candidate; break; fi
done
[ -n "$data" ] || skip "no Pretrain data (doclen_pretrain.json: set CAD_DATA, or ../shared/data beside the checkout)"

if version=$(installed "$PY"); then
  RUN=$PY
else
  if ! version=$(installed "$VENV/bin/python"); then
    rm -rf "$VENV"
    if ! venv_log=$("$PY" -m venv --system-site-packages "$VENV" 2>&1); then
      skip "cannot make a virtual environment with $PY -m venv (${venv_log##*$'\n'})"
    fi
    echo "pip install --no-deps $PACKAGES into $VENV"
    # shellcheck disable=SC2086 -- the list is words
    if ! pip_log=$("$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps $PACKAGES 2>&1); then
      echo "$pip_log" | tail -5 | cut -c1-400
      rm -rf "$VENV"
      skip "pip install --no-deps $PACKAGES failed on this machine (see above)"
    fi
    version=$(installed "$VENV/bin/python") || skip "pip installed torchtitan but its metadata is missing"
  fi
  RUN=$VENV/bin/python
fi
echo "torchtitan $version ($RUN)"
exec "$RUN" -m pytest -q -rs -p no:cacheprovider "$HERE/test_titan_trainer.py" "$@"
