#!/usr/bin/env bash
# tests/gpu/validate.sh with the simulated driver (`--driver sim`), natively on this host, so
# that the script keeps working between the runs on a lent GPU: every check the simulated
# driver can pass must PASS (the CUDA launches fail as tests/nvidia-userspace/RESULTS.md says,
# the raw-vs-proxied ratios have no raw side, and checkpointing a CUDA context is refused by
# replay, reported as INFO). Bounded at 60 s.
# Runs in a private mount namespace with tmpfs on /run and /tmp: the host's are untouched.
# Needs root and NVIDIA's userspace (tests/nvidia-userspace/fetch.sh); `./test.sh` runs it
# after building (target/debug).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ $(id -u) != 0 ]]; then echo "gpu dry run: SKIPPED (needs root)" >&2; exit 0; fi
version=535.261.03
userspace=$PWD/target/nvidia-userspace/$version
if [[ ! -f $userspace/.complete ]]; then
  echo "gpu dry run: SKIPPED: NVIDIA's $version userspace is not fetched (tests/nvidia-userspace/fetch.sh $version)" >&2
  exit 0
fi
if [[ -z ${NVPROXY_GPU_DRY_RUN_NS:-} ]]; then
  exec unshare --mount --propagation private env NVPROXY_GPU_DRY_RUN_NS=1 "$0" "$@"
fi
mount -t tmpfs -o mode=0755 gpu-dry-run /run
mount -t tmpfs -o mode=1777 gpu-dry-run-tmp /tmp
export TMPDIR=/tmp
out=/tmp/validate
start=$SECONDS
rc=0
LD_LIBRARY_PATH=$userspace/lib timeout 60 tests/gpu/validate.sh --bin target/debug --driver sim \
  --smi "$userspace/bin/nvidia-smi" --transport socket --limit 30 --out "$out" >"$out.log" 2>&1 || rc=$?
took=$((SECONDS - start))
fail() { echo "gpu dry run: FAILED: $*" >&2; cat "$out.log" >&2; exit 1; }
((rc != 124)) || fail "validate.sh did not finish in 60 s"
# Every line but these must be PASS (NOTE: no host driver; INFO: figures).
allowed='^(FAIL socket: cuda (launch|vector-add) |SKIP socket: ratio |SKIP socket: torch matmul |NOTE host driver |INFO |     )'
unexpected=$(grep -E '^(PASS|FAIL|SKIP|NOTE|INFO) |^     ' "$out/summary.txt" | grep -vE '^PASS ' | grep -vE "$allowed" || true)
[[ -z $unexpected ]] || fail "unexpected lines: $unexpected"
for want in doctor "socket: nvidia-smi -L" "socket: nvidia-smi -q" "socket: cuda init" "socket: cuda ctx" \
  "socket: cuda mem" "socket: cuda managed" "socket: cuda module-ptx" "socket: cuda alloc-loop" \
  "socket: 1000-ioctl loop" "socket: audit summary" "trace smi-q" "trace cuda" serve \
  "two instances, quotas" "live upgrade" "checkpoint + restore" "serve stop"; do
  grep -q "^PASS $want " "$out/summary.txt" || fail "no PASS for $want"
done
grep -qE '^INFO checkpoint \(context\) +refused: .*HOPPER_CHANNEL_GPFIFO_A' "$out/summary.txt" ||
  fail "checkpointing a CUDA context was not refused for its channels"
grep -qE '^FAIL socket: cuda launch .*cuCtxSynchronize' "$out/summary.txt" ||
  fail "the launch did not fail at cuCtxSynchronize (the simulated GPU's faulting launch)"
echo "gpu dry run: validate.sh --driver sim passed in ${took} s: $(tail -1 "$out/summary.txt")" >&2
