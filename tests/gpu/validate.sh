#!/usr/bin/env bash
# tests/gpu/validate.sh: nvproxy over NVIDIA's real kernel driver, on a host with a GPU.
#
# Usage (as root, on the GPU host):
#   tests/gpu/validate.sh [--bin DIR] [--out DIR] [--gpu MINOR] [--transport auto|cuse|socket]
#                         [--limit SECONDS]
#   --bin DIR      nvproxy, libnvproxy_preload.so, cuda-probe (default: target/gpu-bundle of this
#                  checkout, which tests/gpu/bundle.sh builds: release, x86_64, stripped)
#   --out DIR      where the outputs go (default: $OUT when set, else /tmp/nvproxy-validate)
#   --gpu MINOR    the host GPU the instance gets (default 0)
#   --transport    auto (default): cuse when /dev/cuse exists or `modprobe cuse` makes it, else
#                  socket (tests/tests/socket_transport.rs; no CUSE needed)
#   --limit S      the timeout of each command (default 120)
#   --driver sim   a dry run against the simulated driver, for checking this script where there
#                  is no GPU: no raw runs (NVIDIA's userspace would mknod /dev/nvidia* on a
#                  host without them), the CUDA steps past cuInit fail where
#                  tests/nvidia-userspace/RESULTS.md says; the userspace comes from
#                  LD_LIBRARY_PATH and --smi PATH
#
# Prints one line per check (PASS / FAIL / SKIP, name, detail) and a summary; the full outputs
# (JSON of cuda-probe, nvidia-smi's text, the audit log) are kept in the out dir. Checks:
#   doctor, nvidia-smi -L (raw vs proxied: the same UUID, as GPU 0), nvidia-smi -q, cuda-probe
#   raw and proxied (cuInit, device queries, cuCtxCreate, cuMemAlloc + memcpy + memset, streams,
#   cuMemAllocManaged touched by the CPU, cuMemHostAlloc, cuModuleLoadData of PTX, a launch, a
#   PTX vector add on device and on managed memory with every element checked, an alloc/free
#   loop), the raw-vs-proxied ratios of cuInit, cuCtxCreate and the alloc/free loop, a PyTorch
#   matrix product (raw vs proxied) when `python3 -c 'import torch'` works, the audit summary.
# Exit status: 0 when no check failed. Nothing is installed; nothing outside --out is written
# (but /run/nvproxy, the daemon's run directory).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd -P)
ROOT=$(cd "$HERE/../.." && pwd -P)
BIN=$ROOT/target/gpu-bundle
OUT=${OUT:-/tmp/nvproxy-validate}
GPU=0
TRANSPORT=auto
LIMIT=120
DRIVER=host
SMI=$(command -v nvidia-smi || true)
while (($#)); do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --gpu) GPU=$2; shift 2 ;;
    --transport) TRANSPORT=$2; shift 2 ;;
    --limit) LIMIT=$2; shift 2 ;;
    --driver) DRIVER=$2; shift 2 ;;
    --smi) SMI=$2; shift 2 ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "validate.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
N=$BIN/nvproxy
PROBE=$BIN/cuda-probe
PASS=0 FAIL=0 SKIP=0
line() { printf '%-4s %-28s %s\n' "$1" "$2" "$3" | tee -a "$OUT/summary.txt"; }
pass() { PASS=$((PASS + 1)); line PASS "$1" "$2"; }
fail() { FAIL=$((FAIL + 1)); line FAIL "$1" "$2"; }
skip() { SKIP=$((SKIP + 1)); line SKIP "$1" "$2"; }
: >"$OUT/summary.txt"

for f in "$N" "$BIN/libnvproxy_preload.so" "$PROBE"; do
  [[ -x $f || -f $f ]] || { echo "validate.sh: $f missing (--bin DIR)" >&2; exit 2; }
done
[[ $(id -u) == 0 ]] || { echo "validate.sh: run as root" >&2; exit 2; }
HAVE_PY=0
command -v python3 >/dev/null && HAVE_PY=1

# json FILE EXPR: a value of the last JSON line of FILE (python3 expression on `j`), or "".
json() {
  ((HAVE_PY)) || return 0
  python3 - "$1" "$2" <<'EOF' 2>/dev/null
import json, sys
try:
    lines = [l for l in open(sys.argv[1]).read().splitlines() if l.startswith("{")]
    j = json.loads(lines[-1])
    v = eval(sys.argv[2], {"j": j, "step": lambda n: next((s for s in j["steps"] if s["step"] == n), {})})
    print("" if v is None else json.dumps(v) if isinstance(v, (dict, list, bool)) else v)
except Exception as e:
    print("")
EOF
}

{
  echo "date: $(date -u +%FT%TZ)"
  echo "kernel: $(uname -r)"
  echo "driver: $(cat /sys/module/nvidia/version 2>/dev/null || echo none)"
  echo "gpus: $(ls /proc/driver/nvidia/gpus 2>/dev/null | tr '\n' ' ')"
  echo "nvproxy: $N"
} | tee "$OUT/host.txt"

# ---------------------------------------------------------------- transport
if [[ $TRANSPORT == auto ]]; then
  if [[ -e /dev/cuse ]] || { modprobe cuse 2>/dev/null && [[ -e /dev/cuse ]]; }; then
    TRANSPORT=cuse
  else
    TRANSPORT=socket
  fi
fi
EXEC=("$N" exec --driver "$DRIVER" --gpus "$GPU" --transport "$TRANSPORT")
echo "transport: $TRANSPORT" | tee -a "$OUT/host.txt"

# ---------------------------------------------------------------- doctor
timeout "$LIMIT" "$N" doctor >"$OUT/doctor.txt" 2>&1
rc=$?
if ((rc == 0)); then pass doctor "every check ok ($OUT/doctor.txt)"
else fail doctor "exit $rc: $(grep -m3 FAIL "$OUT/doctor.txt" | tr -s ' ' | tr '\n' ';')"; fi
grep -q "^\[ok  \] host NVIDIA driver *version" "$OUT/doctor.txt" ||
  line NOTE "host driver" "doctor does not see a loaded NVIDIA driver"

# ---------------------------------------------------------------- nvidia-smi
if [[ -z $SMI ]]; then
  skip "nvidia-smi -L" "no nvidia-smi in PATH"
  skip "nvidia-smi -q" "no nvidia-smi in PATH"
else
  raw() { [[ $DRIVER == host ]] && timeout "$LIMIT" "$@"; }
  raw "$SMI" -L >"$OUT/smi-L.raw.txt" 2>&1
  timeout "$LIMIT" "${EXEC[@]}" -- "$SMI" -L >"$OUT/smi-L.proxied.txt" 2>"$OUT/smi-L.proxied.err"
  rc=$?
  want=$(sed -n "$((GPU + 1))p" "$OUT/smi-L.raw.txt" | grep -o 'UUID: GPU-[0-9a-f-]*')
  got=$(grep -o 'UUID: GPU-[0-9a-f-]*' "$OUT/smi-L.proxied.txt" | tr '\n' ' ')
  # A dry run has no raw listing to compare with: one GPU must be listed.
  [[ $DRIVER == host ]] || want=$(grep -o 'UUID: GPU-[0-9a-f-]*' "$OUT/smi-L.proxied.txt" | head -1)
  if ((rc == 0)) && [[ -n $want && $got == "$want " ]] && grep -q '^GPU 0:' "$OUT/smi-L.proxied.txt"; then
    pass "nvidia-smi -L" "$(head -1 "$OUT/smi-L.proxied.txt")"
  else
    fail "nvidia-smi -L" "exit $rc, proxied [$got] raw GPU $GPU [$want] ($OUT/smi-L.proxied.*)"
  fi
  timeout "$LIMIT" "${EXEC[@]}" -- "$SMI" -q >"$OUT/smi-q.proxied.txt" 2>"$OUT/smi-q.proxied.err"
  rc=$?
  if ((rc == 0)) && grep -q 'Product Name' "$OUT/smi-q.proxied.txt"; then
    pass "nvidia-smi -q" "$(grep -m1 'Product Name' "$OUT/smi-q.proxied.txt" | tr -s ' ')"
  else
    fail "nvidia-smi -q" "exit $rc ($OUT/smi-q.proxied.*)"
  fi
fi

# ---------------------------------------------------------------- CUDA driver API
STEPS=(init ctx mem stream managed host-alloc module-ptx launch vector-add alloc-loop)
raw() { [[ $DRIVER == host ]] && timeout "$LIMIT" "$@"; }
raw "$PROBE" "${STEPS[@]}" >"$OUT/probe.raw.json" 2>"$OUT/probe.raw.err"
raw_rc=$?
timeout "$LIMIT" "${EXEC[@]}" --audit-log "$OUT/audit.jsonl" -- "$PROBE" "${STEPS[@]}" \
  >"$OUT/probe.proxied.json" 2>"$OUT/probe.proxied.err"
prox_rc=$?
if ((raw_rc != 0)) && [[ $DRIVER == host ]]; then
  line NOTE "cuda-probe raw" "exit $raw_rc without nvproxy: $(json "$OUT/probe.raw.json" 'j["failed"]')"
fi
if ((HAVE_PY)); then
  for s in "${STEPS[@]}"; do
    ok=$(json "$OUT/probe.proxied.json" "step('$s').get('ok')")
    case $ok in
      true) pass "cuda $s" "$(json "$OUT/probe.proxied.json" "{k: v for k, v in step('$s').items() if k in ('ms', 'ioctls', 'count', 'checked', 'per_iteration_us', 'htod_dtod_dtoh_equal', 'cpu_round_trip', 'launched')}")" ;;
      false) fail "cuda $s" "$(json "$OUT/probe.proxied.json" 'j["failed"]' | cut -c1-400)" ;;
      *) fail "cuda $s" "not reached (exit $prox_rc; $OUT/probe.proxied.*)" ;;
    esac
  done
  # Raw vs proxied.
  ratio() {
    local what=$1 expr=$2 r p
    r=$(json "$OUT/probe.raw.json" "$expr")
    p=$(json "$OUT/probe.proxied.json" "$expr")
    if [[ -n $r && -n $p && $r != null && $p != null ]]; then
      line INFO "ratio $what" "$(python3 -c "print(f'proxied {float($p):.3f} / raw {float($r):.3f} = {float($p)/max(float($r),1e-9):.2f}x')")"
    else
      skip "ratio $what" "no figure (raw '$r', proxied '$p')"
    fi
  }
  ratio "cuInit ms" "step('init').get('cuinit_ms')"
  ratio "cuCtxCreate ms" "step('ctx').get('ms')"
  ratio "alloc+free us" "step('alloc-loop').get('per_iteration_us')"
else
  if ((prox_rc == 0)); then pass "cuda-probe" "all steps ($OUT/probe.proxied.json)"
  else fail "cuda-probe" "exit $prox_rc ($OUT/probe.proxied.json)"; fi
  skip ratios "no python3 to read the JSON"
fi

# ---------------------------------------------------------------- PyTorch
if ((HAVE_PY)) && timeout "$LIMIT" python3 -c 'import torch' 2>/dev/null; then
  TORCH='import torch, json
torch.manual_seed(0)
a = torch.randn(2048, 2048, device="cuda"); b = torch.randn(2048, 2048, device="cuda")
c = (a @ b).cpu(); ref = a.cpu() @ b.cpu()
print(json.dumps({"ok": True, "max_abs_diff": float((c - ref).abs().max()), "sum": float(c.sum()), "device": torch.cuda.get_device_name(0)}))'
  raw python3 -c "$TORCH" >"$OUT/torch.raw.json" 2>"$OUT/torch.raw.err"
  timeout "$LIMIT" "${EXEC[@]}" -- python3 -c "$TORCH" >"$OUT/torch.proxied.json" 2>"$OUT/torch.proxied.err"
  rc=$?
  d=$(json "$OUT/torch.proxied.json" 'j["max_abs_diff"]')
  if ((rc == 0)) && [[ -n $d ]] && python3 -c "import sys; sys.exit(0 if float('$d') < 1e-2 else 1)"; then
    pass "torch matmul" "max |gpu - cpu| $d; raw sum $(json "$OUT/torch.raw.json" 'j["sum"]'), proxied sum $(json "$OUT/torch.proxied.json" 'j["sum"]')"
  else
    fail "torch matmul" "exit $rc ($OUT/torch.proxied.err: $(tail -1 "$OUT/torch.proxied.err" | cut -c1-200))"
  fi
else
  skip "torch matmul" "python3 -c 'import torch' does not work here"
fi

# ---------------------------------------------------------------- audit
if [[ -s $OUT/audit.jsonl ]]; then
  timeout "$LIMIT" "$N" audit summary "$OUT/audit.jsonl" >"$OUT/audit-summary.txt" 2>&1
  denied=$(grep -ci 'denied' "$OUT/audit-summary.txt")
  pass "audit summary" "$(wc -l <"$OUT/audit-summary.txt") lines, $denied mention a denial ($OUT/audit-summary.txt)"
  grep -i 'denied' "$OUT/audit-summary.txt" | head -20 | sed 's/^/     /' | tee -a "$OUT/summary.txt"
else
  fail "audit summary" "no audit log written ($OUT/audit.jsonl)"
fi

printf '\n%d passed, %d failed, %d skipped (transport %s; outputs in %s)\n' \
  "$PASS" "$FAIL" "$SKIP" "$TRANSPORT" "$OUT" | tee -a "$OUT/summary.txt"
((FAIL == 0))
