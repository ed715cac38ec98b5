#!/usr/bin/env bash
# unpack.sh -- installs FlashAttention-4 on the GPU machine from what bench/fa4/pack_wheels.sh laid out, run from
# the repository root there. The wheels travel in three runs on one warm machine (each sends one folder; what an
# earlier run brought stays, .whl/ being ignored through .gitignore):
#   bash bench/fa4/unpack.sh check     # after the run that sent .whl/fa4a: says what is there, installs nothing
#   bash bench/fa4/unpack.sh install   # once .whl/fa4a, fa4b and fa4c are all there: installs into $FA4_SITE
# install checks the reassembled archive's digest, installs the wheels with pip --target (no index, no deps) and
# unpacks the repacked -libs-cu13 tree beside them. FA4_SITE (default .whl/site, kept between runs) is then
# importable with PYTHONPATH=$FA4_SITE:$FA4_SITE/nvidia_cutlass_dsl/dsl_packages (pip --target's .pth is not read);
# `source bench/fa4/unpack.sh env` sets exactly that. Exits non-zero on anything missing or corrupt.
set -uo pipefail
W="${FA4_WHEELS:-.whl}"
SITE="${FA4_SITE:-$PWD/.whl/site}"
A="$W/fa4a"  # part 1; server_directions.sh's build stage also keeps a copy where no folder sent later replaces it
[ -f "$A/cu13.tar.xz.part0" ] || [ ! -f "$PWD/build-srvdir/fa4a/cu13.tar.xz.part0" ] || A="$PWD/build-srvdir/fa4a"
mode="${1:-install}"
fa4_env() {
  export FA4_SITE="$SITE" PYTHONPATH="$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}"
}
case "$mode" in
  env)
    fa4_env
    return 0 2>/dev/null || exit 0 ;;
  check)
    ls -l "$A" "$W/fa4b" "$W/fa4c" 2>&1
    [ -f "$A/cu13.tar.xz.part0" ] && [ -f "$A/cu13.sha256" ] || { echo "unpack.sh: $A is incomplete" >&2; exit 1; }
    echo "unpack.sh: $A is here ($(ls "$A"/*.whl | wc -l) wheels, part 0 of $(cat "$A/cu13.wheel"))"
    exit 0 ;;
  install) ;;
  *) echo "usage: bash bench/fa4/unpack.sh check|install, or source it with env" >&2; exit 2 ;;
esac
if [ -f "$SITE/.installed" ]; then
  echo "unpack.sh: FA4 already installed in $SITE"
else
  parts=("$A/cu13.tar.xz.part0" "$W/fa4b/cu13.tar.xz.part1" "$W/fa4c/cu13.tar.xz.part2")
  for f in "${parts[@]}" "$A/cu13.sha256"; do
    [ -f "$f" ] || { echo "unpack.sh: $f is missing (send .whl/fa4a, .whl/fa4b and .whl/fa4c, one per run, to one warm machine)" >&2; exit 1; }
  done
  tmp=$(mktemp -d)
  cat "${parts[@]}" > "$tmp/cu13.tar.xz"
  want=$(cut -d' ' -f1 "$A/cu13.sha256")
  got=$(sha256sum "$tmp/cu13.tar.xz" | cut -d' ' -f1)
  [ "$want" = "$got" ] || { echo "unpack.sh: the reassembled archive's sha256 is $got, expected $want" >&2; rm -rf "$tmp"; exit 1; }
  rm -rf "$SITE" && mkdir -p "$SITE"
  # The tags say what the GPU machine runs (CPython 3.12, x86-64): pip then also installs where another Python runs it.
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    --python-version 3.12 --implementation cp --only-binary=:all: --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_24_x86_64 "$A"/*.whl \
    || { rm -rf "$tmp"; exit 1; }
  xz -dc "$tmp/cu13.tar.xz" | tar -C "$SITE" -xf - || { rm -rf "$tmp"; exit 1; }
  rm -rf "$tmp"
  touch "$SITE/.installed"
fi
fa4_env
PYTHONPATH="$PWD/host_adapter/python:$PYTHONPATH" python3 -c \
  "import cad.fa4 as f; ok, why = f.backward_available(); print('unpack.sh: flash-attn-4', f.version(), why); raise SystemExit(0 if ok else 1)"
