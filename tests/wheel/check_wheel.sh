#!/usr/bin/env bash
# check_wheel.sh WHEEL [VENV] -- installs WHEEL (pip wheel . ; README) into a fresh virtual environment and runs the CPU
# smoke test (smoke.py) there, outside the source tree. The install runs with nothing but the environment's own
# bin/ on PATH (no compiler) and without an index (no network): the wheel alone. The environment sees python3's
# site-packages for torch (--system-site-packages, or a .pth file where python3 is itself a virtual environment's),
# as a user's environment with PyTorch does; its own cad comes first (--ignore-installed: a cad in those
# site-packages does not count as installed). Its pip is python3's, seen through those site-packages (--without-pip
# saves installing one). CAD_HOST_LIBRARY, CAD_PLUGIN_PATH and PYTHONPATH are not passed on. VENV: where to make
# the environment and keep it (it must not exist; default: a temporary directory, removed at the end). Exits
# non-zero on any failure.
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: check_wheel.sh WHEEL [VENV]" >&2; exit 2
fi
[ -f "$1" ] || { echo "check_wheel.sh: no wheel at '$1'" >&2; exit 2; }
wheel="$(realpath "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
venv="${2:-$work/venv}"
[ -e "$venv" ] && { echo "check_wheel.sh: $venv exists already (a fresh environment is the point)" >&2; exit 2; }
python3 -m venv --system-site-packages --without-pip "$venv"
venv="$(realpath "$venv")"
# Where python3 is itself a virtual environment's (GPU images keep PyTorch in one), the new environment's "system"
# site-packages are the base interpreter's, which lack torch and pip: a .pth file lists python3's own
# site-packages instead. Its directories come after the new environment's, so the wheel's cad still comes first.
purelib="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
python3 -c 'import site, sys
if sys.prefix != sys.base_prefix:
    print("".join(d + "\n" for d in dict.fromkeys(site.getsitepackages())), end="")' > "$purelib/_cad_parent_env.pth"
env -i PATH="$venv/bin" HOME="$work" "$venv/bin/python" -m pip install -q --no-deps --no-index \
  --ignore-installed --disable-pip-version-check "$wheel"
cp "$here/smoke.py" "$work/smoke.py"
cd "$work"
env -i PATH="$venv/bin:/usr/bin:/bin" HOME="$work" "$venv/bin/python" smoke.py
