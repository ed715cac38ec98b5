#!/usr/bin/env bash
# sass_dump.sh -- writes the SASS of every object of the cad_kernels target, one file per object, so that
# two builds (before and after a change that must not change the generated code, such as moving kernel
# code between files) can be compared with diff -r. Needs cuobjdump and nvdisasm on PATH (the CUDA
# toolkit's; on a machine without them: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm and add
# their bin folders to PATH).
set -euo pipefail
if [[ $# -ne 2 || $1 == -h || $1 == --help ]]; then
  cat <<'USAGE'
usage: kernels/tools/sass_dump.sh BUILD_DIR OUT_DIR
  BUILD_DIR  a configured and built CMake build folder (cmake --build BUILD_DIR --target cad_kernels)
  OUT_DIR    created; gets <object path with / as _>.sass per object of cad_kernels
Compare two dumps with: diff -r -I '^\s*$' OLD_DIR NEW_DIR (objects that moved keep their old name in
OLD_DIR: compare those pairs by hand). Host-only objects give an empty dump. Objects of files since
moved or deleted stay in an old build folder and are dumped too: use a fresh folder for a clean list.
USAGE
  [[ $# -eq 2 ]] && exit 0 || exit 2
fi
objdir="$1/kernels/CMakeFiles/cad_kernels.dir"
[[ -d $objdir ]] || { echo "sass_dump.sh: no cad_kernels objects under $objdir (build the target first)" >&2; exit 1; }
command -v cuobjdump >/dev/null || { echo "sass_dump.sh: cuobjdump not on PATH" >&2; exit 1; }
mkdir -p "$2"
count=0
while IFS= read -r -d '' obj; do
  rel=${obj#"$objdir"/}
  # Host-only objects have no device code: cuobjdump says so (naming the file), which is not SASS.
  cuobjdump -sass "$obj" 2>/dev/null | grep -v 'does not contain device code' > "$2/${rel//\//_}.sass" || true
  count=$((count + 1))
done < <(find "$objdir" -name '*.o' -print0 | sort -z)
echo "sass_dump.sh: $count objects -> $2"
