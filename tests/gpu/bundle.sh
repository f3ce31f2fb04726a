#!/usr/bin/env bash
# Builds what tests/gpu/validate.sh needs (release, x86_64) and copies it, stripped of debug
# info, into target/gpu-bundle (about 18 MiB: small enough to carry to a lent GPU machine).
# Usage: tests/gpu/bundle.sh   (prints the bundle directory)
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p daemon -p preload -p tests >&2
out=target/gpu-bundle
rm -rf "$out"
mkdir -p "$out"
for f in nvproxy libnvproxy_preload.so cuda-probe nvfe-client nv-bench; do
  objcopy --strip-debug "target/release/$f" "$out/$f"
done
# The shim is found next to nvproxy; validate.sh itself stays in the checkout.
du -sh "$out" >&2
echo "$out"
