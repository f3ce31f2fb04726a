#!/usr/bin/env bash
# The README's walk, natively on this host (issue 21): `./run.sh` serves examples/config.toml
# until Ctrl-C (CUSE where /dev/cuse works, else the socket transport) and prints what to try
# from another shell; each printed command is run from here, as another shell would, and must
# succeed (instance list, a client, nvidia-smi -L and cuda-probe when NVIDIA's userspace is
# fetched, create/list/rm, metrics); then Ctrl-C (SIGINT) stops the daemon cleanly.
# Runs in a private mount namespace with tmpfs on /run and /tmp: the host's /run/nvproxy and
# /tmp are untouched.
# Needs root; `./test.sh` runs it after building.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) != 0 ]]; then echo "readme-walk: SKIPPED (needs root)" >&2; exit 0; fi
if [[ -z ${NVPROXY_README_WALK_NS:-} ]]; then
  exec unshare --mount --propagation private env NVPROXY_README_WALK_NS=1 "$0" "$@"
fi
mount -t tmpfs -o mode=0755 readme-walk /run
# examples/config.toml writes its audit logs under /tmp: the walk's own /tmp keeps them.
mount -t tmpfs -o mode=1777 readme-walk-tmp /tmp
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fail() { echo "readme-walk: FAILED: $*" >&2; echo "--- run.sh stderr:" >&2; cat "$scratch/err" >&2; exit 1; }

./run.sh >"$scratch/out" 2>"$scratch/err" &
pid=$!
for _ in $(seq 600); do
  grep -q '^READY' "$scratch/out" && break
  kill -0 "$pid" 2>/dev/null || fail "./run.sh exited before READY"
  sleep 0.5
done
grep -q '^READY' "$scratch/out" || { kill "$pid"; fail "no READY within 300 s"; }

mapfile -t cmds < <(sed -n 's/^  \(target\/debug\/nvproxy .*\)$/\1/p' "$scratch/err")
((${#cmds[@]} >= 4)) || { kill "$pid"; fail "run.sh printed ${#cmds[@]} commands to try"; }
version=$(target/debug/nvproxy check-config examples/config.toml | sed -n 's/^driver: sim ([0-9]* GPU(s), version \(.*\))$/\1/p')
if [[ -f target/nvidia-userspace/$version/.complete ]]; then
  printf '%s\n' "${cmds[@]}" | grep -q 'nvidia-smi -L' || { kill "$pid"; fail "no nvidia-smi command printed"; }
  printf '%s\n' "${cmds[@]}" | grep -q 'cuda-probe init' || { kill "$pid"; fail "no cuda-probe command printed"; }
else
  echo "readme-walk: NVIDIA's $version userspace is not fetched: nvidia-smi and cuda-probe not tried (tests/nvidia-userspace/fetch.sh $version)" >&2
fi
for c in "${cmds[@]}"; do
  echo "readme-walk: \$ $c" >&2
  if ! bash -c "$c" >"$scratch/cmd" 2>&1; then
    cat "$scratch/cmd" >&2
    kill "$pid"
    fail "$c"
  fi
  case $c in
    *nvidia-smi*) grep -q '^GPU 0: ' "$scratch/cmd" || { kill "$pid"; fail "nvidia-smi -L listed no GPU"; } ;;
    *cuda-probe*) grep -q '"ok":true' "$scratch/cmd" || { kill "$pid"; fail "cuda-probe did not say ok"; } ;;
    *metrics*) grep -q '^nvproxy_ioctl' "$scratch/cmd" || { kill "$pid"; fail "no ioctl metrics"; } ;;
  esac
done
kill -INT "$pid"
rc=0
wait "$pid" || rc=$?
((rc == 0)) || fail "serve exited with status $rc after Ctrl-C"
echo "readme-walk: ok (${#cmds[@]} commands)" >&2
