#!/usr/bin/env bash
# socket-bench.sh: the socket transport against its same-work floor, natively (no VM). Per
# kind (simple control, nested control, RM_ALLOC+FREE), µs per ioctl of
#   nvproxy exec --driver sim --transport socket -- nv-bench KIND
# and of the same client calls (nv-bench samework-KIND, through the same shim) served by
# tests/bench/socket_samework.c (the shim's wire format, the same socket type, the worker's
# process_vm_* calls, fixed answers); then the throughput of 1-16 client threads (each with
# its own open and RM client) on each. Proxy and floor runs alternate, repetition by
# repetition, in this one run: only ratios taken in one run mean anything on a shared host.
# Then the same per-kind runs with every process on one CPU (taskset -c 0: the floor server,
# the daemon, the client), and simple control with the client on another CPU than its server.
# One client's round trip is decided by where the scheduler puts client and server: on one CPU
# it costs a context switch, on two a wake-up of an idle CPU, which on a VM whose idle CPUs halt
# costs tens of µs and swamps the request path; unpinned runs mix the two. The one-CPU table is
# what the request path costs; the two-CPU row what a cross-CPU wake-up costs.
# Prints tables (proxy ÷ floor: the goal is ≤ 1.25×); --out also writes them as markdown.
#
# Usage: tests/bench/socket-bench.sh [--out FILE.md] [--reps R] [--iters N] [--batches B]
#                                    [--threads 1,2,4,8,16] [--ms D] [--short]
#   --reps R       proxy/floor alternations per kind and for the sweep (default 7)
#   --iters N      ioctls per batch (default 2000); --batches B batches per run (default 5)
#   --threads LIST client threads per sweep step (default 1,2,4,8,16); --ms D ms per step (300)
#   --short        the bounded form for CI: --reps 3 --iters 500 --batches 3 --threads 1,4,16
# Exit status: 0 when everything was measured (never fails on a slow result), 1 when a
# measurement could not be taken, 2 on usage errors. Needs root (nvproxy exec), gcc.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd -P)
source tests/bench/build-nvproxy.sh
PROG=socket-bench

OUT='' REPS=7 ITERS=2000 BATCHES=5 THREADS=1,2,4,8,16 MS=300
while (($#)); do
  case $1 in
    --out) OUT=${2:?--out needs a file}; shift 2 ;;
    --reps) REPS=${2:?--reps needs a number}; shift 2 ;;
    --iters) ITERS=${2:?--iters needs a number}; shift 2 ;;
    --batches) BATCHES=${2:?--batches needs a number}; shift 2 ;;
    --threads) THREADS=${2:?--threads needs a list}; shift 2 ;;
    --ms) MS=${2:?--ms needs a number}; shift 2 ;;
    --short) REPS=3 ITERS=500 BATCHES=3 THREADS=1,4,16; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "$PROG: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for v in "$REPS" "$ITERS" "$BATCHES" "$MS"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "$PROG: --reps, --iters, --batches and --ms take positive numbers" >&2; exit 2; }
done
[[ $THREADS =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "$PROG: --threads takes a list like 1,2,4" >&2; exit 2; }
[[ -z $OUT || $OUT == /* ]] || OUT=$PWD/$OUT

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[[ $TARGET == /* ]] || TARGET=$ROOT/$TARGET
BIN=$TARGET/release
NVPROXY=${NVPROXY:-$BIN/nvproxy} # build_nvproxy sets it (tests/bench/build-nvproxy.sh)
FLOOR=$TARGET/bench/socket_samework
step() { printf '%s: %s\n' "$PROG" "$*" >&2; }

export CARGO_TARGET_DIR=$TARGET
mkdir -p "$TARGET/bench"
step "gcc socket_samework.c"
gcc -O2 -Wall -Wextra -pthread -o "$FLOOR" tests/bench/socket_samework.c
step "cargo build --release nv-bench nvproxy preload"
if ! cargo build --release -q -p tests --bin nv-bench || ! build_nvproxy ||
   ! cargo build --release -q -p preload; then
  echo "$PROG: the build failed; nothing measured" >&2
  exit 1
fi
SHIM=$BIN/libnvproxy_preload.so

tmp=$(mktemp -d)
floor_pid=''
cleanup() {
  if [[ -n $floor_pid ]]; then
    kill "$floor_pid" 2>/dev/null || true
    wait "$floor_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
sock=$tmp/floor.sock
"$FLOOR" --socket "$sock" >"$tmp/floor.out" 2>"$tmp/floor.err" &
floor_pid=$!
for _ in $(seq 100); do
  grep -q '^READY' "$tmp/floor.out" 2>/dev/null && break
  sleep 0.05
done
grep -q '^READY' "$tmp/floor.out" || { echo "$PROG: the floor did not start: $(cat "$tmp/floor.err")" >&2; exit 1; }

raw=$tmp/raw
proxy() { "$NVPROXY" exec --driver sim --transport socket -- "$BIN/nv-bench" "$@" 2>>"$tmp/err"; }
floor() {
  NVPROXY_DEV_SOCKET=$sock NVPROXY_DEV_GPUS=1 LD_PRELOAD=$SHIM "$BIN/nv-bench" "samework-$1" \
    --dev /dev/nvidiactl "${@:2}" 2>>"$tmp/err"
}
failed=0
step "$REPS × (proxy, floor) per kind, $BATCHES × $ITERS ioctls each"
for rep in $(seq "$REPS"); do
  for kind in simple-control nested-control rm-alloc; do
    a=(--iters "$ITERS" --batches "$BATCHES" --warmup 200)
    if r=$(proxy "$kind" "${a[@]}"); then echo "P $kind $rep $r" >>"$raw"; else failed=1; fi
    if r=$(floor "$kind" "${a[@]}"); then echo "F $kind $rep $r" >>"$raw"; else failed=1; fi
  done
done
step "$REPS × (proxy, floor) sweep: threads $THREADS, $MS ms each"
for rep in $(seq "$REPS"); do
  s=(--threads "$THREADS" --ms "$MS" --rounds 1 --warmup 10)
  if r=$(proxy simple-control "${s[@]}"); then sed "s/^/P sweep $rep /" <<<"$r" >>"$raw"; else failed=1; fi
  if r=$(floor simple-control "${s[@]}"); then sed "s/^/F sweep $rep /" <<<"$r" >>"$raw"; else failed=1; fi
done
# Pinned: the running floor server moves to CPU 0 (all its threads), the proxy's processes
# start there; the client runs on CPU 0 too (one CPU) or on CPU 1 (two CPUs, when there are).
last_cpu=$(($(nproc) - 1))
pin_floor() { taskset -a -p -c "$1" "$floor_pid" >/dev/null; }
pinned() { # CLIENT_CPU WHAT KIND
  local a=(--iters "$ITERS" --batches "$BATCHES" --warmup 200) r
  if r=$(taskset -c 0 "$NVPROXY" exec --driver sim --transport socket -- taskset -c "$1" \
    "$BIN/nv-bench" "$3" "${a[@]}" 2>>"$tmp/err"); then echo "P $2 $rep $r" >>"$raw"; else failed=1; fi
  if r=$(NVPROXY_DEV_SOCKET=$sock NVPROXY_DEV_GPUS=1 LD_PRELOAD=$SHIM taskset -c "$1" \
    "$BIN/nv-bench" "samework-$3" --dev /dev/nvidiactl "${a[@]}" 2>>"$tmp/err"); then
    echo "F $2 $rep $r" >>"$raw"
  else failed=1; fi
}
if pin_floor 0; then
  step "$REPS × (proxy, floor) per kind on one CPU; simple control across two CPUs"
  for rep in $(seq "$REPS"); do
    for kind in simple-control nested-control rm-alloc; do pinned 0 "cpu0:$kind" "$kind"; done
    ((last_cpu == 0)) || pinned "$last_cpu" "split:simple-control" simple-control
  done
  pin_floor "0-$last_cpu" || true
else
  echo "$PROG: taskset could not pin the floor server; no pinned runs" >&2
  failed=1
fi
((failed == 0)) || { echo "$PROG: some runs failed:" >&2; tail -20 "$tmp/err" >&2; }

THREADS=$THREADS python3 - "$raw" "$OUT" "$(uname -r)" "$(nproc)" <<'PY'
import os, re, statistics as st, sys
raw, out, kernel, cpus = sys.argv[1:5]
us, ops = {}, {}
for line in open(raw):
    side, what, rep, rest = line.split(" ", 3)
    kv = dict(re.findall(r"(\w+)=(\S+)", rest))
    if what != "sweep" and rest.startswith("RESULT"):
        us.setdefault(what, {}).setdefault(int(rep), {})[side] = float(kv["median_us"])
    elif what == "sweep" and rest.startswith("SCALE_RESULT"):
        ops.setdefault(int(kv["threads"]), {}).setdefault(int(rep), {})[side] = float(kv["ops_s"])
def summary(pairs, f):
    r = [f(p) for p in pairs.values() if "P" in p and "F" in p]
    if not r:
        return "not measured"
    return f"{st.median(r):.2f}× ({min(r):.2f}–{max(r):.2f})"
def med(pairs, side):
    v = [p[side] for p in pairs.values() if side in p]
    return f"{st.median(v):.1f}" if v else "—"
names = {"simple-control": "simple control", "nested-control": "nested control", "rm-alloc": "RM_ALLOC+FREE"}
lines = [f"Socket transport, natively (kernel {kernel}, {cpus} CPUs); medians over repetitions, (lowest–highest).", "",
         "| kind | proxy µs/ioctl | floor µs/ioctl | proxy ÷ floor |", "|---|---|---|---|"]
for k, n in names.items():
    p = us.get(k, {})
    lines.append(f"| {n} | {med(p, 'P')} | {med(p, 'F')} | {summary(p, lambda x: x['P'] / x['F'])} |")
lines += ["", "Pinned: every process on CPU 0 (what the request path costs), and simple control with",
          "the client on another CPU than its server (what a cross-CPU wake-up costs).", "",
          "| kind, placement | proxy µs/ioctl | floor µs/ioctl | proxy ÷ floor |", "|---|---|---|---|"]
for k, n in list(names.items()) + [("split", "simple control")]:
    what, where = (f"cpu0:{k}", "one CPU") if k != "split" else ("split:simple-control", "two CPUs")
    p = us.get(what, {})
    if p or k != "split":
        lines.append(f"| {n}, {where} | {med(p, 'P')} | {med(p, 'F')} | {summary(p, lambda x: x['P'] / x['F'])} |")
lines += ["", "| clients | proxy ioctls/s | floor ioctls/s | floor ÷ proxy |", "|---|---|---|---|"]
for t in [int(x) for x in os.environ["THREADS"].split(",")]:
    p = ops.get(t, {})
    lines.append(f"| {t} | {med(p, 'P')} | {med(p, 'F')} | {summary(p, lambda x: x['F'] / x['P'])} |")
text = "\n".join(lines)
print(text)
if out:
    open(out, "w").write(text + "\n")
PY
exit $failed
