#!/usr/bin/env bash
# Builds what tests/gpu/validate.sh needs (release, x86_64) and copies it, stripped of debug
# info, into target/gpu-bundle (about 18 MiB: small enough to carry to a lent GPU machine).
# nvproxy is the build to install, profile-guided (deploy/build-release.sh; NVPROXY_PGO=0 for a
# plain release build, which a host that cannot train builds too, with a warning).
# Usage: tests/gpu/bundle.sh   (prints the bundle directory)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd -P)
cargo build --release -p preload -p tests >&2
source tests/bench/build-nvproxy.sh
build_nvproxy
out=target/gpu-bundle
rm -rf "$out"
mkdir -p "$out"
objcopy --strip-debug "$NVPROXY" "$out/nvproxy"
for f in libnvproxy_preload.so cuda-probe nvfe-client nv-bench; do
  objcopy --strip-debug "target/release/$f" "$out/$f"
done
# The shim is found next to nvproxy; validate.sh itself stays in the checkout.
du -sh "$out" >&2
echo "$out"
