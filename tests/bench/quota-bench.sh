#!/usr/bin/env bash
# quota-bench.sh: what a GPU memory quota costs on the ioctl path, natively (no VM). The
# guarded path, video memory allocated and freed (nv-bench vidmem-alloc: RM_ALLOC of 2 MiB of
# NV01_MEMORY_LOCAL_USER + RM_FREE), through
#   nvproxy exec --driver sim --transport socket [--gpu-memory 70GiB] -- nv-bench vidmem-alloc
# without and with a quota (large enough never to refuse), alternating run by run in this one
# run: only ratios taken in one run mean anything on a shared host. Prints µs per ioctl and
# quota ÷ none per repetition's pair (the median and the range).
#
# Usage: tests/bench/quota-bench.sh [--out FILE.md] [--reps R] [--iters N] [--batches B] [--short]
#   --reps R   (none, quota) alternations (default 7); --iters N ioctls per batch (2000);
#   --batches B batches per run (5); --short: the bounded form for CI (3 reps, 500 × 3)
# Exit status: 0 when everything was measured (never fails on a slow result), 1 when a
# measurement could not be taken, 2 on usage errors. Needs root (nvproxy exec).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd -P)
source tests/bench/build-nvproxy.sh
PROG=quota-bench

OUT='' REPS=7 ITERS=2000 BATCHES=5
while (($#)); do
  case $1 in
    --out) OUT=${2:?--out needs a file}; shift 2 ;;
    --reps) REPS=${2:?--reps needs a number}; shift 2 ;;
    --iters) ITERS=${2:?--iters needs a number}; shift 2 ;;
    --batches) BATCHES=${2:?--batches needs a number}; shift 2 ;;
    --short) REPS=3 ITERS=500 BATCHES=3; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "$PROG: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for v in "$REPS" "$ITERS" "$BATCHES"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "$PROG: --reps, --iters and --batches take positive numbers" >&2; exit 2; }
done
[[ -z $OUT || $OUT == /* ]] || OUT=$PWD/$OUT

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[[ $TARGET == /* ]] || TARGET=$ROOT/$TARGET
BIN=$TARGET/release
NVPROXY=${NVPROXY:-$BIN/nvproxy} # build_nvproxy sets it (tests/bench/build-nvproxy.sh)
step() { printf '%s: %s\n' "$PROG" "$*" >&2; }
export CARGO_TARGET_DIR=$TARGET
step "cargo build --release nv-bench nvproxy preload"
if ! cargo build --release -q -p tests --bin nv-bench || ! build_nvproxy ||
   ! cargo build --release -q -p preload; then
  echo "$PROG: the build failed; nothing measured" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
raw=$tmp/raw
run() {
  "$NVPROXY" exec --driver sim --transport socket "$@" -- "$BIN/nv-bench" vidmem-alloc \
    --iters "$ITERS" --batches "$BATCHES" --warmup 200 2>>"$tmp/err"
}
failed=0
step "$REPS × (no quota, quota), $BATCHES × $ITERS ioctls each"
for rep in $(seq "$REPS"); do
  if r=$(run); then echo "N $rep $r" >>"$raw"; else failed=1; fi
  if r=$(run --gpu-memory 70GiB); then echo "Q $rep $r" >>"$raw"; else failed=1; fi
done
((failed == 0)) || { echo "$PROG: some runs failed:" >&2; tail -20 "$tmp/err" >&2; }

python3 - "$raw" "$OUT" "$(uname -r)" "$(nproc)" <<'PY'
import re, statistics as st, sys
raw, out, kernel, cpus = sys.argv[1:5]
us = {}
for line in open(raw):
    side, rep, rest = line.split(" ", 2)
    kv = dict(re.findall(r"(\w+)=(\S+)", rest))
    if rest.startswith("RESULT"):
        us.setdefault(int(rep), {})[side] = float(kv["median_us"])
pairs = [p for p in us.values() if "N" in p and "Q" in p]
def med(side):
    v = [p[side] for p in us.values() if side in p]
    return f"{st.median(v):.1f}" if v else "—"
r = [p["Q"] / p["N"] for p in pairs]
ratio = f"{st.median(r):.2f}× ({min(r):.2f}–{max(r):.2f})" if r else "not measured"
lines = [f"GPU memory quota on the ioctl path, socket transport natively (kernel {kernel}, {cpus} CPUs); "
         f"{len(pairs)} pairs, medians (lowest–highest).", "",
         "| path | no quota µs/ioctl | quota µs/ioctl | quota ÷ none |", "|---|---|---|---|",
         f"| RM_ALLOC 2 MiB video memory + RM_FREE | {med('N')} | {med('Q')} | {ratio} |"]
text = "\n".join(lines)
print(text)
if out:
    open(out, "w").write(text + "\n")
PY
exit $failed
