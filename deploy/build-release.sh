#!/usr/bin/env bash
# build-release.sh: the release nvproxy, built profile-guided (PGO). The binary to install (and
# the one the benchmarks measure). Three steps:
#   1. an instrumented release build (`-Cprofile-generate`, its own target dir: pgo-instr/);
#   2. training: NVIDIA's libcuda (Debian's userspace, tests/nvidia-userspace/fetch.sh) runs a
#      CUDA program's start-up and work (`cuda-probe init ctx mem stream host-alloc managed
#      alloc-loop`, one process and then two at once) and `nvfe-client init` through
#      `nvproxy exec --driver sim` on the transport this host serves (CUSE where /dev/cuse
#      works, else the socket transport), and with --vm the same in the VM on CUSE
#      (tests/vm/cuse-vm, 2 vCPUs); every nvproxy process writes its counts at exit;
#   3. the release build again with `-Cprofile-use` of the merged counts (target dir pgo/).
# The training is the proxy's path as CUDA drives it, not the benchmarks' requests. Steps 1 and
# 2 are skipped while their inputs are unchanged: a stamp beside the counts keys them by the
# sources (every file git tracks or would track, Markdown and fuzz/ aside, by content, not by
# path, so a clone elsewhere reuses them), rustc's version, RUSTFLAGS and the libcuda version.
#
# Usage: deploy/build-release.sh [--vm] [--no-pgo] [--quiet]
#   --vm      also train CUSE in the VM (a host without CUSE; needs what tests/vm/cuse-vm needs)
#   --no-pgo  a plain release build (target/release/nvproxy), no training
#   --quiet   no progress lines
# Prints the built binary's path on stdout: <target>/pgo/release/nvproxy (or
# <target>/release/nvproxy with --no-pgo). Exit status 3: no PGO possible here (no llvm-tools,
# not root); 1: a build or the training failed. Needs root for the training (`nvproxy exec`), the
# `llvm-tools` rustup component (added with `rustup component add llvm-tools` when missing) and
# what tests/nvidia-userspace/fetch.sh needs. CARGO_TARGET_DIR and RUSTFLAGS are honoured.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd -P)
PROG=build-release
VM=0 PGO=1 QUIET=0
USERSPACE=535.261.03
while (($#)); do
  case $1 in
    --vm) VM=1; shift ;;
    --no-pgo) PGO=0; shift ;;
    --quiet) QUIET=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "$PROG: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[[ $TARGET == /* ]] || TARGET=$ROOT/$TARGET
# Resolved (CI's target/ is a link into a cache kept between clones): the flags below carry
# the counts' path, and a path that differs per clone would rebuild for nothing.
mkdir -p "$TARGET" && TARGET=$(cd "$TARGET" && pwd -P)
step() { ((QUIET)) || printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: %s\n' "$PROG" "$*" >&2; exit 1; }

if ((!PGO)); then
  step "cargo build --release -p daemon (no PGO)"
  cargo build --release -q -p daemon --bin nvproxy
  echo "$TARGET/release/nvproxy"
  exit 0
fi

host=$(rustc -vV | sed -n 's/^host: //p')
profdata=$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata
if [[ ! -x $profdata ]] && command -v rustup >/dev/null; then
  step "rustup component add llvm-tools (llvm-profdata of this rustc's LLVM)"
  rustup component add llvm-tools >&2 || true
fi
# Exit status 3: this host cannot make a profile-guided build (the caller may build --no-pgo).
if [[ ! -x $profdata ]]; then
  printf '%s: %s\n' "$PROG" "$profdata is missing: install rustc's llvm-tools (rustup component add llvm-tools), or build without PGO (--no-pgo)" >&2
  exit 3
fi
if [[ $(id -u) != 0 ]]; then
  printf '%s: %s\n' "$PROG" "the training runs nvproxy exec, which needs root (or build without PGO: --no-pgo)" >&2
  exit 3
fi

PGO_DIR=$TARGET/pgo
INSTR=$TARGET/pgo-instr
mkdir -p "$PGO_DIR"
counts=$PGO_DIR/nvproxy.profdata

step "cargo build --release -p preload (the shim, beside both builds of nvproxy)"
cargo build --release -q -p preload
# What the counts depend on, for the stamp "KEY VM": the sources by content (outside a git
# checkout, the instrumented binary itself), the compiler, its flags and the training's libcuda.
inputs_key() {
  {
    rustc -vV
    echo "RUSTFLAGS=${RUSTFLAGS:-} userspace=$USERSPACE"
    if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
      (cd "$ROOT" && git ls-files -z -co --exclude-standard -- . ':(exclude)*.md' ':(exclude)fuzz' |
        xargs -0 -r sha256sum -- 2>/dev/null) || true
    else
      instrumented_build >&2
      sha256sum "$INSTR/release/nvproxy" | cut -d' ' -f1
    fi
  } | sha256sum | cut -d' ' -f1
}
instrumented_build() {
  step "cargo build --release -p daemon, instrumented (-Cprofile-generate, $INSTR)"
  # The build's own instrumented programs (build scripts, proc macros) write their counts there.
  RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-generate=$INSTR/profraw-default" \
    cargo build --release -q -p daemon --bin nvproxy --target-dir "$INSTR"
  ln -sf "$TARGET/release/libnvproxy_preload.so" "$INSTR/release/libnvproxy_preload.so"
}
if ((VM)) && [[ -c /dev/cuse ]]; then
  step "this host has /dev/cuse: the native training covers CUSE, no VM"
  VM=0
fi
key=$(inputs_key)
# Counts taken with the VM serve a request without it too.
read -r old_key old_vm _ 2>/dev/null <"$PGO_DIR/stamp" || true
if [[ -s $counts && ${old_key:-} == "$key" && ${old_vm:-0} -ge $VM ]]; then
  step "instrumented build and training skipped: their inputs are unchanged since $counts"
else
  instrumented_build
  step "cargo build --release the training clients (cuda-probe, nvfe-client)"
  cargo build --release -q -p tests --bin cuda-probe --bin nvfe-client
  lib=$(tests/nvidia-userspace/fetch.sh "$USERSPACE" | sed -n 's/^NVIDIA_LIB_DIR=//p')
  [[ -n $lib && -e $lib/libcuda.so.1 ]] || die "no libcuda $USERSPACE (tests/nvidia-userspace/fetch.sh)"
  raw=$(mktemp -d "${TMPDIR:-/tmp}/nvproxy-pgo.XXXXXX")
  trap 'rm -rf "$raw"' EXIT
  train=$raw/train.sh
  # One transport's training, run natively or in the VM: $1 the raw counts' folder.
  cat >"$train" <<EOF
#!/usr/bin/env bash
set -euo pipefail
export LLVM_PROFILE_FILE=\$1/%p-%m.profraw
run=\$(mktemp -d)
nv() {
  "$INSTR/release/nvproxy" --run-dir "\$run" exec --driver sim --sim-driver-version "$USERSPACE" \\
    -- "\$@"
}
for i in 1 2 3; do
  nv env LD_LIBRARY_PATH="$lib" "$TARGET/release/cuda-probe" init ctx >/dev/null
done
nv env LD_LIBRARY_PATH="$lib" "$TARGET/release/cuda-probe" init ctx mem stream host-alloc managed \\
  alloc-loop --loops 100 >/dev/null
nv bash -c '
  for i in 1 2; do
    env LD_LIBRARY_PATH="$lib" "$TARGET/release/cuda-probe" init ctx mem alloc-loop --loops 50 \\
      >/dev/null &
  done
  for p in \$(jobs -p); do wait "\$p" || exit 1; done'
nv "$TARGET/release/nvfe-client" init >/dev/null
rm -rf "\$run"
EOF
  chmod +x "$train"
  mkdir -p "$raw/native"
  step "training natively: libcuda $USERSPACE's start-up and work, nvfe-client"
  "$train" "$raw/native" || die "the native training failed (its output above)"
  if ((VM)); then
    mkdir -p "$raw/vm"
    step "training in the VM (CUSE, 2 vCPUs)"
    tests/vm/cuse-vm --smp 2 --rw "$raw" -- "$train" "$raw/vm" ||
      die "the training in the VM failed (its output above)"
  fi
  n=$(find "$raw" -name '*.profraw' | wc -l)
  ((n > 0)) || die "the training wrote no counts"
  find "$raw" -name '*.profraw' -print0 | xargs -0 "$profdata" merge -o "$counts.new"
  mv "$counts.new" "$counts"
  echo "$key $VM" >"$PGO_DIR/stamp"
  step "merged $n processes' counts into $counts"
fi

step "cargo build --release -p daemon, profile-guided (-Cprofile-use, $PGO_DIR)"
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$counts" \
  cargo build --release -q -p daemon --bin nvproxy --target-dir "$PGO_DIR"
ln -sf "$TARGET/release/libnvproxy_preload.so" "$PGO_DIR/release/libnvproxy_preload.so"
echo "$PGO_DIR/release/nvproxy"
