#!/usr/bin/env bash
# What ./test.sh needs beyond the Rust toolchain, checked before anything is built or
# downloaded: python3 (the kernel-test runner, the layout check), util-linux's unshare, nsenter
# and setpriv (the native suites' namespaces), gcc (the shim's C tests) and podman (the
# container suite, Debian's podman with crun and conmon). The VM that the CUSE suites use on a
# kernel without CUSE installs its own packages on first use (tests/vm/cuse-vm --prepare).
#
# Missing ones are installed with apt-get when this runs as root on a Debian-like system (as
# .ci/run does); otherwise, or with NVPROXY_NO_INSTALL=1, it says in one line what to install
# and fails.
set -euo pipefail
declare -A package_of=(
  [python3]=python3 [unshare]=util-linux [nsenter]=util-linux [setpriv]=util-linux
  [gcc]=gcc [podman]=podman
)
missing=()
for tool in python3 unshare nsenter setpriv gcc podman; do
  command -v "$tool" >/dev/null 2>&1 && continue
  p=${package_of[$tool]}
  [[ " ${missing[*]} " == *" $p "* ]] || missing+=("$p")
done
((${#missing[@]})) || exit 0
if [[ $(id -u) == 0 && -z ${NVPROXY_NO_INSTALL:-} ]] && command -v apt-get >/dev/null; then
  echo "prerequisites: installing ${missing[*]} (apt-get)" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  exit 0
fi
echo "prerequisites: missing ${missing[*]}: install them (as root: apt-get install ${missing[*]}) and run ./test.sh again" >&2
exit 1
