#!/usr/bin/env bash
# The project's test command (README "Run it, test it"; .ci/run calls it after installing
# prerequisites): formatting, lints (clippy, rustdoc, the docs' links), every unit/integration
# test (including the ABI parity test for every supported driver version), then the real-kernel
# CUSE suites (natively or in a VM).
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

step() { printf '\n=== %s (%d s)\n' "$*" "$SECONDS" >&2; }

step "prerequisites (tests/prerequisites.sh: installs what is missing as root, else names it)"
tests/prerequisites.sh

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo doc -D warnings (broken intra-doc links, unclosed HTML in doc comments)"
RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -D warnings" cargo doc --no-deps --workspace --quiet

step "docs: every relative link in the Markdown files resolves"
tests/docs/check-links.sh

step "import cycles (tests/layout/imports.py: none of three or more files in any crate)"
python3 tests/layout/imports.py --check daemon worker nvproxy-config cuse-dev nvproxy-abi abi-import nvsim \
  ioctl-proxy uvm host-driver tenant-log preload preload/proto device-plugin test-kit tests fuzz

step "cargo build (the binaries the native socket-transport suite runs)"
cargo build -p daemon -p preload -p tests

step "cargo test (unit, integration, ABI parity, the socket transport natively)"
cargo test --workspace --no-run --quiet
# Tests keep to their own files: what a run leaves in its temp directory (a private one, so
# that other runs on this host do not count) or in the host's /run/nvproxy fails it.
test_tmp=$(mktemp -d)
trap 'rm -rf "$test_tmp"' EXIT
chmod 1777 "$test_tmp"
run_before=$(ls -A /run/nvproxy 2>/dev/null || true)
TMPDIR=$test_tmp cargo test --workspace
left=$(cd "$test_tmp" && ls -d nvproxy-* 2>/dev/null || true)
run_after=$(ls -A /run/nvproxy 2>/dev/null || true)
if [[ -n $left || $run_before != "$run_after" ]]; then
    printf 'the tests left files behind: in the temp directory: %s; /run/nvproxy before: %s; after: %s\n' \
        "${left:-none}" "${run_before:-empty}" "${run_after:-empty}" >&2
    exit 1
fi

step "the README's walk, natively (tests/readme-walk.sh: ./run.sh serves, another shell uses it)"
tests/readme-walk.sh

step "the GPU check's dry run (tests/gpu/dry-run.sh: validate.sh --driver sim, strict, < 60 s)"
tests/gpu/dry-run.sh

step "real-kernel CUSE tests"
tests/run-kernel-tests.sh

printf '\n=== all test stages passed\n' >&2
