#!/usr/bin/env bash
# CI step for the fuzz targets (called by .ci/run after ./test.sh; runs anywhere cargo does):
#  0. `cargo fmt --check` and `cargo clippy -D warnings` of this crate (outside the workspace,
#     so test.sh's do not reach it);
#  1. `cargo test`: the committed seed corpus is the generated one, the seeds reach deep into
#     the request path, and every seed, fixed regression input and a few hundred mutations of
#     the seeds hold the invariants (src/harness.rs);
#  2. each libFuzzer target for FUZZ_SECONDS (default 30; parse_request and dev_socket, small
#     parsers, 15), two at a time (FUZZ_LANES), from the committed corpus into a
#     scratch corpus; a crash (panic, broken invariant, RSS above 2 GiB, a slow unit) fails
#     the step and leaves the input under fuzz/artifacts/<target>/.
# Installs cargo-fuzz itself when `cargo fuzz` is missing. Stable toolchain: cargo-fuzz passes
# nightly-only rustc flags, which RUSTC_BOOTSTRAP=1 allows.
set -euo pipefail
cd "$(dirname "$0")"
secs=${FUZZ_SECONDS:-30}
targets=(parse_request proxy_ioctl uvm_ioctl dev_socket)

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "=== fuzz: installing cargo-fuzz" >&2
    cargo install --locked cargo-fuzz
fi
echo "=== fuzz: format and lints" >&2
cargo fmt --check
cargo clippy --locked --quiet --all-targets -- -D warnings
export RUSTC_BOOTSTRAP=1

echo "=== fuzz: corpus and harness tests" >&2
cargo test --locked

# No sanitizer: the code under test is safe Rust (ioctl-proxy's only unsafe is the real
# driver's ioctl, not exercised here), so ASan would add build and run time for little a
# panic does not already report. Debug assertions on: integer overflow panics.
echo "=== fuzz: build" >&2
cargo fuzz build --sanitizer none --debug-assertions

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# One target's run; its summary (or its failure) is printed when it ends.
run_target() {
    local t=$1 s=$secs rc=0
    # Small fixed-size parsers: 15 s is plenty.
    case $t in parse_request | dev_socket) s=$((secs < 15 ? secs : 15)) ;; esac
    mkdir -p "$scratch/$t" "corpus/$t"
    cargo fuzz run --sanitizer none --debug-assertions "$t" "$scratch/$t" "corpus/$t" -- \
        -max_total_time="$s" -max_len=4096 -rss_limit_mb=2048 -timeout=10 \
        -print_final_stats=1 >"$scratch/$t.log" 2>&1 || rc=$?
    {
        echo "=== fuzz: $t for ${s}s"
        grep -E '^(stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)|#[0-9]+ +DONE)' \
            "$scratch/$t.log" || true
        if [ "$rc" -ne 0 ]; then
            tail -n 80 "$scratch/$t.log"
            echo "fuzz target $t failed (exit $rc); the input is under fuzz/artifacts/$t/"
        fi
    } >&2
    return "$rc"
}
# Each libFuzzer run is one process on one core: two lanes (FUZZ_LANES) run the targets side by
# side, each target for its own time as before; a failure of any fails the step.
lanes=${FUZZ_LANES:-2}
pids=() failed=0
for t in "${targets[@]}"; do
    if ((${#pids[@]} >= lanes)); then
        wait -n "${pids[@]}" || failed=1
        alive=()
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
        pids=("${alive[@]}")
    fi
    run_target "$t" &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
exit "$failed"
