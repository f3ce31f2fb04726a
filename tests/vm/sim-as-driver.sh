#!/usr/bin/env bash
# The simulated driver in the place of the real one, to run RealHostDriver's ioctl path (buffers
# assembled in the worker, nested pointers patched, ioctl(2) on a real fd, fds handed back)
# without a GPU (issue 26, item 0). Runs as root where /dev/cuse exists (the project's VM:
#   tests/vm/cuse-vm -- tests/vm/sim-as-driver.sh [CMD...]).
# An inner `nvproxy serve --driver sim` serves the simulated driver on CUSE nodes; in a mount
# namespace of its own, this script makes them the host's driver: /dev/nvidiactl, /dev/nvidia0,
# /dev/nvidia-uvm (mknod of the inner nodes' numbers) and /proc/driver/nvidia (a tmpfs with the
# simulated driver's files, copied out of a `--driver sim` exec). Then an outer
# `nvproxy exec --driver host` (RealHostDriver) serves CMD (default: nvfe-client init) over it.
# No production code knows about this: the inner proxy reads the outer worker's patched buffers
# with process_vm_readv as it reads any client's, and resolves the fds it is handed
# (REGISTER_FD) by pidfd_getfd like any client's.
# What cannot work: RealHostDriver hands the tenant a dup of its host fd to mmap (RM memory
# mappings, the UVM file), and CUSE has no mmap: those mmaps fail with ENODEV.
# SIM_AS_DRIVER_STATE=1 adds a live upgrade and a checkpoint/reload/restore (see below).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-$PWD/target/debug}
N=$BIN/nvproxy
# The client may come from another build than the daemon (the kernel tests run a release daemon
# with the test build's clients).
CLIENT=${CLIENT:-$BIN/nvfe-client}
if [[ -z ${NVPROXY_SIM_AS_DRIVER_NS:-} ]]; then
  exec unshare --mount --propagation private env NVPROXY_SIM_AS_DRIVER_NS=1 "$0" "$@"
fi
(($#)) || set -- "$CLIENT" init --expect-gpus 1
scratch=$(mktemp -d)
inner_pid= outer_pid= hold_pid=
cleanup() {
  for p in $hold_pid $outer_pid; do kill -TERM "$p" 2>/dev/null || true; done
  [[ -n $inner_pid ]] && kill -TERM "$inner_pid" 2>/dev/null && wait "$inner_pid" 2>/dev/null
  rm -rf "$scratch"
}
trap cleanup EXIT
# The simulated driver's /proc/driver/nvidia, as a --driver sim exec shows it.
NVPROXY_RUN_DIR=$scratch/copy "$N" exec --driver sim --transport cuse --no-preload -- \
  sh -c "cp -r /proc/driver/nvidia '$scratch/procfs'" >/dev/null
# The inner daemon: the simulated driver on CUSE nodes, transparent (audit mode); its nodes
# made the host's driver's (again after a reload: a fresh daemon's nodes get new numbers).
cat >"$scratch/inner.toml" <<TOML
driver = "sim"
[sim]
gpus = 1
[cdi]
spec = ""
[[instance]]
name = "simdrv"
gpus = [0]
mode = "audit"
transport = "cuse"
TOML
start_inner() {
  : >"$scratch/inner.out"
  RUST_LOG=${INNER_LOG:-info} NVPROXY_RUN_DIR=$scratch/inner "$N" serve --config "$scratch/inner.toml" --check-leaks \
    >"$scratch/inner.out" 2>>"$scratch/inner.err" &
  inner_pid=$!
  for _ in $(seq 600); do grep -q READY "$scratch/inner.out" && break; sleep 0.1; done
  grep -q READY "$scratch/inner.out" || { cat "$scratch/inner.err" >&2; exit 1; }
  for n in nvidiactl nvidia0 nvidia-uvm; do
    read -r maj min < <(stat -c '%t %T' "/dev/nvproxy/simdrv/$n")
    rm -f "/dev/$n"
    mknod -m 0666 "/dev/$n" c $((16#$maj)) $((16#$min))
  done
}
start_inner
mount -t tmpfs -o mode=0755 sim-as-driver /proc/driver
cp -r "$scratch/procfs" /proc/driver/nvidia
echo "sim-as-driver: /dev/nvidiactl $(stat -c '%t:%T' /dev/nvidiactl), driver $(cat /proc/driver/nvidia/version | head -1)" >&2
rc=0
RUST_LOG=${OUTER_LOG:-warn} NVPROXY_RUN_DIR=$scratch/outer "$N" exec --driver host --gpus 0 --transport cuse -- "$@" || rc=$?
# SIM_AS_DRIVER_BASELINE=N: the same client on the same device, N times directly (the nodes
# as a raw driver) and N times through nvproxy --driver host, alternating; prints the medians of
# nvfe-client init's elapsed_ms and their ratio (a figure, never a failure).
if ((rc == 0 && ${SIM_AS_DRIVER_BASELINE:-0} > 0)); then
  raw=() prox=()
  ms() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read().splitlines()[-1])["elapsed_ms"])'; }
  for _ in $(seq "$SIM_AS_DRIVER_BASELINE"); do
    raw+=("$("$CLIENT" init --expect-gpus 1 2>/dev/null | ms)")
    prox+=("$(NVPROXY_RUN_DIR=$scratch/outer "$N" exec --driver host --gpus 0 --transport cuse -- \
      "$CLIENT" init --expect-gpus 1 2>/dev/null | ms)")
  done
  python3 - "${raw[*]}" "${prox[*]}" <<'PY' >&2
import statistics as st, sys
raw, prox = ([float(x) for x in a.split()] for a in sys.argv[1:3])
r, p = st.median(raw), st.median(prox)
print(f"sim-as-driver baseline: nvfe-client init raw {r:.1f} ms, through nvproxy --driver host {p:.1f} ms: {p / r:.2f}x (medians of {len(raw)})")
PY
fi
# SIM_AS_DRIVER_STATE=1: an instance's state on the real-driver path. An outer `nvproxy serve
# --driver host` serves instance g; `nvfe-client hold` keeps an RM client, a device and a
# subdevice through (1) a live upgrade (the host files, real fds, handed to the new worker by
# SCM_RIGHTS), (2) a checkpoint, a driver reload (the inner daemon stops: every file of the
# outer worker is dead; a fresh one serves new nodes) and a restore by replay; after each the
# client checks its old handles, then frees; the fresh driver must hold nothing at the end.
if ((rc == 0 && ${SIM_AS_DRIVER_STATE:-0})); then
  R=$scratch/outer-serve
  st() { echo "sim-as-driver state: $*" >&2; }
  fail() { st "FAILED: $*"; for f in outer.err hold.out hold.err; do echo "--- $f" >&2; cat "$scratch/$f" >&2 || true; done; rc=1; }
  wait_line() { # FILE PATTERN COUNT: the COUNT-th line matching PATTERN, within 60 s
    for _ in $(seq 600); do
      (($(grep -c -- "$2" "$1" 2>/dev/null || true) >= $3)) && { grep -- "$2" "$1" | sed -n "$3p"; return 0; }
      sleep 0.1
    done
    return 1
  }
  cat >"$scratch/outer.toml" <<TOML
driver = "host"
[cdi]
spec = ""
[[instance]]
name = "g"
gpus = [0]
transport = "cuse"
TOML
  RUST_LOG=${OUTER_LOG:-warn} NVPROXY_RUN_DIR=$R "$N" serve --config "$scratch/outer.toml" \
    >"$scratch/outer.out" 2>"$scratch/outer.err" &
  outer_pid=$!
  wait_line "$scratch/outer.out" READY 1 >/dev/null || fail "the outer serve did not start"
  mkfifo "$scratch/hold.in"
  NVPROXY_RUN_DIR=$R "$N" run --instance g -- "$CLIENT" hold \
    <"$scratch/hold.in" >"$scratch/hold.out" 2>"$scratch/hold.err" &
  hold_pid=$!
  exec 3>"$scratch/hold.in"
  check() { # N: the N-th check answers NV_OK
    echo check >&3
    local l
    l=$(wait_line "$scratch/hold.out" '"check"' "$1") && [[ $l == *'"ok":true'* ]] || { fail "check $1: ${l:-no answer}"; return 1; }
    st "check $1 after $2: $l"
  }
  if ((rc == 0)) && wait_line "$scratch/hold.out" '"client"' 1 >/dev/null; then
    if NVPROXY_RUN_DIR=$R "$N" instance upgrade g >&2; then
      check 1 "a live upgrade" || true
    else
      fail "instance upgrade g"
    fi
    if ((rc == 0)) && NVPROXY_RUN_DIR=$R "$N" instance checkpoint g "$scratch/g.ckpt.json" >&2; then
      kill -TERM "$inner_pid"; wait "$inner_pid" || true # it leaked the outer's objects: expected
      start_inner
      st "driver reloaded: /dev/nvidiactl $(stat -c '%t:%T' /dev/nvidiactl)"
      if NVPROXY_RUN_DIR=$R "$N" instance restore "$scratch/g.ckpt.json" >&2; then
        check 2 "a checkpoint, a driver reload and a restore" || true
      else
        fail "instance restore"
      fi
    elif ((rc == 0)); then
      fail "instance checkpoint g"
    fi
    if ((rc == 0)); then
      echo free >&3
      wait "$hold_pid" && st "the client freed its objects" || fail "the client's free: exit $?"
    fi
  else
    ((rc)) || fail "the client did not start"
  fi
  exec 3>&-
  kill -TERM "$hold_pid" 2>/dev/null || true
  kill -TERM "$outer_pid"
  wait "$outer_pid" || st "the outer serve exited $?"
  outer_pid= hold_pid=
fi
kill -TERM "$inner_pid"
wait "$inner_pid" || { echo "sim-as-driver: the inner daemon exited $? (3: the simulated driver leaked)" >&2; rc=1; }
inner_pid=
cat "$scratch/inner.err" >&2
exit $rc
