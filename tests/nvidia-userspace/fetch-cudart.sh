#!/usr/bin/env bash
# Fetches NVIDIA's CUDA runtime (libcudart.so.12) of one release from PyPI's
# nvidia-cuda-runtime-cu12 wheel, with the machine's configured pip index, and unpacks the
# library into a cache inside the repository's target dir. Nothing is installed.
#
# Usage: tests/nvidia-userspace/fetch-cudart.sh VERSION     (e.g. 12.2.140 or 12.9.79)
# Prints: CUDART_LIB_DIR=<dir with libcudart.so.12>
# Environment: NVIDIA_USERSPACE_CACHE  cache root (default <cargo target dir>/nvidia-userspace)
set -euo pipefail
PROG=fetch-cudart.sh
die() { echo "$PROG: $*" >&2; exit 1; }

VERSION=${1:-}
[[ $VERSION =~ ^12\.[0-9]+\.[0-9]+$ ]] || die "usage: $PROG VERSION (a 12.x release of nvidia-cuda-runtime-cu12, e.g. 12.2.140)"
HERE=$(cd "$(dirname "$0")" && pwd -P)
ROOT=$(cd "$HERE/../.." && pwd -P)
target_dir() {
  if [[ -n ${CARGO_TARGET_DIR:-} ]]; then echo "$CARGO_TARGET_DIR"; return; fi
  if command -v cargo >/dev/null && command -v python3 >/dev/null; then
    (cd "$ROOT" && cargo metadata --format-version 1 --no-deps 2>/dev/null |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])') && return
  fi
  echo "$ROOT/target"
}
CACHE_ROOT=${NVIDIA_USERSPACE_CACHE:-$(target_dir)/nvidia-userspace}
DEST=$CACHE_ROOT/cudart-$VERSION
if [[ -f $DEST/.complete ]]; then echo "CUDART_LIB_DIR=$DEST/lib"; exit 0; fi

command -v python3 >/dev/null || die "python3 not found"
python3 -m pip --version >/dev/null 2>&1 || die "pip not found (apt-get install python3-pip)"
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.lock"
flock 9
if [[ -f $DEST/.complete ]]; then echo "CUDART_LIB_DIR=$DEST/lib"; exit 0; fi
rm -rf "$DEST"
mkdir -p "$DEST/wheel" "$DEST/lib"
echo "$PROG: pip download nvidia-cuda-runtime-cu12==$VERSION" >&2
python3 -m pip download --quiet --no-deps --only-binary=:all: \
  --platform manylinux2014_x86_64 --python-version 3.11 \
  "nvidia-cuda-runtime-cu12==$VERSION" -d "$DEST/wheel" >&2 ||
  die "pip download of nvidia-cuda-runtime-cu12==$VERSION failed"
whl=$(ls "$DEST"/wheel/nvidia_cuda_runtime_cu12-"$VERSION"-*.whl 2>/dev/null | head -1)
[[ -n $whl ]] || die "no wheel of $VERSION downloaded"
python3 - "$whl" "$DEST/lib" <<'PY' || die "libcudart.so.12 missing from $whl"
import sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    data = z.read("nvidia/cuda_runtime/lib/libcudart.so.12")
with open(out + "/libcudart.so.12", "wb") as f:
    f.write(data)
PY
rm -rf "$DEST/wheel"
touch "$DEST/.complete"
echo "CUDART_LIB_DIR=$DEST/lib"
