#!/usr/bin/env bash
# footprint.sh: how much distinct code one request runs, natively (no VM), for the request path
# (ioctl-proxy's request_cost example: the proxy on nvsim, a flat client memory) and for
# cuse-dev's session (its session_cost example: a restricted FUSE_IOCTL answered by an echoing
# handler, with the client thread that plays the kernel). Counted with valgrind's lackey
# (every superblock executed) and tests/bench/footprint.py: the blocks that ran at least once
# per request, the code pages they lie on, block executions per request, and the functions
# owning most blocks. Under QEMU's TCG this footprint, not the instruction count, is what a
# request costs after each switch between processes (tests/bench/README.md, "Cold code after
# every switch"). Measures, never fails on a large result.
#
# Usage: tests/bench/footprint.sh [--n N] [--top K]
#   --n N    requests per traced run (default 1000; RM_ALLOC+FREE: N pairs, counted per pair)
#   --top K  functions to list per run (default 12)
# Needs valgrind (installed with apt-get when missing, as root).
set -euo pipefail
cd "$(dirname "$0")/../.."
N=1000 TOP=12
while (($#)); do
  case $1 in
    --n) N=${2:?}; shift 2 ;;
    --top) TOP=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "footprint: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $N =~ ^[1-9][0-9]*$ && $TOP =~ ^[0-9]+$ ]] || { echo "footprint: --n and --top take numbers" >&2; exit 2; }
command -v valgrind >/dev/null || apt-get install -y -qq valgrind >/dev/null
cargo build --release -q -p ioctl-proxy --example request_cost
cargo build --release -q -p cuse-dev --example session_cost
TARGET=${CARGO_TARGET_DIR:-target}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
trace() { # LABEL PROG ARGS...
  local label=$1 prog=$2
  shift 2
  valgrind --tool=lackey --trace-superblocks=yes --log-file="$tmp/trace" "$prog" "$@" >/dev/null
  python3 tests/bench/footprint.py "$tmp/trace" "$N" --prog "$prog" --top "$TOP" --label "$label"
}
for kind in simple nested alloc; do
  trace "request path + nvsim, $kind$([[ $kind == alloc ]] && echo ' (RM_ALLOC+FREE pair)')" \
    "$TARGET/release/examples/request_cost" "$kind" "$N"
done
trace "cuse-dev session, restricted ioctl (with its client thread)" \
  "$TARGET/release/examples/session_cost" "$N" 1 session
