#!/usr/bin/env bash
# The README's run command: builds nvproxy (debug build, target/debug) and serves the
# instances of a config file (default: examples/config.toml, which uses the simulated driver: no
# GPU needed). Run it as root. `./run.sh --help` prints the usage below.
usage() {
  cat <<USAGE
usage: ./run.sh [--vm] [CONFIG] [-- COMMAND...]

  ./run.sh [CONFIG]                serve CONFIG (default examples/config.toml) until Ctrl-C, and
                               print what to try from another shell
  ./run.sh [CONFIG] -- COMMAND...  serve CONFIG, run COMMAND (e.g. \`target/debug/nvproxy run
                               --instance job42 -- PROGRAM\`), stop; exits with COMMAND's status
  ./run.sh --vm [CONFIG] [-- ...]  the same inside a throwaway VM whose kernel has CUSE
                               (tests/vm/cuse-vm; without COMMAND a short demo)
  ./run.sh -h | --help             this text

Natively, each instance uses CUSE where /dev/cuse works and the socket transport otherwise
(transport = "auto"). Only a config that asks for transport = "cuse" on a kernel without
CUSE goes to the VM by itself. Needs root.
USAGE
}
set -euo pipefail
cd "$(dirname "$0")"
bin=target/debug

in_vm=0 vm=0
case ${1:-} in
  -h | --help) usage; exit 0 ;;
  --in-vm) in_vm=1; shift ;;   # internal: the part that runs in the VM
  --vm) vm=1; shift ;;
esac
config=examples/config.toml
if [[ $# -gt 0 && $1 != -- ]]; then
  [[ $1 != -* ]] || { echo "run.sh: unknown option $1" >&2; usage >&2; exit 2; }
  config=$1; shift
fi
if [[ $# -gt 0 ]]; then
  [[ $1 == -- ]] || { usage >&2; exit 2; }
  shift
fi
[[ -f $config ]] || { echo "run.sh: $config: no such config file" >&2; exit 2; }
cmd=("$@")

# The demo: a program through an instance, and the instance API around it.
demo() {
  local first=$1
  echo "run.sh: \$ nvproxy instance list" >&2
  "$bin/nvproxy" instance list
  echo "run.sh: $bin/nvfe-client init through /dev/nvidiactl and /dev/nvidia0 of instance $first" >&2
  "$bin/nvproxy" run --instance "$first" -- "$bin/nvfe-client" init || return
  echo "run.sh: \$ nvproxy instance create demo --gpus 0; nvproxy instance list; nvproxy instance rm demo" >&2
  "$bin/nvproxy" instance create demo --gpus 0 || return
  "$bin/nvproxy" instance list
  "$bin/nvproxy" instance rm demo || return
  echo "run.sh: \$ nvproxy instance upgrade $first (a new worker process takes it over live)" >&2
  "$bin/nvproxy" instance upgrade "$first" || return
  "$bin/nvproxy" run --instance "$first" -- "$bin/nvfe-client" init >/dev/null || return
  echo "run.sh: \$ nvproxy metrics (workers, and how many ioctls $first answered)" >&2
  "$bin/nvproxy" metrics | grep -E "^nvproxy_workers |^nvproxy_ioctl_duration_seconds_count\{instance=\"$first\"" || return
}

# Serves $config in the background, runs the command (default: the demo), stops the daemon.
serve_and_run() {
  local out=${TMPDIR:-/tmp}/nvproxy-run.$$.out log=${TMPDIR:-/tmp}/nvproxy-run.$$.log pid first
  local rc=0 serve_rc=0
  "$bin/nvproxy" serve --config "$config" >"$out" 2>"$log" &
  pid=$!
  for _ in $(seq 300); do
    grep -q '^READY' "$out" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  if ! grep -q '^READY' "$out"; then
    echo "run.sh: nvproxy serve --config $config did not get ready; its log:" >&2
    cat "$log" >&2
    kill "$pid" 2>/dev/null || true
    return 1
  fi
  first=$(sed -n 's/^READY \([^ ]*\).*/\1/p' "$out")
  echo "run.sh: serving $config: instances $(sed -n 's/^READY //p' "$out")" >&2
  if ((${#cmd[@]})); then
    "${cmd[@]}" || rc=$?
  else
    demo "$first" || rc=$?
  fi
  kill -TERM "$pid"
  wait "$pid" || serve_rc=$?
  ((rc)) || rc=$serve_rc
  echo "run.sh: daemon log (tail):" >&2
  tail -n 6 "$log" >&2
  rm -f "$out" "$log"
  return "$rc"
}

if ((in_vm)); then serve_and_run; exit; fi

if [[ $(id -u) != 0 ]]; then
  echo "run.sh: nvproxy needs root (for /dev/cuse and mount namespaces): run $0 as root" >&2
  exit 1
fi
echo "run.sh: building nvproxy, its mmap shim and the test clients into $bin (the first build takes a few minutes)" >&2
cargo build -q -p daemon -p preload -p tests

# What serve would refuse, said here before anything starts.
"$bin/nvproxy" check-config "$config" >/dev/null

# What to try from another shell while the daemon serves (NVIDIA's clients when their
# userspace has been fetched: tests/nvidia-userspace/fetch.sh VERSION).
next_steps() {
  local first=$1 n=$bin/nvproxy version u
  version=$("$n" check-config "$config" | sed -n 's/^driver: sim ([0-9]* GPU(s), version \(.*\))$/\1/p')
  echo "run.sh: serving $config until Ctrl-C. From another shell, as root, in $PWD:"
  echo "  $n instance list"
  echo "  $n run --instance $first -- $bin/nvfe-client init"
  if [[ -n $version ]]; then
    u=target/nvidia-userspace/$version
    if [[ -f $u/.complete ]]; then
      echo "  $n run --instance $first -- env LD_LIBRARY_PATH=$u/lib $u/bin/nvidia-smi -L"
      echo "  $n run --instance $first -- env LD_LIBRARY_PATH=$u/lib $bin/cuda-probe init"
    else
      echo "  (NVIDIA's nvidia-smi and libcuda $version: tests/nvidia-userspace/fetch.sh $version, then run.sh prints their commands)"
    fi
  fi
  echo "  $n instance create demo --gpus 0 && $n instance list && $n instance rm demo"
  echo "  $n metrics | grep ^nvproxy_ioctl"
}

# Natively unless asked for the VM, or a config that wants CUSE meets a kernel without it.
[[ -c /dev/cuse ]] || modprobe cuse 2>/dev/null || true
native=1
if ((vm)); then
  native=0
elif [[ ! -c /dev/cuse ]] && "$bin/nvproxy" check-config "$config" | grep -q ', transport cuse'; then
  echo "run.sh: $config asks for transport = \"cuse\" and this kernel has no CUSE" >&2
  native=0
fi
if ((native)); then
  if ((${#cmd[@]})); then
    rc=0; serve_and_run || rc=$?
    echo "run.sh: ran ${cmd[*]} against the instances of $config (exit status $rc)" >&2
    exit "$rc"
  fi
  first=$("$bin/nvproxy" check-config "$config" | sed -n 's/^instance \([^:]*\):.*/\1/p' | head -n1)
  next_steps "${first:-NAME}" >&2
  exec "$bin/nvproxy" serve --config "$config"
fi

echo "run.sh: running in a throwaway VM whose kernel has CUSE (tests/vm/cuse-vm; the guest is emulated: about 10 s)" >&2
# The VM sees the checkout (cuse-vm shares the current directory, read-write at the same path)
# and the host's other files read-only, except its own /tmp, /var/tmp, /run and /dev/shm.
here=$(pwd -P)
case $(realpath -m "$config") in
  "$here"/*) ;;
  /tmp/*|/var/tmp/*|/run/*|/dev/shm/*)
    echo "run.sh: $config is in a directory the VM does not see (it has its own /tmp, /var/tmp, /run and /dev/shm): put it under $here or another directory" >&2
    exit 1 ;;
esac
tests/vm/cuse-vm --prepare >/dev/null
rc=0
tests/vm/cuse-vm -- "$PWD/run.sh" --in-vm "$config" ${cmd[@]+-- "${cmd[@]}"} || rc=$?
if ((rc)); then
  echo "run.sh: that failed in the VM (exit status $rc); the messages above say why. The demo alone: $0 --vm" >&2
elif ((${#cmd[@]})); then
  echo "run.sh: that ran ${cmd[*]} against the instances of $config, in a VM (exit status $rc). Next: docs/running.md \"NVIDIA's own clients without a GPU\" runs NVIDIA's nvidia-smi through nvproxy in the VM" >&2
else
  echo "run.sh: that served the instances of $config, listed them, initialised nvfe-client (the frontend of a CUDA initialisation) through the first one, created and removed an instance, upgraded the first one's worker live and printed metrics, in a VM (exit status $rc). Next: $0 $config -- $bin/nvproxy run --instance monitor -- $bin/nvfe-client init runs a program through an instance the same way; tests/vm/cuse-vm -- $bin/nvproxy exec --driver sim -- $bin/nvfe-client init gives one program its own instance, no config needed" >&2
fi
exit "$rc"
