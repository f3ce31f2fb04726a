#!/usr/bin/env bash
# run-bench.sh: the frontend-proxy benchmark. µs per proxied ioctl (a simple control, a control
# with an embedded pointer, an RM_ALLOC + RM_FREE pair) through `nvproxy exec --driver sim` with
# both memory transports, against a minimal libfuse3 CUSE device doing the same number of CUSE
# round trips (tests/bench/cuse_floor.c), against a C device doing the same kernel work as the
# proxy with process-vm (tests/bench/cuse_samework.c: the same restricted round trip and the same
# process_vm_readv/writev calls, fixed answers) and against a plain ioctl on /dev/null, all
# measured in ONE VM run (tests/vm/cuse-vm; the guest is emulated, so only ratios inside one run
# mean much).
# For diagnosis it also times the same 1-4 round trips served by our own CUSE library (the
# cuse-example device on cuse-dev), which splits the proxy's overhead into library and handler.
#
# Usage: tests/bench/run-bench.sh [--out FILE.md] [--reps R] [--iters N] [--batches B] [--smp N] [--no-proxy]
#   --out FILE   also write the results as a markdown table (for docs/performance.md)
#   --reps R     repetitions (default 5). Each repetition measures every kind once, one after the
#                other, so that a slow patch of the (noisy, emulated) machine hits all kinds alike;
#                ratios are taken inside each repetition and the median over repetitions reported
#   --iters N    ioctls (pairs for rm-alloc) per batch (default 100; /dev/null gets 50x as many)
#   --batches B  batches per kind and repetition (default 5; nv-bench reports their median)
#   --smp N      guest vCPUs (default 2, as the goal is judged: client and server each find a
#                vCPU, as on a machine with idle cores; with 1 every request is two process
#                switches on one vCPU, which under TCG empty its TLB: tests/bench/README.md,
#                "Cold code after every switch")
#   --no-proxy   measure only /dev/null and the floors (skips building and running nvproxy)
# Environment: CARGO_TARGET_DIR as usual; CUSE_VM_* as documented in tests/vm/cuse-vm.
# Exit status: 0 when every requested measurement was taken, 1 otherwise (the table then shows
# what was measured and says what was not), 2 on usage errors.
#
# Builds on the host (cargo build --release of the daemon's `nvproxy` and of `nv-bench`, gcc for
# the floor device; installs gcc, libfuse3-dev and pkg-config with apt-get when missing, as root),
# then boots one VM that runs this script with --guest.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd -P)
source tests/bench/build-nvproxy.sh
PROG=run-bench

OUT='' REPS=5 ITERS=100 BATCHES=5 SMP=2 PROXY=1 GUEST=0
while (($#)); do
  case $1 in
    --out) OUT=${2:?--out needs a file}; shift 2 ;;
    --reps) REPS=${2:?--reps needs a number}; shift 2 ;;
    --iters) ITERS=${2:?--iters needs a number}; shift 2 ;;
    --batches) BATCHES=${2:?--batches needs a number}; shift 2 ;;
    --smp) SMP=${2:?--smp needs a number}; shift 2 ;;
    --no-proxy) PROXY=0; shift ;;
    --guest) GUEST=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "$PROG: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for v in "$REPS" "$ITERS" "$BATCHES" "$SMP"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "$PROG: --reps, --iters, --batches and --smp take positive numbers" >&2; exit 2; }
done
[[ -z $OUT || $OUT == /* ]] || OUT=$PWD/$OUT

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[[ $TARGET == /* ]] || TARGET=$ROOT/$TARGET
BIN=$TARGET/release
NVPROXY=${NVPROXY:-$BIN/nvproxy} # build_nvproxy sets it (tests/bench/build-nvproxy.sh)
FLOOR=$TARGET/bench/cuse_floor
SAMEWORK=$TARGET/bench/cuse_samework
FLOOR_MAX=8  # FLOOR_MAX_ROUNDS in cuse_floor.c
KINDS=(simple-control nested-control rm-alloc)
# The CUSE round trips a kind needs at least with FUSE_IOCTL_RETRY: one per level of client memory
# plus the final one (RM_ALLOC 3 and RM_FREE 2 average 2.5); with process_vm_* every kind needs 1.
declare -A RETRY_NEED=([simple-control]=3 [nested-control]=4 [rm-alloc]=2.5)
MEMS=(process-vm retry)

# ------------------------------------------------------------------------------------------ guest
# Prints one line per measurement, "ROW r<rep>:<kind> RESULT kind=... median_us=..." (kinds:
# null, floorN, <memory>:<nvidia kind>) or "FAIL r<rep>:<kind>: <why>", plus "KERNEL <uname -r>"
# and "CPUS <n>".
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
      echo "FAIL $label: exit status $status"
    fi
  }

  "$FLOOR" --name nvbench-floor >"$tmp/floor.out" 2>"$tmp/floor.err" &
  floor_pid=$!
  for _ in $(seq 300); do
    grep -q '^READY' "$tmp/floor.out" 2>/dev/null && break
    kill -0 "$floor_pid" 2>/dev/null || break
    sleep 0.1
  done
  floor_ok=1
  if ! grep -q '^READY' "$tmp/floor.out"; then
    echo "FAIL floor: the C floor device did not start: $(tr '\n' ' ' <"$tmp/floor.err")"
    floor_ok=0
  fi
  # The same round trips served by our own CUSE library (the cuse-example device on cuse-dev).
  "$BIN/cuse-example" --name nvbench-cusedev >"$tmp/cusedev.out" 2>"$tmp/cusedev.err" &
  cusedev_pid=$!
  for _ in $(seq 300); do
    grep -q '^READY' "$tmp/cusedev.out" 2>/dev/null && break
    kill -0 "$cusedev_pid" 2>/dev/null || break
    sleep 0.1
  done
  cusedev_ok=1
  if ! grep -q '^READY' "$tmp/cusedev.out"; then
    echo "FAIL cusedev: the cuse-example device did not start: $(tr '\n' ' ' <"$tmp/cusedev.err")"
    cusedev_ok=0
  fi

  # The same-work floor (restricted ioctls + the daemon's process_vm_* calls per kind).
  "$SAMEWORK" --name nvbench-samework >"$tmp/samework.out" 2>"$tmp/samework.err" &
  samework_pid=$!
  for _ in $(seq 300); do
    grep -q '^READY' "$tmp/samework.out" 2>/dev/null && break
    kill -0 "$samework_pid" 2>/dev/null || break
    sleep 0.1
  done
  samework_ok=1
  if ! grep -q '^READY' "$tmp/samework.out"; then
    echo "FAIL samework: the same-work floor did not start: $(tr '\n' ' ' <"$tmp/samework.err")"
    samework_ok=0
  fi

  # Each CUSE kind is timed batch by batch against the C floor (and /dev/null), see nv-bench;
  # the process-vm kinds also against the same-work floor.
  pair=() pair_sw=()
  ((floor_ok)) && pair=(--pair-floor /dev/nvbench-floor)
  ((samework_ok)) && pair_sw=(--pair-samework /dev/nvbench-samework)
  for rep in $(seq "$REPS"); do
    bench "r$rep:null" "$BIN/nv-bench" null --iters $((ITERS * 50)) --batches "$BATCHES"
    if ((floor_ok)); then
      for n in $(seq "$FLOOR_MAX"); do
        bench "r$rep:floor$n" "$BIN/nv-bench" "floor$n" --iters "$ITERS" --batches "$BATCHES"
      done
    fi
    if ((cusedev_ok)); then
      for n in 1 2 3 4; do
        bench "r$rep:cusedev$n" "$BIN/nv-bench" "cusedev$n" --iters "$ITERS" --batches "$BATCHES" \
          "${pair[@]}" --need "$n"
      done
    fi
    if ((samework_ok)); then
      for kind in "${KINDS[@]}"; do
        bench "r$rep:samework-$kind" "$BIN/nv-bench" "samework-$kind" --iters "$ITERS" \
          --batches "$BATCHES" "${pair[@]}" --need 1
      done
    fi
    if ((PROXY)); then
      for mem in "${MEMS[@]}"; do
        for kind in "${KINDS[@]}"; do
          need=1 sw=()
          [[ $mem == retry ]] && need=${RETRY_NEED[$kind]}
          [[ $mem == process-vm ]] && sw=("${pair_sw[@]}")
          # nvproxy's log goes to stderr (shown live); nv-bench's RESULT line to stdout.
          bench "r$rep:$mem:$kind" "$NVPROXY" exec --driver sim --memory "$mem" -- \
            "$BIN/nv-bench" "$kind" --iters "$ITERS" --batches "$BATCHES" "${pair[@]}" --need "$need" \
            "${sw[@]}"
        done
      done
    fi
  done
  kill "$floor_pid" "$cusedev_pid" "$samework_pid" 2>/dev/null || true
  wait "$floor_pid" "$cusedev_pid" "$samework_pid" 2>/dev/null || true
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
step "gcc cuse_floor.c"
# shellcheck disable=SC2046  # pkg-config prints several words on purpose
gcc -O2 -Wall -Wextra -o "$FLOOR" tests/bench/cuse_floor.c $(pkg-config --cflags --libs fuse3)
step "gcc cuse_samework.c"
# shellcheck disable=SC2046
gcc -O2 -Wall -Wextra -o "$SAMEWORK" tests/bench/cuse_samework.c $(pkg-config --cflags --libs fuse3)

step "cargo build --release nv-bench cuse-example"
cargo build --release -q -p tests --bin nv-bench --bin cuse-example
not_measured=()
if ((PROXY)); then
  step "cargo build --release nvproxy"
  if ! build_nvproxy --vm; then
    not_measured+=("the proxied kinds: the daemon did not build")
    PROXY=0
  elif ! "$NVPROXY" exec --help >/dev/null 2>&1; then
    not_measured+=("the proxied kinds: this nvproxy has no 'exec' subcommand yet")
    PROXY=0
  fi
fi

raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
step "one VM, $REPS repetitions of: /dev/null, floor1..floor$FLOOR_MAX, cusedev1..cusedev4, samework-{${KINDS[*]}}$( ((PROXY)) && echo ", nvproxy exec --memory ${MEMS[*]} × ${KINDS[*]}")"
vm_status=0
no_proxy=()
((PROXY)) || no_proxy=(--no-proxy)
tests/vm/cuse-vm --smp "$SMP" --timeout 3000 -- bash "$ROOT/tests/bench/run-bench.sh" --guest \
  --reps "$REPS" --iters "$ITERS" --batches "$BATCHES" "${no_proxy[@]}" | tee "$raw" || vm_status=$?
((vm_status == 0)) || not_measured+=("the VM run ended with status $vm_status")

# ------------------------------------------------------------------------------- table (host)
NOT_MEASURED=$(printf '%s\n' "${not_measured[@]}") PROXY=$PROXY REPS=$REPS ITERS=$ITERS \
BATCHES=$BATCHES FLOOR_MAX=$FLOOR_MAX python3 - "$raw" "$OUT" <<'PY'
import os, re, statistics, sys

raw, out = sys.argv[1], sys.argv[2]
reps, floor_max = int(os.environ["REPS"]), int(os.environ["FLOOR_MAX"])
proxy = os.environ.get("PROXY") == "1"
rows, fails, kernel, cpus = {}, [], "?", "?"
for line in open(raw):
    line = line.rstrip("\n")
    if line.startswith("KERNEL "): kernel = line[7:]
    elif line.startswith("CPUS "): cpus = line[5:]
    elif line.startswith("FAIL "): fails.append(line[5:])
    elif line.startswith("ROW "):
        label, rest = line[4:].split(" ", 1)
        rep, kind = label.split(":", 1)
        rows[(int(rep[1:]), kind)] = dict(re.findall(r"(\w+)=(\S+)", rest))
not_measured = [l for l in os.environ.get("NOT_MEASURED", "").split("\n") if l] + fails

def us(rep, kind):
    r = rows.get((rep, kind))
    return float(r["median_us"]) if r else None

def rounds(rep, kind):
    """CUSE round trips per ioctl, measured as the servers' read syscalls per ioctl."""
    v = rows.get((rep, kind), {}).get("server_reads_per_ioctl", "na")
    return None if v == "na" else float(v)

def floor_at(rep, r):
    """The C floor's µs for r round trips in repetition rep: floorN, or for a fractional r
    (an alloc+free pair of 3 and 2 rounds averages 2.5) between its two neighbours."""
    if r is None or r < 0.95 or r > floor_max + 0.05:
        return None
    lo = int(r + 0.05)
    if abs(r - lo) <= 0.05:
        return us(rep, f"floor{lo}")
    a, b = us(rep, f"floor{lo}"), us(rep, f"floor{lo + 1}")
    return None if a is None or b is None else a + (r - lo) * (b - a)

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None

def spread(xs, nd, unit):
    xs = [x for x in xs if x is not None]
    if not xs: return "—"
    m = statistics.median(xs)
    return f"{m:.{nd}f}{unit}" if len(xs) == 1 else f"{m:.{nd}f}{unit} ({min(xs):.{nd}f}–{max(xs):.{nd}f})"

# (kind, shown as, path, round trips a server needs at least, how they arise)
spec = [("null", "null: `/dev/null`, unknown cmd → ENOTTY", "syscall only", 0, "")]
for n in range(1, floor_max + 1):
    spec.append((f"floor{n}", f"floor{n}", "C device, libfuse3 mt loop", n, ""))
for n in range(1, 5):
    spec.append((f"cusedev{n}", f"cusedev{n}", "Rust device on our cuse-dev (cuse-example)", n, ""))
SW_PATH = "same-work C floor: process-vm's kernel work, libfuse3 mt loop"
spec += [
    ("samework-simple-control", "same-work simple-control", SW_PATH, 1,
     "restricted round trip; process_vm_readv 4 B + process_vm_writev 4 B"),
    ("samework-nested-control", "same-work nested-control", SW_PATH, 1,
     "restricted round trip; process_vm_readv 16 B, 256 B + one process_vm_writev of 16 B + 256 B"),
    ("samework-rm-alloc", "same-work rm-alloc (alloc+free, per ioctl)", SW_PATH, 1,
     "restricted round trips; RM_ALLOC: process_vm_readv 56 B + process_vm_writev 56 B; RM_FREE: none"),
]
spec += [
    ("process-vm:simple-control", "simple-control", "nvproxy, process-vm", 1,
     "1 CUSE round; NVOS54 and the params via process_vm_readv, results via process_vm_writev"),
    ("process-vm:nested-control", "nested-control", "nvproxy, process-vm", 1,
     "1 CUSE round; NVOS54, the params and the embedded class list via process_vm_readv/writev"),
    ("process-vm:rm-alloc", "rm-alloc (alloc+free, per ioctl)", "nvproxy, process-vm", 1,
     "1 CUSE round for RM_ALLOC, 1 for RM_FREE"),
    ("retry:simple-control", "simple-control", "nvproxy, retry", 3,
     "no data → NVOS54 → NVOS54 + params → reply"),
    ("retry:nested-control", "nested-control", "nvproxy, retry", 4,
     "no data → NVOS54 → + params → + the embedded list → reply"),
    ("retry:rm-alloc", "rm-alloc (alloc+free, per ioctl)", "nvproxy, retry", 2.5,
     "RM_ALLOC: no data → NVOS64 → + alloc params → reply (3); RM_FREE: no data → NVOS00 → reply (2)"),
]

def fmt(x, nd=1): return "—" if x is None else f"{x:.{nd}f}"
table = ["| kind | path | µs/ioctl | CUSE round trips / ioctl: needed; measured | C floor at the needed round trips (µs) | **vs C floor, same round trips** | vs C floor at the measured round trips | vs /dev/null | **vs same-work floor** |",
         "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
goal, seen, paired_need, paired_sw = [], set(), {}, {}
for kind, shown, path, need, why in spec:
    proxied = ":" in kind
    if proxied and not proxy:
        continue
    vals = [us(rep, kind) for rep in range(1, reps + 1)]
    if all(v is None for v in vals):
        table.append(f"| {shown} | {path} | not measured | {need:g} | | | | | |")
        continue
    meas = med([rounds(rep, kind) for rep in range(1, reps + 1)])
    def ratio(rep, paired, base):
        """The ratio nv-bench paired batch by batch, else this repetition's µs over base's."""
        p = rows.get((rep, kind), {}).get(paired, "na")
        if p != "na":
            return float(p)
        v = us(rep, kind)
        return v / base if v and base else None
    all_reps = range(1, reps + 1)
    r_need = [ratio(rep, "vs_floor_need", floor_at(rep, need)) for rep in all_reps] if need else []
    r_meas = [ratio(rep, "vs_floor_measured", floor_at(rep, rounds(rep, kind))) for rep in all_reps] if need else []
    r_null = [ratio(rep, "vs_null", us(rep, "null")) for rep in all_reps]
    # Against the same-work floor: only process-vm kinds (paired batch by batch), and the
    # floor's own rows (1×).
    sw_kind = {"process-vm:" + k: "samework-" + k for k in ("simple-control", "nested-control", "rm-alloc")}
    if kind in sw_kind:
        r_sw = [ratio(rep, "vs_samework", us(rep, sw_kind[kind])) for rep in all_reps]
    elif kind.startswith("samework-"):
        r_sw = [1.0 for rep in all_reps if us(rep, kind) is not None]
    else:
        r_sw = []
    paired_sw[kind] = med(r_sw)
    fl = med([floor_at(rep, need) for rep in range(1, reps + 1)]) if need else None
    paired_need[kind] = med(r_need)
    rt = f"{need:g}; {fmt(meas, 2)}" if need else "0"
    table.append(f"| {shown} | {path} | {spread(vals, 1, '')} | {rt} | {fmt(fl)} | {spread(r_need, 2, '×')} | "
                 f"{spread(r_meas, 2, '×')} | {spread(r_null, 0, '×')} | {spread(r_sw, 2, '×')} |")
    if proxied and med(r_need) is not None:
        m = med(r_need)
        extra = "" if meas is None or abs(meas - need) < 0.05 else \
            f" It took {meas:.2f} round trips where {need:g} suffice; against the floor doing {meas:.2f} it is {fmt(med(r_meas), 2)}×."
        sw = paired_sw.get(kind)
        sw_text = "" if sw is None else \
            f" Against the same-work floor (the same round trip and process_vm_* calls): {sw:.2f}× — " \
            f"{'within' if sw <= 1.25 else '**not** within'} the 1.25× goal."
        goal.append(f"- {path.split(', ')[1]} {shown}: {m:.2f}× the C floor doing the {need:g} round trips the "
                    f"job needs ({why}) — {'within' if m <= 1.25 else '**not** within'} the 1.25× goal.{extra}{sw_text}")
        det = next((rows[(rep, kind)].get("detail") for rep in range(1, reps + 1) if (rep, kind) in rows), "")
        if det and det not in seen:
            seen.add(det)
            goal.append(f"  Measured with: {det}.")

ops = os.environ["ITERS"], os.environ["BATCHES"]
notes = [
    f"Guest kernel {kernel}, {cpus} vCPU(s), QEMU TCG (software emulation), one VM run: guest code runs "
    "10–50× slower than native, so only the ratios inside this run mean much.",
    f"{reps} repetitions, each measuring every kind in turn ({ops[1]} batches × {ops[0]} ioctls per kind and "
    "repetition, alloc+free pairs for rm-alloc, 50× as many for /dev/null); µs/ioctl is the median over the "
    "repetitions of nv-bench's median batch, ratios are taken inside each repetition, and the parentheses give "
    "the lowest and highest of the repetitions.",
    "Ratios of the CUSE kinds are paired: nv-bench follows every batch of the kind with a batch on the C floor "
    "(at the needed and at the measured round trips) and one on /dev/null, and takes the median of the "
    "batch-by-batch ratios; the floor rows themselves come from separate runs. The process-vm kinds are also "
    "paired with the same client calls on the same-work floor (`cuse_samework.c`: restricted CUSE ioctls, so "
    "the kernel copies the `_IOWR` top-level struct in and out as on the daemon's frontend nodes, plus the "
    "daemon's `process_vm_readv`/`writev` calls for that kind with the same iovecs, checked with "
    "`syscalls.sh --detail-only`; fixed answers); its own rows give its cost against floor1.",
    "Round trips, needed: with `--memory process-vm` a proxied ioctl needs 1 CUSE round trip (plus "
    "process_vm_readv/writev syscalls in the daemon), so it is compared with floor1; with `--memory retry` "
    "the server must fetch the caller's memory through FUSE_IOCTL_RETRY, one round per level of pointers, "
    "so it is compared with the floor doing that many rounds (a fractional count between two floors). "
    "Measured: the read syscalls per ioctl of every process holding /dev/cuse (`syscr` in /proc/PID/io; "
    "one request read per round trip; exact on the floor).",
]
lib = [paired_need.get(f"cusedev{n}") for n in range(1, 5)]
if any(x is not None for x in lib):
    notes.append("Our CUSE library alone (cuse-example on cuse-dev, no proxy) against the C floor, per number "
                 "of round trips 1–4: " + ", ".join(fmt(x, 2) + "×" for x in lib) +
                 "; the rest of a proxied ioctl's overhead is the daemon's handler.")
report = ["## Frontend proxy: µs per proxied ioctl", "", *table, "", *notes]
if goal:
    report += ["", "Goal: within 1.25× of the C device doing the same round trips.", *goal]
if not proxy and not not_measured:
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
