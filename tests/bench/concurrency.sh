#!/usr/bin/env bash
# concurrency.sh: the concurrency sweep of the frontend-proxy benchmark. For each number of
# concurrent clients (threads, each with its own opens and its own RM client), the throughput of
# a kind (default: the simple control) through `nvproxy exec --driver sim --memory process-vm`
# against the same-work floor (tests/bench/cuse_samework.c: the same restricted CUSE round trip
# and the same process_vm_readv/writev calls, fixed answers) at the same concurrency, in ONE VM
# run with 2 vCPUs. Prints a table of ioctls/s of each and the ratio (floor ÷ proxy: how many
# times the proxy's cost per ioctl at that concurrency; the goal is ≤ 1.25×).
#
# Usage: tests/bench/concurrency.sh [--out FILE.md] [--threads 1,2,4,8,16] [--ms D] [--rounds R]
#                                   [--smp N] [--kind KIND] [--short]
#   --threads LIST  concurrent clients per step (default 1,2,4,8,16)
#   --ms D          milliseconds per timed phase (default 300)
#   --rounds R      proxy/floor phase pairs per step, alternating (default 15); the ratio is taken
#                   inside each round, the table gives medians and the lowest and highest ratio
#   --smp N         guest vCPUs (default 2)
#   --kind KIND     simple-control (default), nested-control or rm-alloc
#   --short         the bounded form for CI: --threads 1,4,16 --ms 500 --rounds 3
#   --out FILE      also write the table as markdown
# Exit status: 0 when every step was measured, 1 when a measurement could not be taken (never
# for a slow result), 2 on usage errors. Builds on the host as run-bench.sh does (root: may
# apt-get install gcc, libfuse3-dev, pkg-config).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd -P)
source tests/bench/build-nvproxy.sh
PROG=concurrency

OUT='' THREADS=1,2,4,8,16 MS=300 ROUNDS=15 SMP=2 KIND=simple-control GUEST=0
while (($#)); do
  case $1 in
    --out) OUT=${2:?--out needs a file}; shift 2 ;;
    --threads) THREADS=${2:?--threads needs a list}; shift 2 ;;
    --ms) MS=${2:?--ms needs a number}; shift 2 ;;
    --rounds) ROUNDS=${2:?--rounds needs a number}; shift 2 ;;
    --smp) SMP=${2:?--smp needs a number}; shift 2 ;;
    --kind) KIND=${2:?--kind needs a kind}; shift 2 ;;
    --short) THREADS=1,4,16 MS=500 ROUNDS=3; shift ;;
    --guest) GUEST=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "$PROG: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for v in "$MS" "$ROUNDS" "$SMP"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "$PROG: --ms, --rounds and --smp take positive numbers" >&2; exit 2; }
done
[[ $THREADS =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "$PROG: --threads takes a list like 1,2,4" >&2; exit 2; }
case $KIND in simple-control|nested-control|rm-alloc) ;; *) echo "$PROG: unknown --kind $KIND" >&2; exit 2 ;; esac
[[ -z $OUT || $OUT == /* ]] || OUT=$PWD/$OUT

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[[ $TARGET == /* ]] || TARGET=$ROOT/$TARGET
BIN=$TARGET/release
NVPROXY=${NVPROXY:-$BIN/nvproxy} # build_nvproxy sets it (tests/bench/build-nvproxy.sh)
SAMEWORK=$TARGET/bench/cuse_samework
MAXT=$(tr ',' '\n' <<<"$THREADS" | sort -n | tail -1)

# ------------------------------------------------------------------------------------------ guest
# Runs the sweep once inside nvproxy exec (the same-work floor's node is visible there) and
# prints nv-bench's SCALE/SCALE_RESULT lines, "KERNEL", "CPUS", or "FAIL <why>".
if [[ $GUEST == 1 ]]; then
  echo "KERNEL $(uname -r)"
  echo "CPUS $(nproc)"
  tmp=$(mktemp -d)
  # The floor may run as many handlers at once as there are clients (libfuse's default is 10;
  # nvproxy's nodes allow 128).
  "$SAMEWORK" --name nvbench-samework --max-threads $((MAXT + 4)) >"$tmp/sw.out" 2>"$tmp/sw.err" &
  sw_pid=$!
  for _ in $(seq 300); do
    grep -q '^READY' "$tmp/sw.out" 2>/dev/null && break
    kill -0 "$sw_pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q '^READY' "$tmp/sw.out"; then
    echo "FAIL the same-work floor did not start: $(tr '\n' ' ' <"$tmp/sw.err")"
    exit 0
  fi
  status=0
  "$NVPROXY" exec --driver sim --memory process-vm -- \
    "$BIN/nv-bench" "$KIND" --threads "$THREADS" --ms "$MS" --rounds "$ROUNDS" \
    --pair-samework /dev/nvbench-samework || status=$?
  ((status == 0)) || echo "FAIL nvproxy exec nv-bench --threads: exit status $status"
  kill "$sw_pid" 2>/dev/null || true
  wait "$sw_pid" 2>/dev/null || true
  exit 0
fi

# ------------------------------------------------------------------------------------------- host
step() { printf '%s: %s\n' "$PROG" "$*" >&2; }
export CARGO_TARGET_DIR=$TARGET
if ! command -v gcc >/dev/null || ! pkg-config --exists fuse3 2>/dev/null; then
  step "installing gcc, libfuse3-dev and pkg-config"
  [[ $(id -u) == 0 ]] || { echo "$PROG: need root to apt-get install gcc libfuse3-dev pkg-config" >&2; exit 1; }
  apt-get install -y -qq gcc libfuse3-dev pkg-config >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq gcc libfuse3-dev pkg-config; }
fi
mkdir -p "$TARGET/bench"
step "gcc cuse_samework.c"
# shellcheck disable=SC2046  # pkg-config prints several words on purpose
gcc -O2 -Wall -Wextra -o "$SAMEWORK" tests/bench/cuse_samework.c $(pkg-config --cflags --libs fuse3)
step "cargo build --release nv-bench nvproxy"
not_measured=()
if ! cargo build --release -q -p tests --bin nv-bench || ! build_nvproxy --vm; then
  echo "$PROG: the build failed; nothing measured" >&2
  exit 1
fi

raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
step "one VM ($SMP vCPUs): $KIND, threads $THREADS, $ROUNDS × ($MS ms proxy + $MS ms same-work floor) per step"
vm_status=0
tests/vm/cuse-vm --smp "$SMP" --mem 2G --timeout 3000 -- bash "$ROOT/tests/bench/concurrency.sh" --guest \
  --threads "$THREADS" --ms "$MS" --rounds "$ROUNDS" --kind "$KIND" | tee "$raw" || vm_status=$?
((vm_status == 0)) || not_measured+=("the VM run ended with status $vm_status")

NOT_MEASURED=$(printf '%s\n' "${not_measured[@]}") THREADS=$THREADS MS=$MS ROUNDS=$ROUNDS KIND=$KIND \
python3 - "$raw" "$OUT" <<'PY'
import os, re, sys

raw, out = sys.argv[1], sys.argv[2]
want = [int(t) for t in os.environ["THREADS"].split(",")]
res, fails, kernel, cpus = {}, [], "?", "?"
for line in open(raw):
    line = line.rstrip("\n")
    if line.startswith("KERNEL "): kernel = line[7:]
    elif line.startswith("CPUS "): cpus = line[5:]
    elif line.startswith("FAIL "): fails.append(line[5:])
    elif line.startswith("SCALE_RESULT "):
        d = dict(re.findall(r"(\w+)=(\S+)", line))
        res[int(d["threads"])] = d
not_measured = [l for l in os.environ.get("NOT_MEASURED", "").split("\n") if l] + fails

def num(d, k):
    v = d.get(k, "na")
    return None if v == "na" else float(v)

kind = os.environ["KIND"]
rows = [f"| concurrent clients | nvproxy process-vm, {kind} (ioctls/s) | same-work floor (ioctls/s) | "
        "**floor ÷ proxy** (lowest–highest round) | best round: proxy / floor (ioctls/s) | best ÷ best | "
        "proxy scaling vs 1 client | floor scaling vs 1 client |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|"]
base = res.get(min(want), {}) if want else {}
for t in want:
    d = res.get(t)
    if d is None:
        rows.append(f"| {t} | not measured | | | | | | |")
        not_measured.append(f"{t} clients: no result") if not fails else None
        continue
    p, f, r = num(d, "ops_s"), num(d, "samework_ops_s"), num(d, "samework_over_kind")
    lo, hi = num(d, "samework_over_kind_min"), num(d, "samework_over_kind_max")
    bp, bf = num(base, "ops_s"), num(base, "samework_ops_s")
    xp, xf = num(d, "best_ops_s"), num(d, "best_samework_ops_s")
    fmt = lambda x, nd=0: "—" if x is None else f"{x:,.{nd}f}"
    rows.append(f"| {t} | {fmt(p)} | {fmt(f)} | {fmt(r, 2)}× ({fmt(lo, 2)}–{fmt(hi, 2)}) | "
                f"{fmt(xp)} / {fmt(xf)} | {fmt(xf / xp if xp and xf else None, 2)}× | "
                f"{fmt(p / bp if p and bp else None, 2)}× | {fmt(f / bf if f and bf else None, 2)}× |")
notes = [
    f"Guest kernel {kernel}, {cpus} vCPU(s), QEMU TCG, one VM run. Each step: that many client threads, each "
    "with its own open of `/dev/nvidiactl` and its own root client (and its own open of the floor), set up "
    f"before timing; then {os.environ['ROUNDS']} rounds of {os.environ['MS']} ms with all threads calling the "
    f"proxy as fast as they can, followed by {os.environ['MS']} ms with the same threads calling the same-work "
    "floor with the same ioctls and bytes. Throughput: ioctls of all threads ÷ wall time of the phase, median "
    "over the rounds; the ratio is taken inside each round (floor's throughput ÷ the proxy's: how many times "
    "the proxy's cost per ioctl at that concurrency; goal ≤ 1.25×). Best round: the fastest round of each "
    "side, the least disturbed by the host (with 2 vCPUs on a loaded 2-core host the rounds are bimodal, "
    "about 250 or about 3,000 ioctls/s for one client: most likely a hand-off between the vCPUs waiting for a host core).",
]
report = [f"## Concurrency sweep: {kind}, ioctls/s", "", *rows, "", *notes]
if not_measured:
    report += ["", "Not measured:", *[f"- {m}" for m in not_measured]]
text = "\n".join(report) + "\n"
print("\n" + text)
if out:
    with open(out, "w") as fh:
        fh.write(text)
    print(f"concurrency: wrote {out}", file=sys.stderr)
sys.exit(1 if not_measured else 0)
PY
