# stage-floor.sh: sourced by ab.sh and server-cost.sh (from the repository root, ROOT set). The
# guest reads what lies under the repository, so `stage_floor NAME` builds nv-bench (release)
# and the same-work floor (gcc, libfuse3-dev; installed when missing) into a scratch folder
# target/NAME.XXXXXX, sets `work` to it and removes it on exit.
stage_floor() {
  # Stale package lists (a -dev package pinned to an older library than the one installed)
  # fail the first install: then update them and try again, as run-bench.sh does.
  pkg-config --exists fuse3 2>/dev/null ||
    apt-get install -y -qq gcc libfuse3-dev pkg-config >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq gcc libfuse3-dev pkg-config >/dev/null; }
  local target=${CARGO_TARGET_DIR:-$ROOT/target}
  [[ $target == /* ]] || target=$ROOT/$target
  cargo build --release -q -p tests --bin nv-bench
  work=$(mktemp -d "$target/$1.XXXXXX")
  # shellcheck disable=SC2064 # the folder is known now
  trap "rm -rf '$work'" EXIT
  # shellcheck disable=SC2046
  gcc -O2 -Wall -Wextra -o "$work/cuse_samework" tests/bench/cuse_samework.c $(pkg-config --cflags --libs fuse3)
  cp "$target/release/nv-bench" "$work/"
}
