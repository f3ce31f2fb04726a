# Sourced by the benchmarks: `build_nvproxy [--vm]` builds the nvproxy they measure, the release
# build that deploy/build-release.sh makes for installing (profile-guided: trained on NVIDIA's
# libcuda through the proxy; with --vm also on CUSE in the VM), and exports NVPROXY as its path
# (guest runs inherit it). NVPROXY_PGO=0 in the environment measures a plain release build, and
# so does a host that cannot make the profile-guided one (no llvm-tools, not root), with a
# warning.
build_nvproxy() {
  local args=("$@") path rc=0
  [[ ${NVPROXY_PGO:-1} == 1 ]] || args=(--no-pgo)
  path=$("$ROOT/deploy/build-release.sh" "${args[@]}") || rc=$?
  if ((rc == 3)); then
    echo "build-nvproxy: WARNING: no profile-guided build here; measuring a plain release build" >&2
    rc=0
    path=$("$ROOT/deploy/build-release.sh" --no-pgo) || rc=$?
  fi
  ((rc == 0)) || return "$rc"
  echo "build-nvproxy: measuring $path" >&2
  export NVPROXY=$path
}
