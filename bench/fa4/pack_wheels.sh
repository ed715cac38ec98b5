#!/usr/bin/env bash
# pack_wheels.sh -- FlashAttention-4's wheels for the GPU machine (which has no network), run where pip works, from
# the repository root. Downloads the set that imports there (/work/shared/ANCHORS.md: flash-attn-4 4.0.0b36 and
# its CuTe DSL 4.8.1 runtime) into .whl/ (ignored, see .gitignore) and lays them out in three folders that each
# fit one run's 64 MiB beside the working tree (about 28 MiB):
#   .whl/fa4a/  every wheel but nvidia-cutlass-dsl-libs-cu13, the first third of that one, and the document-length
#               data the benchmarks sample from ($CAD_DATA, else ../shared/data/doclen_pretrain.json)
#   .whl/fa4b/, .whl/fa4c/  the second and the last third
# The -libs-cu13 wheel (92 MB, over the limit alone) is unzipped and repacked as one tar.xz (smaller than the
# zip: xz finds what the wheel's per-file deflate misses), then split in three. bench/fa4/unpack.sh reassembles and
# installs them there. Usage: bash bench/fa4/pack_wheels.sh [DEST] (default .whl). Needs pip, unzip, xz, split.
set -euo pipefail
DEST="${1:-.whl}"
CAP=$((60 * 1024 * 1024))  # each folder at most this, leaving room for the working tree within 64 MiB
WHEELS=(flash_attn_4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
        nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5
        apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5)
raw="$DEST/raw"
mkdir -p "$raw"
for w in "${WHEELS[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$raw" "$w"
done
cu13=$(ls "$raw"/nvidia_cutlass_dsl_libs_cu13-*.whl)
rm -rf "$DEST/fa4a" "$DEST/fa4b" "$DEST/fa4c" "$DEST/cu13_tree"
mkdir -p "$DEST/fa4a" "$DEST/fa4b" "$DEST/fa4c" "$DEST/cu13_tree"
for f in "$raw"/*.whl; do [ "$f" = "$cu13" ] || cp "$f" "$DEST/fa4a/"; done
unzip -q "$cu13" -d "$DEST/cu13_tree"
tar -C "$DEST/cu13_tree" -cf - . | xz -9e -T2 > "$DEST/cu13.tar.xz"
rm -rf "$DEST/cu13_tree"
size=$(stat -c %s "$DEST/cu13.tar.xz")
# Three parts, one per run: each run's folder plus the working tree (about 28 MiB) stays under 64 MiB.
split -b $(((size + 2) / 3)) -d -a 1 "$DEST/cu13.tar.xz" "$DEST/cu13.tar.xz.part"
mv "$DEST/cu13.tar.xz.part0" "$DEST/fa4a/"
mv "$DEST/cu13.tar.xz.part1" "$DEST/fa4b/"
mv "$DEST/cu13.tar.xz.part2" "$DEST/fa4c/"
# What unpack.sh checks before it installs: the whole archive's digest and the wheel it came from.
( cd "$DEST" && sha256sum cu13.tar.xz > fa4a/cu13.sha256 && cp fa4a/cu13.sha256 fa4b/ && cp fa4a/cu13.sha256 fa4c/ )
basename "$cu13" > "$DEST/fa4a/cu13.wheel"
rm "$DEST/cu13.tar.xz"
# The GPU machine has no ../shared: the data travels with the wheels.
data="${CAD_DATA:-$PWD/../shared/data/doclen_pretrain.json}"
if [ -f "$data" ]; then cp "$data" "$DEST/fa4a/doclen_pretrain.json"; else echo "pack_wheels.sh: no $data to send with the wheels" >&2; exit 1; fi
for d in fa4a fa4b fa4c; do
  bytes=$(du -cb "$DEST/$d" | tail -1 | cut -f1)
  echo "$DEST/$d: $((bytes / 1024 / 1024)) MiB"
  [ "$bytes" -le "$CAP" ] || { echo "pack_wheels.sh: $DEST/$d is over $((CAP / 1024 / 1024)) MiB" >&2; exit 1; }
done
ls -l "$DEST/fa4a" "$DEST/fa4b" "$DEST/fa4c"
