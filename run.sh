#!/usr/bin/env bash
# The README's "run it" command: builds nvproxy and serves the instances of a config file
# (default: examples/config.toml, which uses the simulated driver: no GPU needed).
#
#   ./run.sh [CONFIG]
#
# Needs root and the kernel's CUSE module (`modprobe cuse`). On a kernel without CUSE (our CI and
# dev machines), it says so and runs a short demo in a throwaway VM instead: the daemon serves the
# config there, and a client performs the frontend of a CUDA initialisation through it.
set -euo pipefail
cd "$(dirname "$0")"
config=${1:-examples/config.toml}

echo "run.sh: building (release)" >&2
cargo build --release -q -p daemon -p preload   # nvproxy and its mmap shim
cargo build --release -q -p tests --bins          # the test clients (nvfe-client)
bin=target/release

if [[ $(id -u) != 0 ]]; then
  echo "run.sh: nvproxy needs root (for /dev/cuse and mount namespaces); try: sudo $0 $*" >&2
  exit 1
fi
[[ -c /dev/cuse ]] || modprobe cuse 2>/dev/null || true
if [[ -c /dev/cuse ]]; then
  echo "run.sh: serving $config (Ctrl-C stops). In another shell, as root:" >&2
  echo "  $bin/nvproxy run --instance job42 -- $bin/nvfe-client init" >&2
  exec "$bin/nvproxy" serve --config "$config"
fi

echo "run.sh: this kernel has no CUSE (/dev/cuse); running the demo in a VM (tests/vm/cuse-vm)" >&2
tests/vm/cuse-vm --prepare >/dev/null
tests/vm/cuse-vm -- bash -c '
  set -e
  '"$bin"'/nvproxy serve --config '"$config"' >/tmp/serve.out 2>/tmp/serve.log &
  pid=$!
  for _ in $(seq 100); do grep -q READY /tmp/serve.out && break; sleep 0.2; done
  cat /tmp/serve.out
  first=$(sed -n "s/^READY \([^ ]*\).*/\1/p" /tmp/serve.out)
  echo "--- $first: nvfe-client init through /dev/nvidiactl and /dev/nvidia0 of the instance"
  '"$bin"'/nvproxy run --instance "$first" -- '"$bin"'/nvfe-client init
  kill -TERM $pid; wait $pid
  echo "--- daemon log (tail)"; tail -n 8 /tmp/serve.log
'
