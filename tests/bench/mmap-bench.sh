#!/usr/bin/env bash
# mmap-bench.sh: the cost of one mmap through nvproxy's shim (ticket ioctl on the node + the
# instance socket + mmap of the host fd + munmap) against a plain mmap + munmap of a memfd, and
# what the shim adds to an unrelated file mapping (one fstat) and to an anonymous one (nothing),
# with the node path split into one CUSE round trip (HELLO) and ticket + socket, all in ONE VM run (tests/vm/cuse-vm; the guest is emulated, so only the ratios mean much).
# The node is the simulated driver's nvidiactl with an RM mmap context (NV01_MEMORY_SYSTEM
# mapped by NV_ESC_RM_MAP_MEMORY), served by `nvproxy exec --driver sim`, once with each
# client-memory transport (the ticket ioctl reads its argument through it).
#
# Usage: tests/bench/mmap-bench.sh [--iters N] [--batches B] [--reps R] [--out FILE.md]
# Environment: CARGO_TARGET_DIR as usual; CUSE_VM_* as documented in tests/vm/cuse-vm.
# Builds nvproxy, the shim and mmap-bench (release) on the host, then boots one VM.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd -P)
source tests/bench/build-nvproxy.sh
ITERS=200 BATCHES=3 REPS=5 OUT= GUEST=0
while (($#)); do
  case $1 in
    --iters) ITERS=${2:?}; shift 2 ;;
    --batches) BATCHES=${2:?}; shift 2 ;;
    --reps) REPS=${2:?}; shift 2 ;;
    --out) OUT=${2:?}; shift 2 ;;
    --guest) GUEST=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "mmap-bench: unknown argument $1" >&2; exit 2 ;;
  esac
done
for v in "$ITERS" "$BATCHES" "$REPS"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "mmap-bench: --iters, --batches, --reps take positive numbers" >&2; exit 2; }
done
[[ -z $OUT || $OUT == /* ]] || OUT=$PWD/$OUT
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[[ $TARGET == /* ]] || TARGET=$ROOT/$TARGET
BIN=$TARGET/release
NVPROXY=${NVPROXY:-$BIN/nvproxy} # build_nvproxy sets it (tests/bench/build-nvproxy.sh)

if ((GUEST)); then
  echo "KERNEL $(uname -r)"
  for mem in process-vm retry; do
    line=$("$NVPROXY" exec --driver sim --check-leaks --memory "$mem" -- \
      "$BIN/mmap-bench" --iters "$ITERS" --batches "$BATCHES" --reps "$REPS" | tail -n 1) || true
    echo "RESULT $mem $line"
  done
  exit 0
fi

echo "mmap-bench: building (release)" >&2
build_nvproxy --vm
cargo build --release -q -p preload
cargo build --release -q -p tests --bin mmap-bench
rw=()
real_target=$(cd "$TARGET" && pwd -P)
[[ $real_target == "$ROOT"/* ]] || rw=(--rw "$real_target")
echo "mmap-bench: running in the VM (iters=$ITERS batches=$BATCHES reps=$REPS)" >&2
raw=$(CARGO_TARGET_DIR=$TARGET "$ROOT/tests/vm/cuse-vm" --timeout 1500 "${rw[@]}" -- \
  bash "$ROOT/tests/bench/mmap-bench.sh" --guest --iters "$ITERS" --batches "$BATCHES" --reps "$REPS")
printf '%s\n' "$raw" | OUT=$OUT python3 <(cat <<'PY'
import json, os, sys
rows, kernel, ok, n = [], "?", True, ""
for line in sys.stdin:
    if line.startswith("KERNEL "):
        kernel = line.split(None, 1)[1].strip()
    if not line.startswith("RESULT "):
        continue
    _, mem, rest = (line.rstrip("\n").split(" ", 2) + [""])[:3]
    try:
        v = json.loads(rest)
    except ValueError:
        v = {"ok": False, "error": rest or "no output"}
    if not v.get("ok"):
        ok = False
        rows.append("| %s | FAILED: %s | | | | | |" % (mem, v.get("error")))
        continue
    k = v["kinds"]
    def cell(name):
        x = k[name]
        return "%.1f µs (%.2fx, %.2f-%.2f)" % (x["median_us"], x["ratio_to_plain"], x["ratio_min"], x["ratio_max"])
    rows.append("| %s | %.1f µs | %s | %s | %s | %s | %s |" % (mem, k["plain"]["median_us"], cell("file"), cell("anon"), cell("hello"), cell("redeem"), cell("node")))
    n = "%d pairs x %d batches x %d repetitions" % (v["iters"], v["batches"], v["reps"])
head = ["",
        "mmap + munmap of 4 KiB, one VM run, kernel %s (TCG), %s; each batch paired with a plain batch; ratio to plain: median (range over repetitions)" % (kernel, n),
        "",
        "| transport | plain: memfd, raw syscall | memfd through the shim | anonymous through the shim | HELLO ioctl (1 CUSE round trip) | ticket + socket, no mmap | our node through the shim |",
        "|---|---|---|---|---|---|---|"]
text = "\n".join(head + rows) + "\n"
print(text)
if os.environ.get("OUT"):
    open(os.environ["OUT"], "w").write(text)
sys.exit(0 if ok else 1)
PY
)
