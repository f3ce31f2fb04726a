#!/usr/bin/env bash
# e2e.sh: CUDA's start-up end to end through nvproxy, on both transports. NVIDIA's libcuda
# (Debian's userspace, tests/nvidia-userspace/fetch.sh) runs `cuda-probe init ctx` (cuInit and
# the device queries, then cuCtxCreate and cuMemGetInfo) under
#   nvproxy exec --driver sim --transport socket   natively, and
#   nvproxy exec --driver sim --transport cuse     in the VM (tests/vm/cuse-vm, 2 vCPUs),
# release builds. Per transport: the time and the NVIDIA ioctls of each step (median, lowest,
# highest of --runs), then --profiles runs under `perf record --call-graph dwarf` whose samples
# e2e-split.py charges to the client, the proxy (our request path, transports and shim), the
# simulated driver and nvproxy's start-up: a profile, not a guess. Never fails on a slow result.
#
# Usage: tests/bench/e2e.sh [--runs N] [--profiles P] [--userspace VERSION] [--out FILE.md]
#                           [--no-vm] [--no-perf]
#   --runs N        timed runs per transport (default 5)
#   --profiles P    profiled runs per transport (default 3; the split varies run to run)
#   --userspace V   NVIDIA userspace version (default 535.261.03; fetched when missing)
#   --no-vm         only the socket transport (natively); --no-perf: no profiles
# Needs root, perf (linux-perf; installed with apt-get when missing), and for the VM part what
# tests/vm/cuse-vm needs. Raw outputs go to target/bench/e2e/.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd -P)
source tests/bench/build-nvproxy.sh
PROG=e2e
RUNS=5 V=535.261.03 OUT='' VM=1 GUEST=''
FREQ=4000 # perf samples per second: natively; the VM uses 1000 (TCG)
PROFILES=3
while (($#)); do
  case $1 in
    --runs) RUNS=${2:?}; shift 2 ;;
    --userspace) V=${2:?}; shift 2 ;;
    --out) OUT=${2:?}; shift 2 ;;
    --no-vm) VM=0; shift ;;
    --no-perf) PROFILES=0; shift ;;
    --profiles) PROFILES=${2:?}; shift 2 ;;
    --guest) GUEST=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "$PROG: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $RUNS =~ ^[1-9][0-9]*$ && $PROFILES =~ ^[0-9]+$ ]] ||
  { echo "$PROG: --runs takes a positive number, --profiles a number" >&2; exit 2; }
[[ -z $OUT || $OUT == /* ]] || OUT=$PWD/$OUT
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[[ $TARGET == /* ]] || TARGET=$ROOT/$TARGET
BIN=$TARGET/release
NVPROXY=${NVPROXY:-$BIN/nvproxy} # build_nvproxy sets it (tests/bench/build-nvproxy.sh)
LIB=$TARGET/nvidia-userspace/$V/lib
DIR=$TARGET/bench/e2e
step() { printf '%s: %s\n' "$PROG" "$*" >&2; }

# One transport: RUNS timed runs, then a profiled one. Prints RUN and SPLIT lines.
measure() { # TRANSPORT
  local t=$1 scratch i
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/nvproxy-e2e.XXXXXX")
  run_probe() {
    "$@" "$NVPROXY" --run-dir "$scratch/run" exec --driver sim --transport "$t" \
      --sim-driver-version "$V" -- env LD_LIBRARY_PATH="$LIB" "$BIN/cuda-probe" init ctx
  }
  for i in $(seq "$RUNS"); do
    run_probe >"$DIR/$t.$i.json" 2>"$DIR/$t.$i.err" || step "$t run $i failed (see $DIR/$t.$i.err)"
    python3 - "$t" "$DIR/$t.$i.json" <<'EOF'
import json, sys
t, path = sys.argv[1], sys.argv[2]
for line in open(path):
    try:
        j = json.loads(line)
    except ValueError:
        continue
    s = {x["step"]: x for x in j.get("steps", [])}
    if j.get("ok") and "init" in s and "ctx" in s:
        print("RUN transport=%s init_ms=%.1f init_ioctls=%d ctx_ms=%.1f ctx_ioctls=%d" % (
            t, s["init"]["ms"], s["init"]["ioctls"], s["ctx"]["ms"], s["ctx"]["ioctls"]))
EOF
  done
  for i in $(seq "$PROFILES"); do
    run_probe perf record -q -F "$FREQ" --call-graph dwarf,16384 -o "$DIR/$t.perf.$i.data" -- \
      >/dev/null 2>"$DIR/$t.perf.$i.err" || step "$t: profiled run $i failed (see $DIR/$t.perf.$i.err)"
  done
  rm -rf "$scratch"
}

if [[ -n $GUEST ]]; then
  FREQ=1000
  mkdir -p "$DIR"
  measure "$GUEST"
  exit 0
fi

command -v perf >/dev/null || ((!PROFILES)) || apt-get install -y -qq linux-perf >/dev/null
[[ -d $LIB ]] || tests/nvidia-userspace/fetch.sh "$V"
export CARGO_TARGET_DIR=$TARGET
step "cargo build --release nvproxy, the shim, cuda-probe"
if ! build_nvproxy $( ((VM)) && echo --vm) || ! cargo build --release -q -p preload ||
   ! cargo build --release -q -p tests --bin cuda-probe; then
  echo "$PROG: the build failed; nothing measured" >&2
  exit 1
fi
rm -rf "$DIR" && mkdir -p "$DIR"
step "socket transport, natively: $RUNS runs + $PROFILES profiled"
measure socket | tee "$DIR/socket.txt"
if ((VM)); then
  step "CUSE, in the VM (2 vCPUs): $RUNS runs + $PROFILES profiled"
  tests/vm/cuse-vm --smp 2 --mem 2G --timeout 3000 -- bash "$ROOT/tests/bench/e2e.sh" \
    --guest cuse --runs "$RUNS" --profiles "$PROFILES" --userspace "$V" | tee "$DIR/cuse.txt"
fi
for t in socket cuse; do
  for i in $(seq "$PROFILES"); do
    [[ -s $DIR/$t.perf.$i.data ]] || continue
    # Symbols are resolved here, on the host (the guest runs the host's binaries); the guest's
    # kernel frames stay addresses, which is enough: samples are charged by user frames.
    perf script -i "$DIR/$t.perf.$i.data" -F comm,tid,ip,sym,dso 2>/dev/null >"$DIR/$t.perf.$i.txt" || true
    echo "$(python3 tests/bench/e2e-split.py "$DIR/$t.perf.$i.txt") transport=$t" | tee -a "$DIR/$t.txt"
  done
done

python3 - "$DIR" "$V" "$RUNS" "$OUT" <<'EOF'
import re, statistics, sys
d, v, runs, out = sys.argv[1:5]
rows = []
for t, how in (("socket", "natively"), ("cuse", "in the VM, TCG, 2 vCPUs")):
    try:
        text = open(f"{d}/{t}.txt").read()
    except OSError:
        continue
    runs_ = [dict(kv.split("=") for kv in l.split()[1:]) for l in text.splitlines() if l.startswith("RUN ")]
    splits = [dict(kv.split("=") for kv in l.split()[1:]) for l in text.splitlines() if l.startswith("SPLIT ")]
    if not runs_:
        rows.append(f"| {t} ({how}) | no run succeeded | | | | |")
        continue
    def med(k):
        xs = sorted(float(r[k]) for r in runs_)
        return f"{statistics.median(xs):.0f} ({xs[0]:.0f}–{xs[-1]:.0f})"
    def count(k):
        xs = sorted(int(r[k]) for r in runs_)
        return f"{statistics.median(xs):.0f}" + (f" ({xs[0]}–{xs[-1]})" if xs[0] != xs[-1] else "")
    n_init, n_ctx = count("init_ioctls"), count("ctx_ioctls")
    per = statistics.median(float(r["ctx_ms"]) * 1000 / int(r["ctx_ioctls"]) for r in runs_)
    if splits:
        def pct(p):
            xs = sorted(float(s[p]) * 100 for s in splits)
            return f"{statistics.median(xs):.0f} %" + (f" ({xs[0]:.0f}–{xs[-1]:.0f})" if len(xs) > 1 else "")
        share = " / ".join(pct(p) for p in ("client", "proxy", "driver", "startup"))
        share += f"; {len(splits)} × ~{statistics.median(int(s['samples']) for s in splits):.0f} samples"
    else:
        share = "not profiled"
    rows.append(f"| {t} ({how}) | {med('init_ms')} ms, {n_init} ioctls | {med('ctx_ms')} ms, {n_ctx} ioctls | {per:.0f} | {share} |")
table = "\n".join([
    f"`cuda-probe init ctx`, NVIDIA's {v} libcuda, release build, {runs} runs per transport "
    "(median, lowest–highest); the split is one profiled run's samples, whole run "
    "(client / proxy / simulated driver / nvproxy start-up; the rest is other processes).",
    "",
    "| transport | cuInit + device queries | cuCtxCreate + cuMemGetInfo | µs per ctx ioctl | client / proxy / driver / start-up |",
    "|---|---|---|---:|---|",
    *rows,
])
print(table)
if out:
    open(out, "w").write(table + "\n")
EOF
