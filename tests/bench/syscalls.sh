#!/usr/bin/env bash
# syscalls.sh: where a proxied ioctl's time goes, as syscall counts. In one VM (tests/vm/cuse-vm),
# counts with `strace -f -c` the syscalls per ioctl of: the C floor device (floor1, floor3), our
# cuse-dev library (cusedev1, cusedev3: the cuse-example device), the same-work floor
# (tests/bench/cuse_samework.c) for each NVIDIA kind, and `nvproxy exec --driver sim` with both
# memory transports for the kinds of nv-bench. Each count is the difference between a run of N+1
# and a run of 1 ioctl(s), divided by N, so start-up and teardown cancel out.
#
# Usage: tests/bench/syscalls.sh [--n N] [--detail-only]
#   default N=200; run tests/bench/run-bench.sh first, or let this build the same binaries.
#   --detail-only  only the second part (below), which the same-work floor is checked against.
# The devices' counts are the server's alone (strace attached to it); the nvproxy counts are
# the daemon's and the client's together (the client's share is its one ioctl per call, plus
# nothing else per call).
# Second part ("process_vm detail"): every process_vm_readv/process_vm_writev per ioctl with its
# local and remote iovec lengths and result, for `nvproxy --memory process-vm` (the daemon) and
# for the same-work floor (the server) on each kind: the floor must show the same lines.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd -P)
source tests/bench/build-nvproxy.sh
N=200 GUEST=0 DETAIL_ONLY=0
while (($#)); do
  case $1 in
    --n) N=${2:?--n needs a number}; shift 2 ;;
    --detail-only) DETAIL_ONLY=1; shift ;;
    --guest) GUEST=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "syscalls: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $N =~ ^[1-9][0-9]*$ ]] || { echo "syscalls: --n takes a positive number" >&2; exit 2; }
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[[ $TARGET == /* ]] || TARGET=$ROOT/$TARGET
BIN=$TARGET/release
NVPROXY=${NVPROXY:-$BIN/nvproxy} # build_nvproxy sets it (tests/bench/build-nvproxy.sh)
FLOOR=$TARGET/bench/cuse_floor
SAMEWORK=$TARGET/bench/cuse_samework
KINDS=(simple-control nested-control rm-alloc)

if ((GUEST)); then
  tmp=$(mktemp -d)
  # Prints "syscall calls" lines of an `strace -c` summary file.
  calls() { awk '$1 ~ /^[0-9.]+$/ && $NF != "total" { print $NF, $4 }' "$1"; }
  # LABEL FILE_1 FILE_N1: the per-ioctl difference, largest first.
  report() {
    echo "== $1"
    join -a2 -e0 -o 0,1.2,2.2 <(calls "$2" | sort) <(calls "$3" | sort) |
      awk -v n="$N" '{ d = ($3 - $2) / n; if (d >= 0.05) printf "  %-22s %6.2f\n", $1, d }' | sort -k2,2nr
  }
  # A device server: strace attached to PID while nv-bench runs KIND n times.
  device() { # LABEL PID KIND DEV [IOCTLS_PER_CALL]
    local per=${5:-1}
    for n in 1 $((N + 1)); do
      strace -f -c -o "$tmp/s.$n" -p "$2" 2>/dev/null &
      local st=$!
      sleep 1
      "$BIN/nv-bench" "$3" --dev "$4" --iters "$n" --batches 1 --warmup 0 >/dev/null 2>&1
      kill -INT "$st"
      wait "$st" 2>/dev/null || true
    done
    # nv-bench runs each call twice (a counting pass and a timed batch).
    N=$((2 * per * N)) report "$1 (the server; per ioctl)" "$tmp/s.1" "$tmp/s.$((N + 1))"
  }
  start() { # BIN NAME -> pid; waits for READY
    "$1" --name "$2" >"$tmp/$2.out" 2>&1 &
    local pid=$!
    for _ in $(seq 300); do grep -q '^READY' "$tmp/$2.out" && break; sleep 0.1; done
    echo "$pid"
  }
  # process_vm_* calls of a strace file (-f, full iovecs), one line per call with the pid and
  # the addresses taken out: "process_vm_readv([{iov_len=4}], 1, [{iov_len=4}], 1, 0) = 4".
  vmcalls() {
    grep -E 'process_vm_(readv|writev)\(' "$1" | grep -v 'resumed>' |
      sed -E 's/^[0-9]+ +//; s/\(([0-9]+), /(/; s/iov_base=(0x[0-9a-f]+|NULL|"([^"\\]|\\.)*"(\.\.\.)?), //g' | sort | uniq -c |
      awk '{ c = $1; $1 = ""; sub(/^ /, ""); print $0 "\t" c }'
  }
  # LABEL FILE_1 FILE_N1 OPS: process_vm calls per ioctl (difference / OPS).
  vmreport() {
    echo "== $1"
    join -t $'\t' -a2 -e0 -o 0,1.2,2.2 <(vmcalls "$2" | sort -t $'\t' -k1,1) \
      <(vmcalls "$3" | sort -t $'\t' -k1,1) |
      awk -F '\t' -v n="$4" '{ d = ($3 - $2) / n; if (d >= 0.05) printf "  %6.2f  %s\n", d, $1 }' | sort -k2
  }
  floor_pid=$(start "$FLOOR" nvbench-floor)
  cusedev_pid=$(start "$BIN/cuse-example" nvbench-cusedev)
  samework_pid=$(start "$SAMEWORK" nvbench-samework)
  echo "== process_vm detail (per ioctl; local iovecs, remote iovecs, result)"
  for kind in "${KINDS[@]}"; do
    per=2
    [[ $kind == rm-alloc ]] && per=4 # nv-bench runs each call twice; an alloc+free pair is 2
    for n in 1 $((N + 1)); do
      strace -f -qq -e trace=process_vm_readv,process_vm_writev -e signal=none -o "$tmp/v.$n" \
        "$NVPROXY" exec --driver sim --memory process-vm -- \
        "$BIN/nv-bench" "$kind" --iters "$n" --batches 1 --warmup 0 >/dev/null 2>&1
    done
    vmreport "nvproxy --memory process-vm, $kind (the daemon)" "$tmp/v.1" "$tmp/v.$((N + 1))" $((per * N))
    for n in 1 $((N + 1)); do
      strace -f -qq -e trace=process_vm_readv,process_vm_writev -e signal=none -o "$tmp/w.$n" \
        -p "$samework_pid" 2>/dev/null &
      st=$!
      sleep 1
      "$BIN/nv-bench" "samework-$kind" --iters "$n" --batches 1 --warmup 0 >/dev/null 2>&1
      kill -INT "$st"
      wait "$st" 2>/dev/null || true
    done
    vmreport "same-work floor, samework-$kind (the server)" "$tmp/w.1" "$tmp/w.$((N + 1))" $((per * N))
  done
  if ((DETAIL_ONLY)); then
    kill "$floor_pid" "$cusedev_pid" "$samework_pid" 2>/dev/null || true
    exit 0
  fi
  device "C floor, 1 round trip (floor1)" "$floor_pid" floor1 /dev/nvbench-floor
  device "C floor, 3 round trips (floor3)" "$floor_pid" floor3 /dev/nvbench-floor
  device "cuse-dev, 1 round trip (cusedev1)" "$cusedev_pid" cusedev1 /dev/nvbench-cusedev
  device "cuse-dev, 3 round trips (cusedev3)" "$cusedev_pid" cusedev3 /dev/nvbench-cusedev
  for kind in "${KINDS[@]}"; do
    per=1
    [[ $kind == rm-alloc ]] && per=2
    device "same-work floor, samework-$kind" "$samework_pid" "samework-$kind" /dev/nvbench-samework "$per"
  done
  kill "$floor_pid" "$cusedev_pid" "$samework_pid" 2>/dev/null || true
  for mem in process-vm retry; do
    for kind in "${KINDS[@]}"; do
      for n in 1 $((N + 1)); do
        strace -f -c -o "$tmp/p.$n" "$NVPROXY" exec --driver sim --memory "$mem" -- \
          "$BIN/nv-bench" "$kind" --iters "$n" --batches 1 --warmup 0 >/dev/null 2>&1
      done
      per=2
      [[ $kind == rm-alloc ]] && per=4 # an alloc+free pair is two ioctls
      N=$((per * N)) report "nvproxy --memory $mem, $kind (daemon + client; per ioctl)" "$tmp/p.1" "$tmp/p.$((N + 1))"
    done
  done
  exit 0
fi

command -v strace >/dev/null || apt-get install -y -qq strace >/dev/null
if ! pkg-config --exists fuse3 2>/dev/null; then apt-get install -y -qq gcc libfuse3-dev pkg-config >/dev/null; fi
export CARGO_TARGET_DIR=$TARGET
mkdir -p "$TARGET/bench"
# shellcheck disable=SC2046  # pkg-config prints several words on purpose
gcc -O2 -Wall -Wextra -o "$FLOOR" tests/bench/cuse_floor.c $(pkg-config --cflags --libs fuse3)
# shellcheck disable=SC2046
gcc -O2 -Wall -Wextra -o "$SAMEWORK" tests/bench/cuse_samework.c $(pkg-config --cflags --libs fuse3)
cargo build --release -q -p tests --bin nv-bench --bin cuse-example
build_nvproxy --vm
detail=()
((DETAIL_ONLY)) && detail=(--detail-only)
tests/vm/cuse-vm --timeout 1800 -- bash "$ROOT/tests/bench/syscalls.sh" --guest --n "$N" "${detail[@]}"
