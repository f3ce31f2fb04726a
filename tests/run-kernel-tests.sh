#!/usr/bin/env bash
# Runs the test binaries that need a real kernel CUSE (/dev/cuse), with `--ignored`:
#   - natively, where /dev/cuse exists (or `modprobe cuse` makes it appear) and we are root;
#   - otherwise inside a throwaway VM whose kernel has CUSE (tests/vm/cuse-vm).
# These tests are never skipped: a missing /dev/cuse in the chosen mode is a failure.
#
# Usage: tests/run-kernel-tests.sh [TEST_TARGET...]     (default: every target in KERNEL_TESTS)
# Environment: NVPROXY_KERNEL_TESTS=auto|native|vm (default auto)
#              NVIDIA_USERSPACE_DIR is set for real_clients_kernel (tests/nvidia-userspace/fetch.sh).
#              KERNEL_TEST_JOBS: parallel VM lanes (default: CPU count, at most 3; native: 1).
#              KERNEL_TEST_TIMEOUT: seconds one suite's VM may run (default 1800: a hang guard; real_clients_kernel
#              takes ~640 s in two lanes on two cores).
#              KERNEL_TEST_PROFILE: the build of the daemon and the shim under test, release (default) or
#              debug. Under the VM's software emulation a debug daemon doubles the suites' time (a libcuda
#              or nvidia-smi test: 26 s debug, 12 s release); the native suites (./test.sh's cargo test)
#              and the fuzzers run the same request path with debug assertions and overflow checks.
#              CARGO_TARGET_DIR as usual; CUSE_VM_* as documented in tests/vm/cuse-vm.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd -P)

# Integration test targets of the `tests` crate whose tests are #[ignore]d because they need /dev/cuse.
KERNEL_TESTS=(cuse_kernel proxy_kernel landlock_kernel mmap_kernel audit_kernel real_clients_kernel container_kernel)
targets=("$@")
((${#targets[@]})) || targets=("${KERNEL_TESTS[@]}")

mode=${NVPROXY_KERNEL_TESTS:-auto}
if [[ $mode == auto ]]; then
  mode=vm
  if [[ $(id -u) == 0 ]]; then
    [[ -c /dev/cuse ]] || modprobe cuse 2>/dev/null || true
    [[ -c /dev/cuse ]] && mode=native
  fi
fi
profile=${KERNEL_TEST_PROFILE:-release}
case $profile in
  release) profile_args=(--release) ;;
  debug) profile_args=() ;;
  *) echo "run-kernel-tests: KERNEL_TEST_PROFILE must be release or debug, not $profile" >&2; exit 2 ;;
esac
echo "run-kernel-tests: mode=$mode daemon=$profile targets=${targets[*]}" >&2

target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
# proxy_kernel, mmap_kernel and audit_kernel run the daemon's binary (which wants the preload shim
# beside it): build both and tell the tests where nvproxy is.
for t in "${targets[@]}"; do
  if [[ $t == proxy_kernel || $t == mmap_kernel || $t == audit_kernel || $t == real_clients_kernel || $t == container_kernel ]]; then
    cargo build "${profile_args[@]}" -p daemon -p preload  # nvproxy and its mmap shim libnvproxy_preload.so
    export NVPROXY_BIN="$target_dir/$profile/nvproxy"
  fi
  if [[ $t == real_clients_kernel || $t == audit_kernel || $t == container_kernel ]]; then
    # NVIDIA's libcuda/NVML/nvidia-smi from Debian's non-free archive, unpacked under the target
    # dir (fetched here, on the host: the VM has no network). real_clients_kernel runs both
    # versions, audit_kernel and container_kernel 535.261.03.
    export NVIDIA_USERSPACE_DIR="$target_dir/nvidia-userspace"
    for v in 535.216.03 535.261.03 535.309.01; do
      NVIDIA_USERSPACE_CACHE="$NVIDIA_USERSPACE_DIR" tests/nvidia-userspace/fetch.sh "$v" >/dev/null
    done
  fi
  if [[ $t == container_kernel ]] && ! command -v podman >/dev/null; then
    # Debian's podman (with crun and conmon) runs the containers; the VM runs the host's binaries.
    echo "run-kernel-tests: container_kernel needs podman: apt-get install podman" >&2
    exit 1
  fi
done

args=()
for t in "${targets[@]}"; do args+=(--test "$t"); done
# Build the test binaries (and the crate's bins, which the tests start) and collect their paths.
mapfile -t bins < <(cargo test -p tests "${args[@]}" --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"].get("test"):
        print(m["executable"])
')
if ((${#bins[@]} != ${#targets[@]})); then
  echo "run-kernel-tests: expected ${#targets[@]} test binaries, cargo built ${#bins[@]}" >&2
  cargo test -p tests "${args[@]}" --no-run  # show the build error
  exit 1
fi

# The suites run in parallel lanes (KERNEL_TEST_JOBS, default: the CPU count, at most 3): each
# VM is one emulated CPU, so on a machine without CUSE the lanes use the cores the sequential run
# left idle. The longest suites start first; each suite's output goes to a log printed whole when
# it ends, so lanes never interleave. Natively (one kernel, shared /run) they run one at a time.
jobs=${KERNEL_TEST_JOBS:-$(nproc)}
((jobs > 3)) && jobs=3
[[ $mode == native ]] && jobs=1
# Longest first (seconds measured in CI): the rest follow in the order given.
order=(real_clients_kernel proxy_kernel container_kernel audit_kernel mmap_kernel cuse_kernel landlock_kernel)
sorted=()
for name in "${order[@]}"; do
  for bin in "${bins[@]}"; do [[ $(basename "$bin") == "$name"-* ]] && sorted+=("$bin"); done
done
for bin in "${bins[@]}"; do [[ " ${sorted[*]} " == *" $bin "* ]] || sorted+=("$bin"); done

logs="$target_dir/kernel-tests"
mkdir -p "$logs"
run_one() {
  local bin=$1 name
  name=$(basename "$bin")
  case $mode in
    native) "$bin" --ignored --test-threads=1 ;;
    vm)
      local rw=() mem=()
      # The guest sees the host read-only outside the checkout: a target dir elsewhere (or a
      # link to one, as CI's build cache) is shared writable by its physical path.
      real_target=$(cd "$target_dir" && pwd -P)
      [[ $real_target == "$ROOT"/* ]] || rw=(--rw "$real_target")
      # container_kernel boots systemd in a container next to the daemon: 2 GiB.
      [[ $name == container_kernel-* ]] && mem=(--mem "${CUSE_VM_MEM:-2G}")
      "$ROOT/tests/vm/cuse-vm" --timeout "${KERNEL_TEST_TIMEOUT:-1800}" "${mem[@]}" "${rw[@]}" -- \
        "$bin" --ignored --test-threads=1 ;;
    *) echo "run-kernel-tests: unknown NVPROXY_KERNEL_TESTS=$mode" >&2; return 2 ;;
  esac
}

# Progress while the suites run (their logs are printed whole when each ends): every
# KERNEL_TEST_PROGRESS seconds (default 60), each running suite's tests passed and failed so far.
progress() {
  local f n ok bad
  while sleep "${KERNEL_TEST_PROGRESS:-60}"; do
    for f in "$logs"/*.running; do
      [[ -e $f ]] || continue
      n=$(basename "$f" .running)
      ok=$(grep -c ' \.\.\. ok' "$logs/$n.log" 2>/dev/null || true)
      bad=$(grep -c ' \.\.\. FAILED' "$logs/$n.log" 2>/dev/null || true)
      echo "run-kernel-tests: ... $n: ${ok:-0} passed, ${bad:-0} failed so far, $(($(date +%s) - $(cat "$f"))) s" >&2
    done
  done
}
rm -f "$logs"/*.running
progress &
ticker=$!
trap 'kill "$ticker" 2>/dev/null || true; rm -f "$logs"/*.running' EXIT

declare -A pid_bin=()
status=0
finish() {  # waits for one lane, prints its log
  local pid rc=0 bin name
  wait -n -p pid "${!pid_bin[@]}" || rc=$?
  bin=${pid_bin[$pid]}
  unset "pid_bin[$pid]"
  name=$(basename "$bin")
  rm -f "$logs/${name%-*}.running"
  echo "run-kernel-tests: ===== ${name%-*} ($mode): exit $rc, $(($(date +%s) - ${started[$name]})) s" >&2
  cat "$logs/${name%-*}.log" >&2
  ((rc == 0)) || status=1
}
declare -A started=()
for bin in "${sorted[@]}"; do
  ((${#pid_bin[@]} < jobs)) || finish
  name=$(basename "$bin")
  echo "run-kernel-tests: starting ${name%-*} ($mode, $jobs lanes)" >&2
  started[$name]=$(date +%s)
  echo "${started[$name]}" >"$logs/${name%-*}.running"
  run_one "$bin" >"$logs/${name%-*}.log" 2>&1 &
  pid_bin[$!]=$bin
done
while ((${#pid_bin[@]})); do finish; done
exit $status
