#!/usr/bin/env bash
# tests/gpu/validate.sh: nvproxy over NVIDIA's real kernel driver, on a host with a GPU.
#
# Usage (as root, on the GPU host):
#   tests/gpu/validate.sh [--bin DIR] [--out DIR] [--gpu MINOR] [--transport auto|cuse|socket]
#                         [--limit SECONDS] [--driver host|sim] [--smi PATH]
#   --bin DIR      nvproxy, libnvproxy_preload.so, cuda-probe, nvfe-client, nv-bench (default:
#                  target/gpu-bundle of this checkout, which tests/gpu/bundle.sh builds:
#                  release, x86_64, stripped)
#   --out DIR      where the outputs go (default: $OUT when set, else /tmp/nvproxy-validate)
#   --gpu MINOR    the host GPU the instances get (default 0)
#   --transport    auto (default): every transport the host has, CUSE (when /dev/cuse exists
#                  or `modprobe cuse` makes it) and the socket transport; or only that one
#   --limit S      the timeout of each command (default 120)
#   --driver sim   a dry run against the simulated driver, for checking this script where there
#                  is no GPU: no raw runs (NVIDIA's userspace would mknod /dev/nvidia* on a
#                  host without them), the CUDA launches fail where
#                  tests/nvidia-userspace/RESULTS.md says; the userspace comes from
#                  LD_LIBRARY_PATH and --smi PATH
#
# Prints one line per check (PASS / FAIL / SKIP / INFO, name, detail) and a summary; the full
# outputs (JSON of cuda-probe, nvidia-smi's text, audit logs, the traces) are kept in the out
# dir. Checks, per transport (names prefixed `cuse:` / `socket:`):
#   nvidia-smi -L (raw vs proxied: the same UUID, as GPU 0), nvidia-smi -q, cuda-probe raw and
#   proxied (cuInit, device queries, cuCtxCreate, cuMemAlloc + memcpy + memset, streams,
#   cuMemAllocManaged touched by the CPU, cuMemHostAlloc, cuModuleLoadData of PTX, a launch, a
#   PTX vector add on device and on managed memory with every element checked, an alloc/free
#   loop), the raw-vs-proxied ratios of cuInit, cuCtxCreate, alloc+free and a 1000-ioctl loop
#   (nv-bench simple-control), a PyTorch matrix product when `python3 -c 'import torch'` works,
#   the audit summary. Once (first transport):
#   trace      `--record` of nvidia-smi -q and of cuda-probe init ctx mem module-ptx (and its
#              teardown): every driver call with request and reply bytes and statuses
#   quotas     `nvproxy serve`, two instances on the one GPU with --gpu-memory quotas: one holds
#              memory, the other sees only its own use and its quota (cuMemGetInfo, nvidia-smi)
#   upgrade    `nvproxy instance upgrade` twice under a looping CUDA client (alloc-loop)
#   checkpoint `instance checkpoint` of an instance holding a CUDA context (what replay
#              refuses is reported, by kind), and checkpoint + restore of one holding an RM
#              client, device and subdevice (nvfe-client hold), whose handles must work after
# Exit status: 0 when no check failed. Nothing is installed; nothing outside --out is written
# but the daemon's run directories (NVPROXY_RUN_DIR or /run/nvproxy for exec; a mktemp
# directory under /tmp for serve, removed at the end). Whole run: a few minutes at most.
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
    -h|--help) sed -n '2,41p' "$0"; exit 0 ;;
    *) echo "validate.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd -P)
N=$BIN/nvproxy
PROBE=$BIN/cuda-probe
BENCH=$BIN/nv-bench
NVFE=$BIN/nvfe-client
PASS=0 FAIL=0 SKIP=0
line() { printf '%-4s %-30s %s\n' "$1" "$2" "$3" | tee -a "$OUT/summary.txt"; }
pass() { PASS=$((PASS + 1)); line PASS "$1" "$2"; }
fail() { FAIL=$((FAIL + 1)); line FAIL "$1" "$2"; }
skip() { SKIP=$((SKIP + 1)); line SKIP "$1" "$2"; }
: >"$OUT/summary.txt"
T0=$SECONDS

for f in "$N" "$BIN/libnvproxy_preload.so" "$PROBE" "$BENCH" "$NVFE"; do
  [[ -x $f || -f $f ]] || { echo "validate.sh: $f missing (--bin DIR)" >&2; exit 2; }
done
[[ $(id -u) == 0 ]] || { echo "validate.sh: run as root" >&2; exit 2; }
HAVE_PY=0
command -v python3 >/dev/null && HAVE_PY=1

# json FILE EXPR: a value of the last JSON line of FILE (python3 expression on `j`), or "".
json() {
  ((HAVE_PY)) || return 0
  python3 - "$1" "$2" <<'PY' 2>/dev/null
import json, sys
try:
    lines = [l for l in open(sys.argv[1]).read().splitlines() if l.startswith("{")]
    j = json.loads(lines[-1])
    v = eval(sys.argv[2], {"j": j, "step": lambda n: next((s for s in j["steps"] if s["step"] == n), {})})
    print("" if v is None else json.dumps(v) if isinstance(v, (dict, list, bool)) else v)
except Exception as e:
    print("")
PY
}
# raw CMD...: CMD without nvproxy (host driver only).
raw() { [[ $DRIVER == host ]] && timeout "$LIMIT" "$@"; }
# ratio NAME RAW PROXIED: an INFO line with proxied / raw, or a SKIP without both figures.
ratio() {
  local what=$1 r=$2 p=$3
  if [[ -n $r && -n $p && $r != null && $p != null ]]; then
    line INFO "$what" "$(python3 -c "print(f'proxied {float($p):.3f} / raw {float($r):.3f} = {float($p)/max(float($r),1e-9):.2f}x')")"
  else
    skip "$what" "no figure (raw '$r', proxied '$p')"
  fi
}

{
  echo "date: $(date -u +%FT%TZ)"
  echo "kernel: $(uname -r)"
  echo "driver: $(cat /sys/module/nvidia/version 2>/dev/null || echo none)"
  echo "gpus: $(ls /proc/driver/nvidia/gpus 2>/dev/null | tr '\n' ' ')"
  echo "nvproxy: $N"
} | tee "$OUT/host.txt"

# ---------------------------------------------------------------- transports
if [[ $TRANSPORT == auto ]]; then
  TRANSPORTS=(socket)
  if [[ -e /dev/cuse ]] || { modprobe cuse 2>/dev/null && [[ -e /dev/cuse ]]; }; then
    TRANSPORTS=(cuse socket)
  fi
else
  TRANSPORTS=("$TRANSPORT")
fi
echo "transports: ${TRANSPORTS[*]}" | tee -a "$OUT/host.txt"

# ---------------------------------------------------------------- doctor
timeout "$LIMIT" "$N" doctor >"$OUT/doctor.txt" 2>&1
rc=$?
if ((rc == 0)); then pass doctor "every check ok ($OUT/doctor.txt)"
else fail doctor "exit $rc: $(grep -m3 FAIL "$OUT/doctor.txt" | tr -s ' ' | tr '\n' ';')"; fi
grep -q "^\[ok  \] host NVIDIA driver *version" "$OUT/doctor.txt" ||
  line NOTE "host driver" "doctor does not see a loaded NVIDIA driver"

# ---------------------------------------------------------------- raw runs (once)
STEPS=(init ctx mem stream managed host-alloc module-ptx launch vector-add alloc-loop)
raw "$PROBE" "${STEPS[@]}" >"$OUT/probe.raw.json" 2>"$OUT/probe.raw.err"
raw_rc=$?
if ((raw_rc != 0)) && [[ $DRIVER == host ]]; then
  line NOTE "cuda-probe raw" "exit $raw_rc without nvproxy: $(json "$OUT/probe.raw.json" 'j["failed"]')"
fi
[[ -n $SMI ]] && raw "$SMI" -L >"$OUT/smi-L.raw.txt" 2>&1
raw "$BENCH" simple-control --iters 1000 --batches 5 --warmup 50 >"$OUT/bench.raw.txt" 2>&1
bench_us() { sed -n 's/^RESULT .* median_us=\([0-9.]*\) .*/\1/p' "$1" | head -1; }

# ---------------------------------------------------------------- per transport
# suite T: every exec check through transport T, outputs in $OUT/T/, names prefixed "T: ".
suite() {
  local T=$1 D=$OUT/$1 rc
  mkdir -p "$D"
  local EXEC=("$N" exec --driver "$DRIVER" --gpus "$GPU" --transport "$T")
  # nvidia-smi
  if [[ -z $SMI ]]; then
    skip "$T: nvidia-smi -L" "no nvidia-smi in PATH"
    skip "$T: nvidia-smi -q" "no nvidia-smi in PATH"
  else
    timeout "$LIMIT" "${EXEC[@]}" -- "$SMI" -L >"$D/smi-L.proxied.txt" 2>"$D/smi-L.proxied.err"
    rc=$?
    local want got
    want=$(sed -n "$((GPU + 1))p" "$OUT/smi-L.raw.txt" 2>/dev/null | grep -o 'UUID: GPU-[0-9a-f-]*')
    got=$(grep -o 'UUID: GPU-[0-9a-f-]*' "$D/smi-L.proxied.txt" | tr '\n' ' ')
    # A dry run has no raw listing to compare with: one GPU must be listed.
    [[ $DRIVER == host ]] || want=$(grep -o 'UUID: GPU-[0-9a-f-]*' "$D/smi-L.proxied.txt" | head -1)
    if ((rc == 0)) && [[ -n $want && $got == "$want " ]] && grep -q '^GPU 0:' "$D/smi-L.proxied.txt"; then
      pass "$T: nvidia-smi -L" "$(head -1 "$D/smi-L.proxied.txt")"
    else
      fail "$T: nvidia-smi -L" "exit $rc, proxied [$got] raw GPU $GPU [$want] ($D/smi-L.proxied.*)"
    fi
    timeout "$LIMIT" "${EXEC[@]}" -- "$SMI" -q >"$D/smi-q.proxied.txt" 2>"$D/smi-q.proxied.err"
    rc=$?
    if ((rc == 0)) && grep -q 'Product Name' "$D/smi-q.proxied.txt"; then
      pass "$T: nvidia-smi -q" "$(grep -m1 'Product Name' "$D/smi-q.proxied.txt" | tr -s ' ')"
    else
      fail "$T: nvidia-smi -q" "exit $rc ($D/smi-q.proxied.*)"
    fi
  fi
  # The CUDA driver API
  timeout "$LIMIT" "${EXEC[@]}" --audit-log "$D/audit.jsonl" -- "$PROBE" "${STEPS[@]}" \
    >"$D/probe.proxied.json" 2>"$D/probe.proxied.err"
  local prox_rc=$?
  if ((HAVE_PY)); then
    local s ok
    for s in "${STEPS[@]}"; do
      ok=$(json "$D/probe.proxied.json" "step('$s').get('ok')")
      case $ok in
        true) pass "$T: cuda $s" "$(json "$D/probe.proxied.json" "{k: v for k, v in step('$s').items() if k in ('ms', 'ioctls', 'count', 'checked', 'per_iteration_us', 'htod_dtod_dtoh_equal', 'cpu_round_trip', 'launched')}")" ;;
        false) fail "$T: cuda $s" "$(json "$D/probe.proxied.json" 'j["failed"]' | cut -c1-400)" ;;
        *) fail "$T: cuda $s" "not reached (exit $prox_rc; $D/probe.proxied.*)" ;;
      esac
    done
    local rj=$OUT/probe.raw.json pj=$D/probe.proxied.json
    ratio "$T: ratio cuInit ms" "$(json "$rj" "step('init').get('cuinit_ms')")" "$(json "$pj" "step('init').get('cuinit_ms')")"
    ratio "$T: ratio cuCtxCreate ms" "$(json "$rj" "step('ctx').get('ms')")" "$(json "$pj" "step('ctx').get('ms')")"
    ratio "$T: ratio alloc+free us" "$(json "$rj" "step('alloc-loop').get('per_iteration_us')")" "$(json "$pj" "step('alloc-loop').get('per_iteration_us')")"
  else
    if ((prox_rc == 0)); then pass "$T: cuda-probe" "all steps ($D/probe.proxied.json)"
    else fail "$T: cuda-probe" "exit $prox_rc ($D/probe.proxied.json)"; fi
    skip "$T: ratios" "no python3 to read the JSON"
  fi
  # A 1000-ioctl loop (nv-bench simple-control: RM_CONTROL without pointers), 5 batches.
  timeout "$LIMIT" "${EXEC[@]}" -- "$BENCH" simple-control --iters 1000 --batches 5 --warmup 50 \
    >"$D/bench.proxied.txt" 2>&1
  rc=$?
  local pb
  pb=$(bench_us "$D/bench.proxied.txt")
  if ((rc == 0)) && [[ -n $pb ]]; then
    pass "$T: 1000-ioctl loop" "median ${pb} us per RM_CONTROL ($D/bench.proxied.txt)"
    ((HAVE_PY)) && ratio "$T: ratio 1000-ioctl loop us" "$(bench_us "$OUT/bench.raw.txt")" "$pb"
  else
    fail "$T: 1000-ioctl loop" "exit $rc ($D/bench.proxied.txt)"
  fi
  # PyTorch
  if ((HAVE_PY)) && timeout "$LIMIT" python3 -c 'import torch' 2>/dev/null; then
    local TORCH='import torch, json
torch.manual_seed(0)
a = torch.randn(2048, 2048, device="cuda"); b = torch.randn(2048, 2048, device="cuda")
c = (a @ b).cpu(); ref = a.cpu() @ b.cpu()
print(json.dumps({"ok": True, "max_abs_diff": float((c - ref).abs().max()), "sum": float(c.sum()), "device": torch.cuda.get_device_name(0)}))'
    [[ -e $OUT/torch.raw.json ]] || raw python3 -c "$TORCH" >"$OUT/torch.raw.json" 2>"$OUT/torch.raw.err"
    timeout "$LIMIT" "${EXEC[@]}" -- python3 -c "$TORCH" >"$D/torch.proxied.json" 2>"$D/torch.proxied.err"
    rc=$?
    local d
    d=$(json "$D/torch.proxied.json" 'j["max_abs_diff"]')
    if ((rc == 0)) && [[ -n $d ]] && python3 -c "import sys; sys.exit(0 if float('$d') < 1e-2 else 1)"; then
      pass "$T: torch matmul" "max |gpu - cpu| $d; raw sum $(json "$OUT/torch.raw.json" 'j["sum"]'), proxied sum $(json "$D/torch.proxied.json" 'j["sum"]')"
    else
      fail "$T: torch matmul" "exit $rc ($D/torch.proxied.err: $(tail -1 "$D/torch.proxied.err" | cut -c1-200))"
    fi
  else
    skip "$T: torch matmul" "python3 -c 'import torch' does not work here"
  fi
  # The audit log of the cuda-probe run
  if [[ -s $D/audit.jsonl ]]; then
    timeout "$LIMIT" "$N" audit summary "$D/audit.jsonl" >"$D/audit-summary.txt" 2>&1
    local denied
    denied=$(grep -ci 'denied' "$D/audit-summary.txt")
    pass "$T: audit summary" "$(wc -l <"$D/audit-summary.txt") lines, $denied mention a denial ($D/audit-summary.txt)"
    grep -i 'denied' "$D/audit-summary.txt" | head -20 | sed 's/^/     /' | tee -a "$OUT/summary.txt"
  else
    fail "$T: audit summary" "no audit log written ($D/audit.jsonl)"
  fi
}
for T in "${TRANSPORTS[@]}"; do suite "$T"; done
T=${TRANSPORTS[0]}

# ---------------------------------------------------------------- trace (--record)
# Every driver call of nvidia-smi -q and of cuInit, cuCtxCreate, the memory and module steps
# and the teardown, with request and reply bytes and statuses: what an H200's answers are
# taken from (tests/gpu/README.md).
# trace NAME CMD...: CMD through nvproxy with --record $OUT/trace-NAME.jsonl, checked.
trace() {
  local name=$1 f=$OUT/trace-$1.jsonl rc
  shift
  rm -f "$f"
  timeout "$LIMIT" "$N" exec --driver "$DRIVER" --gpus "$GPU" --transport "$T" \
    --record "$f" --record-limit 24MiB -- "$@" >"$OUT/trace-$name.out" 2>"$OUT/trace-$name.err"
  rc=$?
  if ! ((HAVE_PY)); then
    skip "trace $name" "no python3 to read it ($f, exit $rc)"
    return
  fi
  local sum
  sum=$(python3 - "$f" <<'PY' 2>&1
import collections, json, sys
ls = [json.loads(l) for l in open(sys.argv[1])]
io = [l for l in ls if l["op"] == "ioctl"]
bad = [l for l in io if not (len(l["request"]) == len(l["reply"]) and l["name"])]
notok = collections.Counter((l["name"], l.get("control_name") or l.get("class_name") or "", l["status_name"] or l["nv_status"] or l["errno"])
                            for l in io if l["errno"] is not None or (l["nv_status"] or 0) != 0)
nodes = sorted({l["node"] for l in io})
trunc = any(l["op"] == "truncated" for l in ls)
print(f"{len(io)} ioctls on {','.join(nodes)}, {len({l['name'] for l in io})} escapes/commands, "
      f"{len({l.get('control') for l in io if l.get('control')})} controls, {sum(1 for l in ls if l['op'] in ('open', 'open_mapping'))} opens, "
      f"{len(notok)} kinds not OK{', TRUNCATED' if trunc else ''}")
for (n, c, s), k in sorted(notok.items(), key=str):
    print(f"     not OK: {n} {c} -> {s} x{k}")
sys.exit(1 if bad or trunc or not io else 0)
PY
  )
  local ok=$?
  if ((rc == 0 && ok == 0)); then pass "trace $name" "$(head -1 <<<"$sum") ($f)"
  else fail "trace $name" "exit $rc: $(head -1 <<<"$sum") ($f)"; fi
  tail -n +2 <<<"$sum" | head -20 | tee -a "$OUT/summary.txt"
}
if [[ -n $SMI ]]; then trace smi-q "$SMI" -q; else skip "trace smi-q" "no nvidia-smi in PATH"; fi
trace cuda "$PROBE" init ctx mem module-ptx

# ---------------------------------------------------------------- serve: quotas, upgrade, checkpoint
S=$OUT/serve
mkdir -p "$S"
SRUN=$(mktemp -d /tmp/nvpv.XXXXXX)
MIB=1048576
inst() { printf '[[instance]]\nname = "%s"\ngpus = [%s]\ntransport = "%s"\n%s\n' "$1" "$GPU" "$T" "${2:-}"; }
{
  printf 'driver = "%s"\n[sim]\ngpus = 1\nprocess = true\n[daemon]\nrun_dir = "%s"\n[cdi]\nspec = ""\n' "$DRIVER" "$SRUN"
  inst qa 'gpu_memory = "1GiB"'
  inst qb 'gpu_memory = "2GiB"'
  inst live
} >"$S/config.toml"
nv() { NVPROXY_RUN_DIR=$SRUN timeout "$LIMIT" "$N" "$@"; }
# inrun INSTANCE CMD...: CMD in the served instance, with this script's LD_LIBRARY_PATH.
inrun() {
  local i=$1
  shift
  nv run --instance "$i" -- env LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" "$@"
}
# await FILE: waits (at most --limit) until FILE exists.
await() {
  local t=$SECONDS
  while [[ ! -e $1 ]] && ((SECONDS - t < LIMIT)); do sleep 0.05; done
  [[ -e $1 ]]
}
LEAKS=()
[[ $DRIVER == sim ]] && LEAKS=(--check-leaks)
NVPROXY_RUN_DIR=$SRUN "$N" serve --config "$S/config.toml" "${LEAKS[@]}" >"$S/serve.out" 2>"$S/serve.err" &
SPID=$!
t=$SECONDS
until grep -q READY "$S/serve.out" 2>/dev/null || ! kill -0 $SPID 2>/dev/null || ((SECONDS - t > LIMIT)); do sleep 0.1; done
if ! grep -q READY "$S/serve.out"; then
  fail "serve" "no READY ($S/serve.err: $(tail -1 "$S/serve.err" | cut -c1-200))"
  for c in "two instances, quotas" "live upgrade" "checkpoint" "restore"; do skip "$c" "serve did not start"; done
else
  pass "serve" "instances qa (1GiB), qb (2GiB), live on GPU $GPU, transport $T"
  # Two instances on the one GPU: qb holds 768 MiB; qa sees its quota and its own use only.
  rm -f "$S/qb.ready"*
  inrun qb "$PROBE" --bytes $((768 * MIB)) --ready-file "$S/qb.ready" hold >"$S/qb-hold.json" 2>"$S/qb-hold.err" &
  HPID=$!
  if await "$S/qb.ready"; then
    inrun qa "$PROBE" --bytes $((512 * MIB)) --more-bytes $((768 * MIB)) mem-quota >"$S/qa-quota.json" 2>"$S/qa-quota.err"
    qrc=$?
    smi=""
    [[ -n $SMI ]] && smi=$(inrun qa "$SMI" --query-gpu=memory.total,memory.used --format=csv,noheader,nounits 2>"$S/qa-smi.err")
    nv instance list >"$S/instance-list.txt" 2>&1
    total=$(json "$S/qa-quota.json" "step('mem-quota').get('total')")
    before=$(json "$S/qa-quota.json" "step('mem-quota').get('free_before')")
    more=$(json "$S/qa-quota.json" "step('mem-quota').get('more_result')")
    detail="qa: total $total, free before $before, 512+768 MiB -> CUresult $more; nvidia-smi in qa [$smi]; qb: $(grep -E '^qb ' "$S/instance-list.txt" | tr -s ' ')"
    if ((qrc == 0)) && [[ $total == $((1024 * MIB)) && $more == 2 ]] && ((before > 256 * MIB)) &&
      { [[ -z $SMI ]] || { [[ ${smi%%,*} == 1024 ]] && ((${smi##*, } < 768)); }; }; then
      pass "two instances, quotas" "$detail"
    else
      fail "two instances, quotas" "exit $qrc; $detail ($S/qa-quota.*)"
    fi
  else
    fail "two instances, quotas" "qb's holder never held ($S/qb-hold.err: $(tail -1 "$S/qb-hold.err" | cut -c1-200))"
  fi
  touch "$S/qb.ready.release"
  wait $HPID
  # A live upgrade, twice, under a looping CUDA client (cuMemAlloc + cuMemFree).
  rm -f "$S/live.stop" "$S/live.ready"
  inrun live "$PROBE" --loops 100000000 --stop-file "$S/live.stop" --ready-file "$S/live.ready" \
    alloc-loop >"$S/live-loop.json" 2>"$S/live-loop.err" &
  LPID=$!
  # Upgrade once the client loops (its cuInit and context take seconds on a busy host).
  for _ in $(seq $((LIMIT * 10))); do
    [[ -e $S/live.ready ]] || ! kill -0 $LPID 2>/dev/null && break
    sleep 0.1
  done
  ups=0
  for i in 1 2; do
    nv instance upgrade live >>"$S/upgrade.txt" 2>&1 && ups=$((ups + 1))
    sleep 1
  done
  touch "$S/live.stop"
  wait $LPID
  lrc=$?
  loops=$(json "$S/live-loop.json" "step('alloc-loop').get('loops')")
  if ((lrc == 0 && ups == 2)) && [[ -n $loops ]] && ((loops > 0)); then
    pass "live upgrade" "2 upgrades under the loop, $loops alloc+free, no error ($S/upgrade.txt)"
  else
    fail "live upgrade" "$ups/2 upgrades ($(tail -1 "$S/upgrade.txt" | cut -c1-200)); client exit $lrc, $loops loops: $(json "$S/live-loop.json" 'j["failed"]' | cut -c1-300)"
  fi
  # Checkpoint -> restore by replay. First an instance holding a CUDA context and 64 MiB:
  # what replay cannot rebuild is refused, by kind (INFO); then one holding an RM client, a
  # device and a subdevice (nvfe-client hold), which must come back and keep working.
  rm -f "$S/qa.ready"*
  inrun qa "$PROBE" --bytes $((64 * MIB)) --ready-file "$S/qa.ready" hold >"$S/qa-hold.json" 2>"$S/qa-hold.err" &
  HPID=$!
  if await "$S/qa.ready"; then
    nv instance checkpoint qa "$S/qa-ctx.ckpt.json" >"$S/checkpoint-ctx.txt" 2>&1
    crc=$?
    if ((crc == 0)); then
      nv instance restore "$S/qa-ctx.ckpt.json" >"$S/restore-ctx.txt" 2>&1
      rrc=$?
      touch "$S/qa.ready.release"
      wait $HPID
      hrc=$?
      if ((rrc == 0 && hrc == 0)); then pass "checkpoint (context)" "checkpointed, restored; the holder freed its memory after it"
      else fail "checkpoint (context)" "restore exit $rrc: $(tr '\n' ' ' <"$S/restore-ctx.txt" | cut -c1-300); holder exit $hrc"; fi
    else
      refused=$(python3 - "$S/checkpoint-ctx.txt" <<'PY' 2>/dev/null
import collections, re, sys
t = open(sys.argv[1]).read()
n = re.search(r"(\d+) item\(s\) cannot be replayed", t)
c = collections.Counter(f"{k} ({why.split(' (')[0].strip()})" for k, why in re.findall(r"\(([A-Za-z0-9_]+) 0x[0-9a-f]+\): ([^;\n]+)", t))
print(f"{n.group(1) if n else '?'} items: " + ", ".join(f"{k} x{v}" for k, v in c.most_common()))
PY
      )
      line INFO "checkpoint (context)" "refused: ${refused:-$(tr '\n' ' ' <"$S/checkpoint-ctx.txt" | cut -c1-300)} ($S/checkpoint-ctx.txt)"
      touch "$S/qa.ready.release"
      wait $HPID
    fi
  else
    fail "checkpoint (context)" "qa's holder never held ($S/qa-hold.err)"
    touch "$S/qa.ready.release"
    wait $HPID
  fi
  rm -f "$S/hold.in"
  mkfifo "$S/hold.in"
  inrun qa "$NVFE" hold <"$S/hold.in" >"$S/nvfe-hold.out" 2>"$S/nvfe-hold.err" &
  HPID=$!
  exec 9>"$S/hold.in"
  t=$SECONDS
  until grep -q '"client"' "$S/nvfe-hold.out" 2>/dev/null || ((SECONDS - t > LIMIT)); do sleep 0.05; done
  nv instance checkpoint qa "$S/qa.ckpt.json" >"$S/checkpoint.txt" 2>&1
  crc=$?
  rrc=-1
  ((crc == 0)) && { nv instance restore "$S/qa.ckpt.json" >"$S/restore.txt" 2>&1; rrc=$?; }
  echo check >&9
  t=$SECONDS
  until grep -q '"check"' "$S/nvfe-hold.out" 2>/dev/null || ((SECONDS - t > LIMIT)); do sleep 0.05; done
  echo free >&9
  exec 9>&-
  wait $HPID
  hrc=$?
  checked=$(grep '"check"' "$S/nvfe-hold.out" | tail -1)
  if ((crc == 0 && rrc == 0 && hrc == 0)) && grep -q '"ok":true' <<<"$checked"; then
    pass "checkpoint + restore" "$(tail -1 "$S/restore.txt" | cut -c1-160); the client's handles work after it"
  else
    fail "checkpoint + restore" "checkpoint exit $crc ($(tr '\n' ' ' <"$S/checkpoint.txt" | cut -c1-200)), restore exit $rrc ($(tr '\n' ' ' <"$S/restore.txt" 2>/dev/null | cut -c1-200)), client exit $hrc: ${checked:0:200}"
  fi
  kill -TERM $SPID
  wait $SPID
  src=$?
  if ((src == 0)); then pass "serve stop" "exit 0${LEAKS:+ (--check-leaks: the drivers hold nothing)}"
  else fail "serve stop" "exit $src ($S/serve.err: $(tail -1 "$S/serve.err" | cut -c1-200))"; fi
fi
kill $SPID 2>/dev/null
rm -rf "$SRUN"

line INFO "time" "$((SECONDS - T0)) s"
printf '\n%d passed, %d failed, %d skipped (transports %s; outputs in %s)\n' \
  "$PASS" "$FAIL" "$SKIP" "${TRANSPORTS[*]}" "$OUT" | tee -a "$OUT/summary.txt"
((FAIL == 0))
