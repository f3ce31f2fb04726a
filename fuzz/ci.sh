#!/usr/bin/env bash
# CI step for the fuzz targets (called by .ci/run after ./test.sh; runs anywhere cargo does):
#  1. `cargo test`: the committed seed corpus is the generated one, the seeds reach deep into
#     the request path, and every seed, fixed regression input and a few hundred mutations of
#     the seeds hold the invariants (src/harness.rs);
#  2. each libFuzzer target for FUZZ_SECONDS (default 45) from the committed corpus into a
#     scratch corpus; a crash (panic, broken invariant, RSS above 2 GiB, a slow unit) fails
#     the step and leaves the input under fuzz/artifacts/<target>/.
# Installs cargo-fuzz itself when `cargo fuzz` is missing. Stable toolchain: cargo-fuzz passes
# nightly-only rustc flags, which RUSTC_BOOTSTRAP=1 allows.
set -euo pipefail
cd "$(dirname "$0")"
secs=${FUZZ_SECONDS:-45}
targets=(parse_request proxy_ioctl uvm_ioctl)

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "=== fuzz: installing cargo-fuzz" >&2
    cargo install --locked cargo-fuzz
fi
export RUSTC_BOOTSTRAP=1

echo "=== fuzz: corpus and harness tests" >&2
cargo test --locked

# No sanitizer: the code under test is safe Rust (ioctl-proxy's only unsafe is the real
# driver's ioctl, not linked here), so ASan would find nothing a panic does not, at a third
# of the speed and twice the build time. Debug assertions on: integer overflow panics.
echo "=== fuzz: build" >&2
cargo fuzz build --sanitizer none --debug-assertions

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for t in "${targets[@]}"; do
    echo "=== fuzz: $t for ${secs}s" >&2
    mkdir -p "$scratch/$t" "corpus/$t"
    cargo fuzz run --sanitizer none --debug-assertions "$t" "$scratch/$t" "corpus/$t" -- \
        -max_total_time="$secs" -max_len=4096 -rss_limit_mb=2048 -timeout=10 \
        -print_final_stats=1 2>&1 | grep -E '^(stat::|#[0-9]+ +DONE|==|SUMMARY|thread|Failing|artifact_prefix|Test unit)' || true
    # grep hides libFuzzer's progress lines; the pipeline's status is the fuzzer's.
    rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        echo "fuzz target $t failed (exit $rc); inputs under fuzz/artifacts/$t/" >&2
        ls -l "artifacts/$t" >&2 || true
        exit "$rc"
    fi
done
