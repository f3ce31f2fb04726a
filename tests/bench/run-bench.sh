#!/usr/bin/env bash
# run-bench.sh: the frontend-proxy benchmark. µs per proxied ioctl (a simple control, a control
# with an embedded pointer, an RM_ALLOC + RM_FREE pair) through `nvproxy exec --driver sim` with
# both memory transports, against a minimal libfuse3 CUSE device doing the same number of CUSE
# round trips (tests/bench/cuse_floor.c) and against a plain ioctl on /dev/null, all measured in
# ONE VM run (tests/vm/cuse-vm; the guest is emulated, so only ratios inside one run mean much).
#
# Usage: tests/bench/run-bench.sh [--out FILE.md] [--iters N] [--batches B] [--smp N] [--no-proxy]
#   --out FILE   also write the results as a markdown table (for the README's performance section)
#   --iters N    ioctls (pairs for rm-alloc) per batch for the CUSE kinds (default 400; /dev/null
#                gets 50x as many); --batches B batches per kind (default 5; median reported)
#   --smp N      guest vCPUs (default 1, as in shared/reference/cuse-experiments.md 1e)
#   --no-proxy   measure only /dev/null and the C floor (skips building and running nvproxy)
# Environment: CARGO_TARGET_DIR as usual; CUSE_VM_* as documented in tests/vm/cuse-vm.
# Exit status: 0 when every requested measurement was taken, 1 otherwise (the table then shows
# what was measured and says what was not), 2 on usage errors.
#
# Builds on the host (cargo build --release of the daemon's `nvproxy` and of `nv-bench`, gcc for
# the floor device; installs libfuse3-dev and pkg-config with apt-get when missing, as root), then
# boots one VM that runs this script with --guest.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd -P)
PROG=run-bench

OUT= ITERS=400 BATCHES=5 SMP=1 PROXY=1 GUEST=0
while (($#)); do
  case $1 in
    --out) OUT=${2:?--out needs a file}; shift 2 ;;
    --iters) ITERS=${2:?--iters needs a number}; shift 2 ;;
    --batches) BATCHES=${2:?--batches needs a number}; shift 2 ;;
    --smp) SMP=${2:?--smp needs a number}; shift 2 ;;
    --no-proxy) PROXY=0; shift ;;
    --guest) GUEST=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "$PROG: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $ITERS =~ ^[1-9][0-9]*$ && $BATCHES =~ ^[1-9][0-9]*$ && $SMP =~ ^[1-9][0-9]*$ ]] ||
  { echo "$PROG: --iters, --batches and --smp take positive numbers" >&2; exit 2; }

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[[ $TARGET == /* ]] || TARGET=$ROOT/$TARGET
BIN=$TARGET/release
FLOOR=$TARGET/bench/cuse_floor

# ------------------------------------------------------------------------------------------ guest
# Prints one line per measurement: "ROW <label> RESULT kind=... median_us=..." or
# "FAIL <label> <why>", plus "KERNEL <uname -r>" and "CPUS <n>".
if [[ $GUEST == 1 ]]; then
  echo "KERNEL $(uname -r)"
  echo "CPUS $(nproc)"
  tmp=$(mktemp -d)
  bench() { # LABEL CMD...
    local label=$1 status=0
    shift
    "$@" >"$tmp/out" || status=$?
    if ((status == 0)) && grep -q '^RESULT ' "$tmp/out"; then
      echo "ROW $label $(grep -m1 '^RESULT ' "$tmp/out")"
    else
      echo "FAIL $label: exit status $status from: ${*##*/}"
    fi
  }
  floor_set() { # PASS
    bench "$1:null" "$BIN/nv-bench" null --iters $((ITERS * 50)) --batches "$BATCHES"
    for n in 1 2 3 4; do
      bench "$1:floor$n" "$BIN/nv-bench" "floor$n" --iters "$ITERS" --batches "$BATCHES"
    done
  }

  "$FLOOR" --name nvbench-floor >"$tmp/floor.out" 2>"$tmp/floor.err" &
  floor_pid=$!
  for _ in $(seq 300); do
    grep -q '^READY' "$tmp/floor.out" 2>/dev/null && break
    kill -0 "$floor_pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q '^READY' "$tmp/floor.out"; then
    echo "FAIL A:floor the C floor device did not start: $(tr '\n' ' ' <"$tmp/floor.err")"
  else
    floor_set A
  fi

  if [[ $PROXY == 1 ]]; then
    for mem in process-vm retry; do
      for kind in simple-control nested-control rm-alloc; do
        # nvproxy's log goes to stderr (shown live); nv-bench's RESULT line to stdout.
        bench "$mem:$kind" "$BIN/nvproxy" exec --driver sim --memory "$mem" -- \
          "$BIN/nv-bench" "$kind" --iters "$ITERS" --batches "$BATCHES"
      done
    done
    # The floor again after the proxy runs, to show how much the VM drifted meanwhile.
    grep -q '^READY' "$tmp/floor.out" && floor_set B
  fi
  kill "$floor_pid" 2>/dev/null || true
  wait "$floor_pid" 2>/dev/null || true
  exit 0
fi

# ------------------------------------------------------------------------------------------- host
step() { printf '%s: %s\n' "$PROG" "$*" >&2; }
export CARGO_TARGET_DIR=$TARGET

if ! command -v gcc >/dev/null || ! pkg-config --exists fuse3 2>/dev/null; then
  step "installing gcc, libfuse3-dev and pkg-config"
  [[ $(id -u) == 0 ]] || { echo "$PROG: need root to apt-get install libfuse3-dev pkg-config gcc" >&2; exit 1; }
  apt-get install -y -qq gcc libfuse3-dev pkg-config >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq gcc libfuse3-dev pkg-config; }
fi
mkdir -p "$TARGET/bench"
step "gcc cuse_floor.c"
# shellcheck disable=SC2046  # pkg-config prints several words on purpose
gcc -O2 -Wall -Wextra -o "$FLOOR" tests/bench/cuse_floor.c $(pkg-config --cflags --libs fuse3)

step "cargo build --release nv-bench"
cargo build --release -q -p tests --bin nv-bench
not_measured=()
if [[ $PROXY == 1 ]]; then
  step "cargo build --release nvproxy"
  if ! cargo build --release -q -p daemon --bin nvproxy; then
    not_measured+=("the proxied kinds: the daemon did not build")
    PROXY=0
  elif ! "$BIN/nvproxy" exec --help >/dev/null 2>&1; then
    not_measured+=("the proxied kinds: this nvproxy has no 'exec' subcommand yet")
    PROXY=0
  fi
fi

raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
step "one VM: floor, null$( ((PROXY)) && echo ', nvproxy exec (process-vm, retry)')"
vm_args=(--smp "$SMP" --timeout 3000)
vm_status=0
tests/vm/cuse-vm "${vm_args[@]}" -- bash "$ROOT/tests/bench/run-bench.sh" --guest \
  --iters "$ITERS" --batches "$BATCHES" $( ((PROXY)) || echo --no-proxy) | tee "$raw" || vm_status=$?
((vm_status == 0)) || not_measured+=("the VM run ended with status $vm_status")

# ------------------------------------------------------------------------------- table (host)
NOT_MEASURED=$(printf '%s\n' "${not_measured[@]}") PROXY=$PROXY SMP=$SMP \
python3 - "$raw" "$OUT" <<'PY'
import os, re, sys

raw, out = sys.argv[1], sys.argv[2]
rows, fails, kernel, cpus = {}, [], "?", "?"
for line in open(raw):
    line = line.rstrip("\n")
    if line.startswith("KERNEL "): kernel = line[7:]
    elif line.startswith("CPUS "): cpus = line[5:]
    elif line.startswith("FAIL "): fails.append(line[5:])
    elif line.startswith("ROW "):
        label, rest = line[4:].split(" ", 1)
        kv = dict(re.findall(r"(\w+)=(\S+)", rest))
        rows[label] = kv
not_measured = [l for l in os.environ.get("NOT_MEASURED", "").split("\n") if l]
not_measured += fails

def us(label):
    r = rows.get(label)
    return float(r["median_us"]) if r else None

def floor(name):
    """The floor kind's µs: the mean of the medians of pass A and pass B (B only with the proxy)."""
    vals = [v for v in (us("A:" + name), us("B:" + name)) if v is not None]
    return sum(vals) / len(vals) if vals else None

def measured_rounds(label):
    """CUSE round trips per ioctl, as the servers' read syscalls per ioctl (/proc/PID/io)."""
    v = rows.get(label, {}).get("server_reads_per_ioctl", "na")
    return None if v == "na" else float(v)

null = floor("null")
F = {n: floor(f"floor{n}") for n in (1, 2, 3, 4)}

def floor_at(r):
    """The C floor's µs for r round trips: floorN, or between two floors for a fractional r
    (an alloc+free pair of 3 and 2 rounds averages 2.5), extrapolated past floor4."""
    if r is None or r < 0.95:
        return None
    lo = min(int(r + 0.05), 4)
    if abs(r - round(r)) <= 0.05 and round(r) <= 4:
        return F.get(round(r))
    if lo >= 4:
        return None if F[4] is None or F[3] is None else F[4] + (r - 4) * (F[4] - F[3])
    if F.get(lo) is None or F.get(lo + 1) is None:
        return None
    return F[lo] + (r - lo) * (F[lo + 1] - F[lo])

# (label, kind, path, expected round trips, how they arise)
spec = [("A:null", "null (`/dev/null`, unknown cmd → ENOTTY)", "syscall only", 0, "")]
for n in (1, 2, 3, 4):
    spec.append((f"A:floor{n}", f"floor{n}", "C device, libfuse3 mt loop", n, ""))
spec += [
    ("process-vm:simple-control", "simple-control", "nvproxy, process-vm", 1,
     "one CUSE round; the daemon reads NVOS54 and the params with process_vm_readv and writes them back with process_vm_writev"),
    ("process-vm:nested-control", "nested-control", "nvproxy, process-vm", 1,
     "one CUSE round; NVOS54, the params and the embedded class list all through process_vm_readv/writev"),
    ("process-vm:rm-alloc", "rm-alloc (alloc+free, per ioctl)", "nvproxy, process-vm", 1,
     "one CUSE round each for RM_ALLOC and RM_FREE"),
    ("retry:simple-control", "simple-control", "nvproxy, retry", 3,
     "FUSE_IOCTL_RETRY: no data → NVOS54 → + params → reply"),
    ("retry:nested-control", "nested-control", "nvproxy, retry", 4,
     "FUSE_IOCTL_RETRY: no data → NVOS54 → + params → + the embedded list → reply"),
    ("retry:rm-alloc", "rm-alloc (alloc+free, per ioctl)", "nvproxy, retry", 2.5,
     "FUSE_IOCTL_RETRY: RM_ALLOC no data → NVOS64 → + alloc params → reply (3), RM_FREE no data → NVOS00 → reply (2); "
     "a fractional count is compared with the floor interpolated between its neighbours"),
]

def fmt(x, nd=1): return "—" if x is None else f"{x:.{nd}f}"
table = ["| kind | path | µs/ioctl (median) | mean | CUSE round trips / ioctl (expected; measured) | C floor, same round trips (µs) | vs C floor | vs /dev/null |",
         "|---|---|---:|---:|---:|---:|---:|---:|"]
goal = []
for label, kind, path, expected, why in spec:
    r = rows.get(label)
    proxied = label.startswith(("process-vm", "retry"))
    if r is None:
        if proxied and os.environ.get("PROXY") != "1":
            continue
        table.append(f"| {kind} | {path} | not measured | | {expected:g} | | | |")
        continue
    med, mean = float(r["median_us"]), float(r["mean_us"])
    if label.startswith("A:"):
        med = floor(label[2:])  # both passes
    m = measured_rounds(label)
    rounds = m if m is not None else expected
    fl = floor_at(rounds) if expected else None
    ratio_f = med / fl if fl else None
    ratio_n = med / null if null else None
    rt = f"{expected:g}; {fmt(m, 2)}" if expected else "0"
    table.append(f"| {kind} | {path} | {fmt(med)} | {fmt(mean)} | {rt} | {fmt(fl)} | "
                 f"{fmt(ratio_f, 2) + '×' if ratio_f else '—'} | {fmt(ratio_n, 0) + '×' if ratio_n else '—'} |")
    if proxied and ratio_f:
        mism = "" if m is None or abs(m - expected) < 0.05 else f" (measured {m:.2f} round trips, expected {expected:g})"
        goal.append(f"- {path.split(', ')[1]} {kind}: {ratio_f:.2f}× the C floor at {rounds:g} round trips{mism} — "
                    f"{'within' if ratio_f <= 1.25 else 'NOT within'} the 1.25× goal. Rounds: {why}.")
        det = r.get("detail", "")
        if det:
            goal.append(f"  (measured: {det})")

notes = [f"Guest kernel {kernel}, {cpus} vCPU(s), QEMU TCG (software emulation): guest code runs 10–50× slower "
         "than native, so only the ratios inside this one run mean much."]
if "B:floor1" in rows:
    drift = ", ".join(f"floor{n} {us(f'A:floor{n}'):.1f} → {us(f'B:floor{n}'):.1f}"
                      for n in (1, 2, 3, 4) if us(f"A:floor{n}") and us(f"B:floor{n}"))
    notes.append(f"The floor ran before and after the proxied kinds (µs, before → after: {drift}); "
                 "the table uses the mean of the two.")
notes.append("Round trips: with `--memory process-vm` a proxied ioctl should be 1 CUSE round trip plus "
             "process_vm_readv/writev syscalls in the daemon, so it is compared with floor1. With "
             "`--memory retry` the daemon fetches the caller's memory through FUSE_IOCTL_RETRY, a round "
             "per level of pointers, so it is compared with the floor doing the same number of rounds. "
             "\"measured\" is the CUSE servers' read syscalls per ioctl (/proc/PID/io `syscr` of every "
             "process holding /dev/cuse, one request read per round trip); the floor column uses the "
             "measured count where there is one.")
report = ["## Frontend proxy: µs per proxied ioctl", "", *table, "", *notes]
if goal:
    report += ["", "Goal (within 1.25× of the C device doing the same round trips):", *goal]
if os.environ.get("PROXY") != "1" and not not_measured:
    report += ["", "The proxied kinds were skipped (--no-proxy)."]
if not_measured:
    report += ["", "Not measured:", *[f"- {m}" for m in not_measured]]
text = "\n".join(report) + "\n"
print("\n" + text)
if out:
    with open(out, "w") as f:
        f.write(text)
    print(f"run-bench: wrote {out}", file=sys.stderr)
sys.exit(1 if not_measured else 0)
PY
