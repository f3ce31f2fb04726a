#!/usr/bin/env bash
# ab.sh: two builds of nvproxy against each other, interleaved in one VM (tests/vm/cuse-vm,
# 2 vCPUs), for a change whose effect is smaller than the spread between VM runs. In each of
# --rounds rounds, for each kind, build A then build B run
#   nvproxy exec --driver sim --memory process-vm -- nv-bench KIND --pair-samework ...
# (100 ioctls per batch, 5 batches), and each run's proxy ÷ same-work floor ratio is kept;
# the summary gives, per kind and build, the median over rounds (lowest–highest). Measures,
# never fails on a slow result.
#
# Usage: tests/bench/ab.sh A_NVPROXY B_NVPROXY [--rounds R] [--kinds K1,K2,..]
#   A_NVPROXY, B_NVPROXY  two nvproxy binaries (e.g. copies of target/release/nvproxy built
#                         from two commits or with two profiles)
#   --rounds R            rounds (default 8)
#   --kinds LIST          nv-bench kinds (default simple-control,nested-control,rm-alloc)
#   --threads N           N concurrent clients instead of one (nv-bench --threads N, one
#                         300 ms phase on the kind then one on the floor per run): the ratio
#                         is floor ÷ proxy throughput, as in concurrency.sh
# Builds nv-bench (release) and the same-work floor (gcc, libfuse3-dev) on the host.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd -P)
PROG=ab
ROUNDS=8 KINDS=simple-control,nested-control,rm-alloc GUEST='' BINS=() THREADS=1
while (($#)); do
  case $1 in
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    --kinds) KINDS=${2:?}; shift 2 ;;
    --threads) THREADS=${2:?}; shift 2 ;;
    --guest) GUEST=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    -*) echo "$PROG: unknown argument $1" >&2; exit 2 ;;
    *) BINS+=("$1"); shift ;;
  esac
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "$PROG: --rounds takes a positive number" >&2; exit 2; }
[[ $KINDS =~ ^[a-z-]+(,[a-z-]+)*$ ]] || { echo "$PROG: --kinds takes a comma-separated list" >&2; exit 2; }
[[ $THREADS =~ ^[1-9][0-9]*$ ]] || { echo "$PROG: --threads takes a positive number" >&2; exit 2; }
if [[ -n $GUEST ]]; then
  "$GUEST/cuse_samework" --name nvbench-samework --max-threads $((THREADS + 4)) >"$GUEST/samework.out" 2>&1 &
  for _ in $(seq 300); do grep -q '^READY' "$GUEST/samework.out" && break; sleep 0.1; done
  for r in $(seq "$ROUNDS"); do
    for kind in ${KINDS//,/ }; do
      for b in A B; do
        if ((THREADS == 1)); then
          line=$("$GUEST/nvproxy-$b" exec --driver sim --memory process-vm -- "$GUEST/nv-bench" "$kind" \
            --iters 100 --batches 5 --pair-samework /dev/nvbench-samework 2>/dev/null | grep '^RESULT' || true)
        else
          line=$("$GUEST/nvproxy-$b" exec --driver sim --memory process-vm -- "$GUEST/nv-bench" "$kind" \
            --threads "$THREADS" --ms 300 --rounds 1 --pair-samework /dev/nvbench-samework 2>/dev/null |
            grep '^SCALE_RESULT' || true)
        fi
        echo "AB round=$r kind=$kind build=$b ${line:-RESULT missing}"
      done
    done
  done
  exit 0
fi
((${#BINS[@]} == 2)) || { echo "$PROG: give two nvproxy binaries (A and B); --help for more" >&2; exit 2; }
for b in "${BINS[@]}"; do
  [[ -x $b ]] || { echo "$PROG: $b is not an executable file" >&2; exit 2; }
done
# shellcheck source=tests/bench/stage-floor.sh
source tests/bench/stage-floor.sh
stage_floor ab # sets $work; both builds go there too
cp "${BINS[0]}" "$work/nvproxy-A"
cp "${BINS[1]}" "$work/nvproxy-B"
out=$work/out
tests/vm/cuse-vm --smp 2 --mem 2G --timeout 3000 --rw "$work" -- bash "$ROOT/tests/bench/ab.sh" \
  --guest "$work" --rounds "$ROUNDS" --kinds "$KINDS" --threads "$THREADS" | tee "$out"
python3 - "$out" "${BINS[@]}" <<'PY'
import collections, re, statistics, sys
ratios = collections.defaultdict(list)
missing = 0
for line in open(sys.argv[1]):
    m = re.match(r"AB round=\d+ kind=(\S+) build=(\S) (.*)", line)
    if not m:
        continue
    v = re.search(r" (?:vs_samework|samework_over_kind)=([0-9.]+)", m.group(3))
    if v:
        ratios[(m.group(1), m.group(2))].append(float(v.group(1)))
    else:
        missing += 1
print(f"\nA = {sys.argv[2]}\nB = {sys.argv[3]}\nproxy ÷ same-work floor (per ioctl; with --threads: floor ÷ proxy throughput), median over rounds (lowest–highest):")
for kind in sorted({k for k, _ in ratios}):
    cells = []
    for b in "AB":
        r = ratios.get((kind, b), [])
        cells.append(f"{b} {statistics.median(r):.3f} ({min(r):.2f}–{max(r):.2f}, {len(r)} rounds)" if r else f"{b} —")
    print(f"  {kind:16} " + "   ".join(cells))
if missing:
    print(f"ab: {missing} runs gave no ratio (see the lines above)")
PY
