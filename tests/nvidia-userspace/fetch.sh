#!/usr/bin/env bash
# Fetches NVIDIA's userspace (libcuda, NVML, the PTX JIT, nvidia-smi) of one driver version from
# Debian 12's non-free archive and unpacks it into a cache inside the repository's target dir.
# Nothing is installed into the system: the packages' dependencies would pull in the kernel module
# stack, and a machine without a GPU needs none of it.
#
# Usage: tests/nvidia-userspace/fetch.sh VERSION        (e.g. 535.261.03 or 535.216.03)
# Prints (stdout, one per line, shell-assignable):
#   NVIDIA_LIB_DIR=<dir with libcuda.so.1, libnvidia-ml.so.1, libnvidia-ptxjitcompiler.so.1>
#   NVIDIA_SMI=<path of nvidia-smi>
# Environment: NVIDIA_USERSPACE_CACHE  cache root (default <cargo target dir>/nvidia-userspace)
#              NVIDIA_USERSPACE_NO_INSTALL=1  never touch apt sources (fail if the version is unknown)
#
# Where Debian 12 carries 535 (when written): bookworm/non-free 535.261.03-1,
# bookworm-backports/non-free 535.216.03-2~bpo12+1, bookworm-security/non-free 535.309.01-0+deb12u1
# (not a node of nvproxy's version tree). If the configured apt sources do not have the version,
# this adds /etc/apt/sources.list.d/debian-non-free.sources (the non-free component of bookworm,
# bookworm-updates, bookworm-backports and, where a security mirror is configured,
# bookworm-security), with the Debian mirror the machine's own apt sources use
# (tests/debian-mirror.sh; it fails when they name none), and runs apt-get update.
set -euo pipefail
PROG=fetch.sh
die() { echo "$PROG: $*" >&2; exit 1; }

VERSION=${1:-}
[[ $VERSION =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]] || die "usage: $PROG VERSION (e.g. 535.261.03)"
HERE=$(cd "$(dirname "$0")" && pwd -P)
ROOT=$(cd "$HERE/../.." && pwd -P)

# The packages: the driver API, NVML, the PTX JIT (cuModuleLoadData of PTX dlopens it), nvidia-smi.
PKGS=(libcuda1 libnvidia-ml1 libnvidia-ptxjitcompiler1 nvidia-smi)

target_dir() {
  if [[ -n ${CARGO_TARGET_DIR:-} ]]; then echo "$CARGO_TARGET_DIR"; return; fi
  if command -v cargo >/dev/null && command -v python3 >/dev/null; then
    (cd "$ROOT" && cargo metadata --format-version 1 --no-deps 2>/dev/null |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])') && return
  fi
  echo "$ROOT/target"
}
CACHE_ROOT=${NVIDIA_USERSPACE_CACHE:-$(target_dir)/nvidia-userspace}
DEST=$CACHE_ROOT/$VERSION
LIBDIR=$DEST/lib
SMI=$DEST/bin/nvidia-smi

print_result() {
  echo "NVIDIA_LIB_DIR=$LIBDIR"
  echo "NVIDIA_SMI=$SMI"
}

if [[ -f $DEST/.complete ]]; then print_result; exit 0; fi

# ------------------------------------------------------------------ apt sources
APT_UPDATED=0
apt_update() {
  [[ $APT_UPDATED == 1 ]] && return 0
  echo "$PROG: apt-get update" >&2
  apt-get update -qq >/dev/null 2>&1 || apt-get update -q >&2 || die "apt-get update failed"
  APT_UPDATED=1
}

# The apt version string of PKG whose upstream version is VERSION (e.g. 535.216.03-2~bpo12+1).
apt_version() {
  apt-cache madison "$1" 2>/dev/null |
    awk -F'|' -v v="$VERSION" '{gsub(/ /, "", $2); split($2, a, "-"); if (a[1] == v) {print $2; exit}}'
}

# shellcheck source=../debian-mirror.sh
. "$HERE/../debian-mirror.sh"
NON_FREE_SOURCES=/etc/apt/sources.list.d/debian-non-free.sources

# Adds the non-free source (once: a version it does not have is not in Debian 12).
ensure_non_free_source() {
  local uri sec
  [[ -f $NON_FREE_SOURCES ]] && return 1
  [[ ${NVIDIA_USERSPACE_NO_INSTALL:-0} == 1 ]] && die "no libcuda1 $VERSION in the configured apt sources, and NVIDIA_USERSPACE_NO_INSTALL=1 forbids adding Debian's non-free component (apt-cache madison libcuda1 lists what there is)"
  [[ $(id -u) == 0 ]] || die "no libcuda1 $VERSION in the configured apt sources; run as root to add Debian's non-free component ($NON_FREE_SOURCES)"
  (. /etc/os-release 2>/dev/null && [[ ${VERSION_CODENAME:-} == bookworm ]]) ||
    die "no libcuda1 $VERSION in the configured apt sources; only Debian 12 (bookworm) gets its non-free source added automatically"
  uri=$(debian_mirror debian) ||
    die "no Debian mirror in the apt sources (/etc/apt/sources.list, /etc/apt/sources.list.d/*.list, *.sources) to add the non-free component from: configure one (a deb source whose URI ends in /debian), or add non-free to it yourself"
  sec=$(debian_mirror debian-security) || sec=
  echo "$PROG: adding apt source $NON_FREE_SOURCES (non-free from $uri${sec:+ and $sec})" >&2
  {
    printf 'Types: deb\nURIs: %s\nSuites: bookworm bookworm-updates bookworm-backports\nComponents: non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$uri"
    [[ -z $sec ]] ||
      printf '\nTypes: deb\nURIs: %s\nSuites: bookworm-security\nComponents: non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$sec"
  } >"$NON_FREE_SOURCES"
  APT_UPDATED=0
}

command -v apt-get >/dev/null || die "apt-get not found (Debian 12 only)"
command -v dpkg-deb >/dev/null || die "dpkg-deb not found"

AVER=$(apt_version libcuda1)
if [[ -z $AVER ]] && ensure_non_free_source; then
  apt_update
  AVER=$(apt_version libcuda1)
fi
[[ -n $AVER ]] || die "no libcuda1 $VERSION in the configured apt sources (apt-cache madison libcuda1 lists what there is)"

# ------------------------------------------------------------------ download + unpack
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.lock"
flock 9
if [[ -f $DEST/.complete ]]; then print_result; exit 0; fi
rm -rf "$DEST"
mkdir -p "$DEST/debs" "$DEST/root" "$LIBDIR" "$DEST/bin"
# apt-get download writes into the current directory; _apt cannot write into root's dirs, which
# only costs a warning (the download then runs unsandboxed).
specs=()
for p in "${PKGS[@]}"; do specs+=("$p=$AVER"); done
echo "$PROG: downloading ${specs[*]}" >&2
(cd "$DEST/debs" && apt-get download -q "${specs[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2) ||
  die "apt-get download failed"
for deb in "$DEST"/debs/*.deb; do dpkg-deb -x "$deb" "$DEST/root"; done

# Debian keeps them under .../nvidia/current (update-alternatives links them into the system);
# give each library its soname link in one flat dir.
src_lib=$DEST/root/usr/lib/x86_64-linux-gnu/nvidia/current
for lib in libcuda libnvidia-ml libnvidia-ptxjitcompiler; do
  real=$src_lib/$lib.so.$VERSION
  [[ -f $real ]] || die "$lib.so.$VERSION missing from the packages"
  ln -sfr "$real" "$LIBDIR/$lib.so.1"
  ln -sfr "$real" "$LIBDIR/$lib.so"
done
[[ -x $DEST/root/usr/lib/nvidia/current/nvidia-smi ]] || die "nvidia-smi missing from the package"
ln -sfr "$DEST/root/usr/lib/nvidia/current/nvidia-smi" "$SMI"
echo "$AVER" >"$DEST/apt-version"
rm -rf "$DEST/debs"
touch "$DEST/.complete"
print_result
