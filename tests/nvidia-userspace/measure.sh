#!/usr/bin/env bash
# measure.sh: what NVIDIA's own clients cost through the proxy on the simulated GPU, in the VM.
# For each repetition, in ONE VM run (tests/vm/cuse-vm, emulated: absolute times are 10-50x a
# real machine's, see shared/vm/README.md):
#   - `cuda-probe init` (libcuda's cuInit, then the device queries: count, name, UUID, memory, bus
#     id, 22 attributes): the NVIDIA ioctls the process made (the probe's own recorder) and the
#     wall time inside the process, for cuInit alone and for the whole step;
#   - `nvidia-smi -L`: the ioctls the proxy served (the instance's audit counts and events,
#     summed) and the command's wall time inside the namespace (bash's `time`, so nvproxy's own
#     set-up and tear-down are not in it), and the same for `cuda-probe init` from the audit log;
#   - the whole `nvproxy exec` of `nvidia-smi -L` (node set-up, namespace, command, stop).
# Medians and ranges over the repetitions are printed as a markdown table.
#
# Usage: tests/nvidia-userspace/measure.sh [--reps R] [--version V] [--out FILE.md]
# Builds the release nvproxy, its shim and cuda-probe, fetches the userspace (fetch.sh), then
# boots one VM that runs this script with --guest. Environment: CARGO_TARGET_DIR as usual.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd -P)
PROG=measure.sh

REPS=5 VERSION=535.261.03 OUT= GUEST=0
while (($#)); do
  case $1 in
    --reps) REPS=${2:?}; shift 2 ;;
    --version) VERSION=${2:?}; shift 2 ;;
    --out) OUT=${2:?}; shift 2 ;;
    --guest) GUEST=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "$PROG: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $REPS =~ ^[1-9][0-9]*$ ]] || { echo "$PROG: --reps takes a positive number" >&2; exit 2; }
[[ -z $OUT || $OUT == /* ]] || OUT=$PWD/$OUT

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[[ $TARGET == /* ]] || TARGET=$ROOT/$TARGET
BIN=$TARGET/release
USERSPACE=$TARGET/nvidia-userspace

if ((GUEST == 0)); then
  cargo build --release -q -p daemon -p tests --bin nvproxy --bin cuda-probe
  cargo build --release -q -p preload  # libnvproxy_preload.so next to nvproxy
  NVIDIA_USERSPACE_CACHE=$USERSPACE tests/nvidia-userspace/fetch.sh "$VERSION" >/dev/null
  rw=()
  [[ $TARGET == "$ROOT"/* ]] || rw=(--rw "$TARGET")
  out_args=()
  if [[ -n $OUT ]]; then
    out_args=(--out "$OUT")
    [[ $OUT == "$ROOT"/* ]] || rw+=(--rw "$(dirname "$OUT")")
  fi
  exec "$ROOT/tests/vm/cuse-vm" --timeout 1800 "${rw[@]}" -- \
    "$ROOT/tests/nvidia-userspace/measure.sh" --guest --reps "$REPS" --version "$VERSION" "${out_args[@]}"
fi

# ------------------------------------------------------------------ in the guest
LIB=$USERSPACE/$VERSION/lib
SMI=$USERSPACE/$VERSION/bin/nvidia-smi
WORK=$(mktemp -d)
export RUST_LOG=error
TIMEFORMAT=%R

audit_total() { # the ioctls an instance served: the sum of its count lines (written at stop,
  # allowed, failed and denied alike; the event lines repeat the failed and denied ones)
  python3 -c '
import json, sys
print(sum(e["count"] for e in map(json.loads, open(sys.argv[1])) if e.get("type") == "count"))' "$1"
}

declare -a probe_ioctls probe_ms probe_audit smi_ioctls smi_s smi_exec_s probe_s init_ioctls init_ms
for ((r = 0; r < REPS; r++)); do
  a=$WORK/probe-$r.jsonl
  { time "$BIN/nvproxy" exec --driver sim --sim-driver-version "$VERSION" --audit-log "$a" -- \
      env LD_LIBRARY_PATH="$LIB" "$BIN/cuda-probe" init >"$WORK/probe-$r.json" || true; } 2>"$WORK/probe-$r.time"
  [[ -s $WORK/probe-$r.json ]] || { cat "$WORK/probe-$r.time" >&2; echo "$PROG: cuda-probe printed nothing" >&2; exit 1; }
  step() { python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["steps"][0][sys.argv[2]]))' "$WORK/probe-$r.json" "$1"; }
  probe_ioctls[r]=$(step cuinit_ioctls)
  probe_ms[r]=$(step cuinit_ms)
  init_ioctls[r]=$(step ioctls)
  init_ms[r]=$(step ms)
  probe_audit[r]=$(audit_total "$a")
  a=$WORK/smi-$r.jsonl
  { time "$BIN/nvproxy" exec --driver sim --sim-driver-version "$VERSION" --audit-log "$a" -- \
      env LD_LIBRARY_PATH="$LIB" bash -c 'TIMEFORMAT=%R; { time "$0" -L >/dev/null; } 2>&1' "$SMI" \
      >"$WORK/smi-$r.inner"; } 2>"$WORK/smi-$r.time" ||
    { cat "$WORK/smi-$r.inner" "$WORK/smi-$r.time" >&2; echo "$PROG: nvidia-smi -L failed" >&2; exit 1; }
  smi_s[r]=$(tail -1 "$WORK/smi-$r.inner")
  smi_exec_s[r]=$(tail -1 "$WORK/smi-$r.time")
  smi_ioctls[r]=$(audit_total "$a")
  probe_s[r]=$(tail -1 "$WORK/probe-$r.time")
  echo "rep $r: cuInit ${probe_ioctls[r]} ioctls ${probe_ms[r]} ms, init step ${init_ioctls[r]} (proxy saw ${probe_audit[r]}) ${init_ms[r]} ms;" \
       "nvidia-smi -L ${smi_ioctls[r]} ioctls ${smi_s[r]} s (exec ${smi_exec_s[r]} s)" >&2
done

stats() { # median [min-max] of the arguments
  python3 -c '
import statistics, sys
v = sorted(float(x) for x in sys.argv[1:])
fmt = lambda x: ("%d" % x) if x == int(x) else ("%.2f" % x)
print("%s [%s-%s]" % (fmt(statistics.median(v)), fmt(v[0]), fmt(v[-1])))' "$@"
}

table=$(cat <<EOF
Measured $(date -u +%Y-%m-%d) in the CUSE VM (tests/vm/cuse-vm, TCG emulation, 1 vCPU), release build,
\`--driver sim\` (one H100), userspace $VERSION, $REPS repetitions: median [min-max].

| client | NVIDIA ioctls | wall time in the VM |
|---|---|---|
| \`cuInit(0)\` (libcuda), counted in the process | $(stats "${probe_ioctls[@]}") | $(stats "${probe_ms[@]}") ms (the call) |
| \`cuda-probe init\` (cuInit + device queries), counted in the process | $(stats "${init_ioctls[@]}") | $(stats "${init_ms[@]}") ms (the step) |
| the same, served by the proxy (audit counts) | $(stats "${probe_audit[@]}") | $(stats "${probe_s[@]}") s (whole \`nvproxy exec\` of cuda-probe) |
| \`nvidia-smi -L\`, served by the proxy (audit counts) | $(stats "${smi_ioctls[@]}") | $(stats "${smi_s[@]}") s (the command) / $(stats "${smi_exec_s[@]}") s (whole \`nvproxy exec\`) |
EOF
)
echo "$table"
[[ -n $OUT ]] && echo "$table" >"$OUT"
rm -rf "$WORK"
