#!/usr/bin/env bash
# tcg-cold.sh: what code and data cost right after a context switch in the benchmarks' VM
# (QEMU TCG), and what the request path costs there warm and after a switch. One VM
# (tests/vm/cuse-vm, 1 vCPU), alternating, --reps times:
#   tcg_cold none | code K 64 | code K 4096 | data P   after a pipe round trip with a child
#                                                     (tests/bench/tcg_cold.c), and warm;
#   request_cost simple|nested|alloc N [--switch]     (ioctl-proxy's example) likewise.
# Each line is ns per round (per ioctl for request_cost); subtract the `none` line of the same
# repetition for the cost of the work itself after a switch. Measures, never fails on a slow
# result. tests/bench/README.md, "Cold code after every switch", explains the use.
#
# Usage: tests/bench/tcg-cold.sh [--reps R] [--rounds N]
#   --reps R     repetitions (default 3)
#   --rounds N   rounds per measurement (default 2000)
# Builds on the host (gcc; cargo build --release of the example), runs only binaries in the VM.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd -P)
REPS=3 ROUNDS=2000 GUEST=0
while (($#)); do
  case $1 in
    --reps) REPS=${2:?}; shift 2 ;;
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    --guest) GUEST=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "tcg-cold: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $REPS =~ ^[1-9][0-9]*$ && $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "tcg-cold: --reps and --rounds take positive numbers" >&2; exit 2; }
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[[ $TARGET == /* ]] || TARGET=$ROOT/$TARGET
COLD=$TARGET/bench/tcg_cold
RC=$TARGET/release/examples/request_cost
if ((GUEST)); then
  for rep in $(seq "$REPS"); do
    echo "== repetition $rep"
    "$COLD" "$ROUNDS" none
    for k in 100 300 1000; do "$COLD" "$ROUNDS" code "$k" 64; "$COLD" "$ROUNDS" code "$k" 64 --warm; done
    for k in 100 300; do "$COLD" "$ROUNDS" code "$k" 4096; done
    for p in 30 100 300; do "$COLD" "$ROUNDS" data "$p"; "$COLD" "$ROUNDS" data "$p" --warm; done
    "$RC" none "$ROUNDS" --switch
    for kind in simple nested alloc; do "$RC" "$kind" "$ROUNDS" --switch; "$RC" "$kind" "$ROUNDS"; done
  done
  exit 0
fi
command -v gcc >/dev/null || apt-get install -y -qq gcc >/dev/null
mkdir -p "$TARGET/bench"
gcc -O2 -Wall -Wextra -o "$COLD" tests/bench/tcg_cold.c
cargo build --release -q -p ioctl-proxy --example request_cost
out=$(mktemp)
trap 'rm -f "$out"' EXIT
tests/vm/cuse-vm --smp 1 --timeout 1800 -- "$ROOT/tests/bench/tcg-cold.sh" --guest --reps "$REPS" \
  --rounds "$ROUNDS" | tee "$out"
# Summary: per measurement, the median over repetitions of its ns minus that repetition's
# round trip alone (its program's `none` line) for the measurements after a switch.
python3 - "$out" <<'PY'
import re, statistics, sys
reps, cur = [], None
for line in open(sys.argv[1]):
    if line.startswith("== repetition"):
        cur = {}
        reps.append(cur)
        continue
    m = re.match(r"(.*?): (\d+) ns per (?:round|ioctl)", line.strip())
    if m and cur is not None:
        cur[re.sub(r" \(acc -?\d+\)", "", m.group(1))] = int(m.group(2))
rows = {}
for r in reps:
    # tcg_cold's lines carry "k=", request_cost's do not: each against its own round trip.
    base = {("k=" in k): v for k, v in r.items() if k.startswith("none")}
    for k, v in r.items():
        if k.startswith("none"):
            rows.setdefault(k + " (the round trip alone)", []).append(v)
        elif k.endswith("switch") and ("k=" in k) in base:
            rows.setdefault(k + " minus the round trip", []).append(v - base["k=" in k])
        else:
            rows.setdefault(k, []).append(v)
print("\nsummary (medians over repetitions, µs):")
for k, v in rows.items():
    print(f"  {statistics.median(v) / 1000:9.1f}  {k}")
PY
