#!/usr/bin/env bash
# diagnose.sh: where a proxied simple control's time goes beyond the same-work floor, and where
# the proxy serialises under concurrency. For the request-path developers; measures, never
# fails on a slow result. One VM (tests/vm/cuse-vm, --smp 2 by default), everything below in it:
#
#   1. syscalls per ioctl, one client and 8 concurrent clients (strace -f -c, the daemon and the
#      client together; difference of two run lengths for one client, per measured ioctl for 8),
#      for nvproxy --memory process-vm (--kind, one client; simple-control at T clients) and
#      for the same-work floor;
#   2. lock sites: every futex call the daemon makes with 8 concurrent clients, with its user
#      stack (strace -f -k -e trace=futex), folded to the first frames of our own code below
#      the std lock/condvar functions, counted;
#   3. CPU profiles (perf record -e cpu-clock -a: whole guest, flat by symbol) of one client
#      and of 8 clients through the proxy and on the same-work floor;
#   4. (only with --only 4) where the serving threads' time goes, by call stack (perf record
#      --call-graph dwarf, one client, --ops ioctls): each system call, and the user code by
#      part (cuse-dev, the request path, the worker's glue, nvsim), for the proxy's
#      `cuse-worker` threads and the same-work floor's (tests/bench/e2e-split.py --thread), and
#      their kernel functions, proxy minus floor (the guest's /proc/kallsyms is kept for it);
#   5. (only with --only 5) the steady state with T clients, each side in a 10 s phase of its
#      own: cpu-clock samples per 1000 ioctls by task and object (kernel / our code /
#      libraries, client and server), context switches per ioctl of the serving threads and
#      the clients (went to sleep vs preempted), and where the serving threads slept
#      (waiting in `read` for a request, on a futex, ...): whether the proxy serialises or
#      only costs more CPU per ioctl.
#
# Usage: tests/bench/diagnose.sh [--out DIR] [--smp N] [--ops N] [--threads T] [--only 1,2,3]
#   --out DIR    where the raw outputs go (default target/bench/diagnose); a summary is printed
#   --ops N      ioctls per single-client run (default 2000)
#   --threads T  the concurrent clients of parts 1-3 and 5 (default 8)
#   --kind K     the nv-bench kind of parts 4, 5 and 1's single client (default simple-control;
#                nested-control,
#                rm-alloc)
#   --only LIST  run only these parts (--skip-perf: parts 1 and 2). Profiles of one client are
#                clearer with --smp 1 (no idle vCPU, no cross-vCPU hand-offs).
# Needs strace and perf (linux-perf) on the host (the guest runs the host's binaries); installs
# them with apt-get when missing. Builds like run-bench.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd -P)
source tests/bench/build-nvproxy.sh
PROG=diagnose
OUTDIR='' SMP=2 OPS=2000 T=8 ONLY=1,2,3 GUEST=0 KIND=simple-control
while (($#)); do
  case $1 in
    --out) OUTDIR=${2:?}; shift 2 ;;
    --smp) SMP=${2:?}; shift 2 ;;
    --ops) OPS=${2:?}; shift 2 ;;
    --threads) T=${2:?}; shift 2 ;;
    --skip-perf) ONLY=1,2; shift ;;
    --only) ONLY=${2:?}; shift 2 ;;
    --kind) KIND=${2:?}; shift 2 ;;
    --guest) GUEST=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "$PROG: unknown argument $1" >&2; exit 2 ;;
  esac
done
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[[ $TARGET == /* ]] || TARGET=$ROOT/$TARGET
BIN=$TARGET/release
NVPROXY=${NVPROXY:-$BIN/nvproxy} # build_nvproxy sets it (tests/bench/build-nvproxy.sh)
SAMEWORK=$TARGET/bench/cuse_samework
OUTDIR=${OUTDIR:-$TARGET/bench/diagnose}
[[ $OUTDIR == /* ]] || OUTDIR=$PWD/$OUTDIR

part() { [[ ,$ONLY, == *,$1,* ]]; }
if ((GUEST)); then
  set +o pipefail # `perf report | head` and the like end their producer early
  mkdir -p "$OUTDIR"
  # This boot's kernel symbols (KASLR moves them every boot), for the host's reports.
  cat /proc/kallsyms >"$OUTDIR/kallsyms" 2>/dev/null || true
  "$SAMEWORK" --name nvbench-samework --max-threads 64 >"$OUTDIR/sw.out" 2>&1 &
  sw=$!
  for _ in $(seq 300); do grep -q '^READY' "$OUTDIR/sw.out" && break; sleep 0.1; done
  exec_nv() { "$NVPROXY" exec --driver sim --memory process-vm -- "$@"; }
  calls() { awk '$1 ~ /^[0-9.]+$/ && $NF != "total" { print $NF, $4 }' "$1"; }
  diff_report() { # LABEL FILE_SMALL FILE_BIG OPS
    echo "== $1"
    join -a2 -e0 -o 0,1.2,2.2 <(calls "$2" | sort) <(calls "$3" | sort) |
      awk -v n="$4" '{ d = ($3 - $2) / n; if (d >= 0.02) printf "  %-22s %7.2f\n", $1, d }' | sort -k2,2nr
  }
  per_report() { # LABEL FILE OPS
    echo "== $1"
    calls "$2" | awk -v n="$3" '{ d = $2 / n; if (d >= 0.02) printf "  %-22s %7.2f\n", $1, d }' | sort -k2,2nr
  }
  ops_of() { grep -m1 '^SCALE ' "$1" | sed -E 's/.* ops_s=([0-9.]+).*/\1/'; }

  if part 1; then
  echo "### 1. syscalls per ioctl"
  # One client: nv-bench makes 2N calls (count pass + one batch), twice that for rm-alloc (an
  # alloc and a free per call); N+1 vs 1.
  per=1
  [[ $KIND == rm-alloc ]] && per=2
  for n in 1 $((OPS + 1)); do
    strace -f -c -o "$OUTDIR/s1.$n" "$NVPROXY" exec --driver sim --memory process-vm -- \
      "$BIN/nv-bench" "$KIND" --iters "$n" --batches 1 --warmup 0 >/dev/null 2>&1
  done
  diff_report "nvproxy process-vm $KIND, 1 client (daemon + client)" "$OUTDIR/s1.1" "$OUTDIR/s1.$((OPS + 1))" $((2 * OPS * per))
  for n in 1 $((OPS + 1)); do
    strace -f -c -o "$OUTDIR/w1.$n" -p "$sw" 2>/dev/null &
    st=$!
    sleep 1
    "$BIN/nv-bench" "samework-$KIND" --iters "$n" --batches 1 --warmup 0 >/dev/null 2>&1
    kill -INT "$st"; wait "$st" 2>/dev/null || true
  done
  diff_report "same-work floor $KIND, 1 client (the server)" "$OUTDIR/w1.1" "$OUTDIR/w1.$((OPS + 1))" $((2 * OPS * per))
  # T clients: a 1-round sweep of the proxy only; per ioctl = counts / (ops/s × seconds) is
  # skewed by strace, so count the ioctls themselves: every client ioctl is one line of
  # the `ioctl` row (the daemon makes none per request with nvsim).
  strace -f -c -o "$OUTDIR/sT" "$NVPROXY" exec --driver sim --memory process-vm -- \
    "$BIN/nv-bench" simple-control --threads "$T" --ms 3000 --rounds 1 >"$OUTDIR/sT.out" 2>&1 || true
  n_ioctl=$(calls "$OUTDIR/sT" | awk '$1 == "ioctl" { print $2 }')
  per_report "nvproxy process-vm simple-control, $T clients, per client ioctl ($n_ioctl ioctls)" "$OUTDIR/sT" "${n_ioctl:-1}"
  strace -f -c -o "$OUTDIR/wT" -p "$sw" 2>/dev/null &
  st=$!
  sleep 1
  "$BIN/nv-bench" samework-simple-control --threads "$T" --ms 3000 --rounds 1 >"$OUTDIR/wT.out" 2>&1 || true
  kill -INT "$st"; wait "$st" 2>/dev/null || true
  w_ops=$(awk '/^SCALE /{ for (i = 1; i <= NF; i++) if ($i ~ /^ops_s=/) { sub(/ops_s=/, "", $i); print $i * 3 } }' "$OUTDIR/wT.out")
  w_reads=$(calls "$OUTDIR/wT" | awk '$1 == "read" { print $2 }')
  per_report "same-work floor, $T clients, per request read (${w_reads:-?} reads; ~${w_ops:-?} ioctls)" "$OUTDIR/wT" "${w_reads:-1}"
  fi

  if part 2; then
  echo "### 2. futex calls of the daemon with $T clients, by the first frame of our code"
  strace -f -qq -k -e trace=futex -o "$OUTDIR/futex.txt" "$NVPROXY" exec --driver sim --memory process-vm -- \
    "$BIN/nv-bench" simple-control --threads "$T" --ms 8000 --rounds 1 >"$OUTDIR/futex.out" 2>&1 || true
  echo "  (under strace: $(grep -m1 '^SCALE ' "$OUTDIR/futex.out" || true))"
  # Every stack block (" > binary(symbol+0x..) [0x..]" lines after a futex line) of the daemon
  # becomes "PRIMITIVE @ SITE": the std primitive it went through (Mutex::lock_contended: a
  # waiter on a held mutex; Condvar; "futex (direct)": a wake from an unlock or notify inlined
  # into its caller) and the first frame of our own code. Counted, most first.
  awk '
    function flush() {
      if (nf > 0 && bin == "nvproxy") print (prim == "" ? "futex (direct)" : prim) " @ " site
      nf = 0; prim = ""; site = ""; bin = ""
    }
    /^ > / {
      b = $0; sub(/^ > /, "", b); sub(/\(.*/, "", b); sub(/.*\//, "", b)
      s = $0; sub(/^ > [^(]*\(/, "", s); sub(/\+0x[0-9a-f]+\) \[.*$/, "", s)
      nf++
      if (prim == "") {
        if (s ~ /lock_contended/) prim = "Mutex::lock_contended"
        else if (s ~ /[Cc]ondvar/) prim = "Condvar wait/notify"
        else if (s ~ /[Bb]arrier/) prim = "Barrier"
      }
      if (site == "" && (b == "nvproxy" || b == "nv-bench") &&
          s !~ /(^|[<: ])(std|core|alloc)::/ && s !~ /^_ZN(3std|4core|5alloc)/) { site = s; bin = b }
      next
    }
    { flush() }
    END { flush() }
  ' "$OUTDIR/futex.txt" | c++filt | sed -E 's/::h[0-9a-f]{16}//g' | sort | uniq -c | sort -rn | head -30
  fi

  if part 3; then
    echo "### 3. CPU profiles (perf record -e cpu-clock -a; flat, top symbols)"
    prof() { # NAME CMD...
      local name=$1; shift
      perf record -q -e cpu-clock -F 2000 -a -o "$OUTDIR/$name.data" -- "$@" >"$OUTDIR/$name.out" 2>&1 || true
      echo "== $name: by process and object"
      perf report -q -i "$OUTDIR/$name.data" --sort comm,dso --stdio 2>/dev/null | head -14
      echo "== $name: top symbols"
      perf report -q -i "$OUTDIR/$name.data" --sort comm,sym --stdio 2>/dev/null | head -45
    }
    prof proxy1 "$NVPROXY" exec --driver sim --memory process-vm -- \
      "$BIN/nv-bench" simple-control --iters "$OPS" --batches 1 --warmup 10
    prof floor1 "$BIN/nv-bench" samework-simple-control --iters "$OPS" --batches 1 --warmup 10
    prof proxyT "$NVPROXY" exec --driver sim --memory process-vm -- \
      "$BIN/nv-bench" simple-control --threads "$T" --ms 3000 --rounds 1
    prof floorT "$BIN/nv-bench" samework-simple-control --threads "$T" --ms 3000 --rounds 1
    grep -h '^RESULT\|^SCALE ' "$OUTDIR"/proxy1.out "$OUTDIR"/floor1.out "$OUTDIR"/proxyT.out "$OUTDIR"/floorT.out || true
  fi
  if part 4; then
    # System-wide (-a) on both sides: per-task events would put perf's own work into the
    # context switches of the profiled tasks only, and differently on the two sides.
    perf record -q -a -F 1500 --call-graph dwarf,8192 -o "$OUTDIR/stacks-proxy.data" -- \
      "$NVPROXY" exec --driver sim --memory process-vm -- \
      "$BIN/nv-bench" "$KIND" --iters "$OPS" --batches 1 --warmup 10 >"$OUTDIR/stacks-proxy.out" 2>&1 || true
    perf record -q -a -F 1500 --call-graph dwarf,8192 -o "$OUTDIR/stacks-floor.data" -- \
      "$BIN/nv-bench" samework-"$KIND" --iters "$OPS" --batches 1 --warmup 10 >"$OUTDIR/stacks-floor.out" 2>&1 || true
    grep -h '^RESULT' "$OUTDIR"/stacks-proxy.out "$OUTDIR"/stacks-floor.out | cut -d' ' -f1-7 || true
  fi
  if part 5; then
    echo "### 5. steady state with $T clients: CPU and sleeps per ioctl, proxy vs same-work floor"
    # One 10 s phase per side, each in its own process tree: start-up stays out of the
    # figures apart from the proxy's own (its line "nvproxy", and the idle vCPU meanwhile).
    for side in proxy floor; do
      if [[ $side == proxy ]]; then
        run=("$NVPROXY" exec --driver sim --memory process-vm -- "$BIN/nv-bench" "$KIND") server=cuse-worker
      else
        run=("$BIN/nv-bench" samework-"$KIND" --dev /dev/nvbench-samework) server=cuse_samework
      fi
      for ev in cpu sched; do
        if [[ $ev == cpu ]]; then opts=(-e cpu-clock -F 1000); else opts=(-e sched:sched_switch -g); fi
        perf record -q "${opts[@]}" -a -o "$OUTDIR/ss-$side-$ev.data" -- "${run[@]}" \
          --threads "$T" --ms 10000 --rounds 1 >"$OUTDIR/ss-$side-$ev.out" 2>&1 || true
      done
      ops=$(awk '/^SCALE /{ for (i = 1; i <= NF; i++) if ($i ~ /^ops_s=/) { sub(/ops_s=/, "", $i); print $i * 10 } }' \
        "$OUTDIR/ss-$side-cpu.out")
      echo "== $side: ${ops:-?} ioctls in 10 s ($(grep -m1 -o ' ops_s=[0-9.]*' "$OUTDIR/ss-$side-cpu.out" || echo 'no result'))"
      [[ -n $ops ]] || continue
      echo "  cpu-clock samples (1 ms each) per 1000 ioctls, by task and object:"
      perf report -q -n -i "$OUTDIR/ss-$side-cpu.data" --sort comm,dso --stdio 2>/dev/null |
        awk -v n="$ops" '{ r = $2 * 1000 / n; if (r >= 1) printf "    %-14s %-22s %7.1f\n", $3, $4, r }'
      echo "  context switches per ioctl (prev_state; S = went to sleep, R = preempted):"
      perf script -i "$OUTDIR/ss-$side-sched.data" -F comm,trace 2>/dev/null |
        awk -v n="$ops" -v srv="$server" '($1 == srv || $1 == "nv-bench") {
            for (i = 2; i <= NF; i++) if ($i ~ /^prev_state=/) { st = $i; sub(/prev_state=/, "", st) }
            c[$1 " " substr(st, 1, 1)]++ }
          END { for (k in c) printf "    %-24s %6.2f\n", k, c[k] / n }' | sort
      echo "  where $server threads went to sleep (per ioctl, by the kernel function they waited in):"
      perf script -i "$OUTDIR/ss-$side-sched.data" -F comm,trace,ip,sym 2>/dev/null |
        awk -v n="$ops" -v srv="$server" '
          /^[^ \t]/ { flush(); keep = ($1 == srv && $0 ~ /prev_state=S/); site = ""; next }
          keep && site == "" && $2 ~ /^(fuse_dev_do_read|fuse_dev_do_write|futex_wait|do_futex|process_vm_rw_core|poll_schedule_timeout|do_nanosleep|pipe_read|unix_stream_read_generic)/ {
            site = $2; sub(/\..*/, "", site) }
          function flush() { if (keep) c[site == "" ? "other" : site]++ }
          END { flush(); for (k in c) printf "    %-28s %6.2f\n", k, c[k] / n }' | sort -k2,2nr
    done
  fi
  kill "$sw" 2>/dev/null || true
  exit 0
fi

for tool in strace perf; do
  command -v "$tool" >/dev/null || apt-get install -y -qq "$([[ $tool == perf ]] && echo linux-perf || echo strace)" >/dev/null
done
pkg-config --exists fuse3 2>/dev/null || apt-get install -y -qq gcc libfuse3-dev pkg-config >/dev/null
export CARGO_TARGET_DIR=$TARGET
mkdir -p "$TARGET/bench" "$OUTDIR"
# shellcheck disable=SC2046
gcc -O2 -Wall -Wextra -o "$SAMEWORK" tests/bench/cuse_samework.c $(pkg-config --cflags --libs fuse3)
cargo build --release -q -p tests --bin nv-bench
build_nvproxy --vm
rw=()
[[ $OUTDIR == "$ROOT"/* ]] || rw=(--rw "$OUTDIR")
tests/vm/cuse-vm --smp "$SMP" --mem 2G --timeout 3000 "${rw[@]}" -- bash "$ROOT/tests/bench/diagnose.sh" --guest \
  --out "$OUTDIR" --ops "$OPS" --threads "$T" --only "$ONLY" --kind "$KIND" | tee "$OUTDIR/summary-$ONLY-smp$SMP.txt"
if [[ ,$ONLY, == *,4,* ]]; then
  # Symbols are resolved on the host (the guest ran the host's binaries).
  ksyms=()
  [[ -s $OUTDIR/kallsyms ]] && ksyms=(--kallsyms "$OUTDIR/kallsyms")
  echo "### 4. the serving threads' samples by system call and by part of the user code"
  for side in proxy:cuse-worker floor:cuse_samework; do
    perf script "${ksyms[@]}" -i "$OUTDIR/stacks-${side%%:*}.data" -F comm,tid,ip,sym,dso 2>/dev/null >"$OUTDIR/stacks-${side%%:*}.txt" || true
    echo "== ${side%%:*}"
    python3 tests/bench/e2e-split.py --thread "${side#*:}" "$OUTDIR/stacks-${side%%:*}.txt" || true
    perf report "${ksyms[@]}" -i "$OUTDIR/stacks-${side%%:*}.data" --comm "${side#*:}" --no-children \
      --sort sym -n -q --stdio -g none 2>/dev/null | awk '$3 == "[k]"' >"$OUTDIR/kernel-${side%%:*}.txt" || true
  done | tee -a "$OUTDIR/summary-$ONLY-smp$SMP.txt"
  # The serving threads' kernel functions, proxy minus floor, in samples (the same ioctl count).
  python3 - "$OUTDIR/kernel-proxy.txt" "$OUTDIR/kernel-floor.txt" <<'PY' | tee -a "$OUTDIR/summary-$ONLY-smp$SMP.txt"
import collections, sys
def load(path):
    d = collections.Counter()
    for line in open(path):
        f = line.split()
        if len(f) >= 4 and f[1].isdigit():
            d[" ".join(f[3:])] += int(f[1])
    return d
p, f = load(sys.argv[1]), load(sys.argv[2])
if not p or not f:
    sys.exit("no kernel samples with symbols (no kallsyms from the guest?)")
print(f"== serving threads' kernel samples: proxy {sum(p.values())}, floor {sum(f.values())}")
diff = sorted(((p[k] - f[k], k) for k in set(p) | set(f)), reverse=True)
for d, k in diff[:12] + [(0, "...")] + diff[-5:]:
    print(f"  {d:+6}  {k}")
PY
fi
echo "$PROG: raw outputs in $OUTDIR" >&2
