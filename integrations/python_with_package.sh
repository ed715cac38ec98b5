# python_with_package.sh -- sourced by the integrations' run_tests.sh: an interpreter that has a released package
# installed the way users install it (pip, from PyPI), without touching the system's Python.
#
# python_with_package DIST PYTHON VENV PIP_ARGS...
#   Sets RUN (the interpreter to use) and VERSION (DIST's installed version). PYTHON itself when DIST is installed
#   there; else VENV's interpreter: VENV made from PYTHON with its site-packages visible (torch, pytest and what the
#   cad package needs come from there), `pip install PIP_ARGS` into it when DIST is not installed yet (made once,
#   reused after). Where that cannot be done (no venv module, no network, no release for this Python) it calls the
#   caller's `skip MESSAGE` (which exits 77: ctest's skip).
python_with_package() {
  local dist=$1 py=$2 venv=$3
  shift 3
  # Whether an interpreter has DIST installed: its metadata (importing it would start torch: seconds).
  installed() { "$1" -c "import importlib.metadata as m; print(m.version('$dist'))" 2>/dev/null; }
  if VERSION=$(installed "$py"); then
    RUN=$py
    return
  fi
  if ! VERSION=$(installed "$venv/bin/python"); then
    rm -rf "$venv"
    local log
    if ! log=$("$py" -m venv --system-site-packages "$venv" 2>&1); then
      skip "cannot make a virtual environment with $py -m venv (${log##*$'\n'})"
    fi
    echo "pip install $* into $venv ($("$py" -c 'import sys; print("Python %d.%d" % sys.version_info[:2])'))"
    if ! log=$("$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1); then
      echo "$log" | tail -5 | cut -c1-400
      rm -rf "$venv"
      skip "pip install $* failed on this machine (see above)"
    fi
    VERSION=$(installed "$venv/bin/python") || skip "pip installed $* but the metadata of $dist is missing"
  fi
  RUN=$venv/bin/python
}
