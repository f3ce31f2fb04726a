#!/usr/bin/env bash
# server-cost.sh: what a nanosecond of server work costs the client, in the VM (tests/vm/cuse-vm,
# 2 vCPUs). Six same-work floors (cuse_samework.c) answer simple controls: one without extra
# work, three after --spin-ns 10000 / 20000 / 40000 of busy work before each answer, two with
# --spin-after-ns 20000 / 40000 of busy work after it (on the serving thread, before it reads
# the next request); nv-bench times each in turn for --rounds rounds (3 batches of 300 ioctls)
# and the summary gives each floor's median µs per ioctl and its excess over the floor without
# work. Measures, never fails on a slow result.
#
# Usage: tests/bench/server-cost.sh [--rounds R]
# Builds nv-bench (release) and the floor (gcc, libfuse3-dev) on the host.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd -P)
PROG=server-cost
ROUNDS=5 GUEST=''
# b = busy work before the answer, a = after it (ns).
SPINS=(b0 b10000 b20000 b40000 a20000 a40000)
while (($#)); do
  case $1 in
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    --guest) GUEST=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "$PROG: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "$PROG: --rounds takes a positive number" >&2; exit 2; }
if [[ -n $GUEST ]]; then
  for s in "${SPINS[@]}"; do
    opt=--spin-ns
    [[ $s == a* ]] && opt=--spin-after-ns
    "$GUEST/cuse_samework" --name "nvbench-spin$s" "$opt" "${s:1}" >"$GUEST/spin$s.out" 2>&1 &
    for _ in $(seq 300); do grep -q '^READY' "$GUEST/spin$s.out" && break; sleep 0.1; done
  done
  for r in $(seq "$ROUNDS"); do
    for s in "${SPINS[@]}"; do
      us=$("$GUEST/nv-bench" samework-simple-control --dev "/dev/nvbench-spin$s" --iters 300 --batches 3 \
        --warmup 10 2>/dev/null | sed -n -E 's/^RESULT.* median_us=([0-9.]+).*/\1/p')
      echo "SPIN round=$r spin=$s us=${us:-missing}"
    done
  done
  exit 0
fi
# shellcheck source=tests/bench/stage-floor.sh
source tests/bench/stage-floor.sh
stage_floor server-cost # sets $work
tests/vm/cuse-vm --smp 2 --mem 2G --timeout 1200 -- bash "$ROOT/tests/bench/server-cost.sh" \
  --guest "$work" --rounds "$ROUNDS" | tee "$work/out.txt" | grep '^SPIN' || true
python3 - "$work/out.txt" <<'PY'
import collections, statistics, sys
us = collections.defaultdict(list)
for line in open(sys.argv[1]):
    if line.startswith("SPIN "):
        f = dict(kv.split("=", 1) for kv in line.split()[1:])
        try:
            us[f["spin"]].append(float(f["us"]))
        except ValueError:
            pass
if "b0" not in us:
    sys.exit("server-cost: no result for the floor without work")
base = statistics.median(us["b0"])
print("busy work per answer (µs) | client µs per ioctl (median) | excess over no work (µs)")
for s in sorted(us, key=lambda k: (k[0] == "a", int(k[1:]))):
    m = statistics.median(us[s])
    when = "before" if s[0] == "b" else "after"
    print(f"{int(s[1:]) / 1000:10.0f} {when:>14} | {m:28.1f} | {m - base:+.1f}")
PY
