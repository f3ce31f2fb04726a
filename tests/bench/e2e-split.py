#!/usr/bin/env python3
"""Splits a `perf script -F comm,tid,ip,sym,dso` dump (with call chains) into who spent the time.

Each sample is charged to the first frame, from the leaf up, that belongs to a known part:
  driver   the simulated driver (`nvsim::`), and its own threads (`nvsim-*`)
  proxy    our request path and transports (`ioctl_proxy`, `uvm`, `nvproxy_worker`, `cuse_dev`,
           `host_driver`, `nvproxy_abi`, `tenant_log`) and the shim in the client
           (`libnvproxy_preload.so`)
  client   the CUDA client (`libcuda`, `cuda-probe`)
  startup  nvproxy's start-up and supervision (`nvproxy::`, `nvproxy_config`, clap)
A kernel frame at the leaf is charged to the user code that made the system call. A sample whose
stack names none of them is charged by its thread's name (`dev-*`: the worker's request threads,
`nvsim-*`: the driver's, the client's threads), else to `other`.

Usage: e2e-split.py PERF_SCRIPT.txt  → prints `SPLIT part=share ...`.
       e2e-split.py --thread COMM PERF_SCRIPT.txt  → the samples of the threads named COMM
       (e.g. `cuse-worker`, the CUSE request threads) by what they ran: each system call
       (charged by the user function that made it) and the user code by part (cuse-dev, the
       request path, the worker's glue, nvsim; library code charged to the part that called
       it), one `PART share` line each.
"""
import re
import sys
from collections import Counter

PARTS = ("client", "proxy", "driver", "startup", "other")
PROXY = ("ioctl_proxy::", "uvm::", "nvproxy_worker::", "cuse_dev::", "host_driver::",
         "nvproxy_abi::", "tenant_log::")
STARTUP = ("nvproxy::", "nvproxy_config::", "clap_builder::", "clap_lex::")


def frame_part(sym: str, dso: str):
    s = sym.lstrip("<&")
    if s.startswith("nvsim::"):
        return "driver"
    if s.startswith(PROXY) or "libnvproxy_preload" in dso:
        return "proxy"
    if "libcuda" in dso or dso.endswith("/cuda-probe") or s.startswith("cuda_probe::"):
        return "client"
    if s.startswith(STARTUP):
        return "startup"
    return None


def comm_part(comm: str):
    if comm.startswith("nvsim-"):
        return "driver"
    if comm.startswith("dev-") or comm == "cuse-worker":
        return "proxy"
    if comm.startswith("cuda"):
        return "client"
    return "other"


def split(lines):
    counts = Counter()
    comm, part = None, None

    def flush():
        if comm is not None:
            counts[part or comm_part(comm)] += 1

    frame = re.compile(r"^\s+[0-9a-f]+ (.*) \((.*)\)$")
    for line in lines:
        if not line.strip():
            continue
        if not line[0].isspace():
            flush()
            comm, part = line.split()[0], None
            continue
        m = frame.match(line.rstrip("\n"))
        if m and part is None:
            part = frame_part(m.group(1), m.group(2))
    flush()
    return counts


THREAD_PARTS = (("nvsim::", "user: simulated driver (nvsim)"), ("cuse_dev::", "user: cuse-dev"),
                ("ioctl_proxy::", "user: request path"), ("uvm::", "user: request path"),
                ("nvproxy_abi::", "user: request path"), ("nvproxy_worker::", "user: worker glue"))
SYSCALLS = ("process_vm_readv", "process_vm_writev", "writev", "read", "write", "recvmsg",
            "sendmsg", "poll", "ioctl")


def thread_split(lines, comm):
    """The samples of threads named `comm`, by system call and by the part of the user code."""
    counts = Counter()
    cur, frames = None, []
    frame = re.compile(r"^\s+[0-9a-f]+ (.*) \((.*)\)$")

    def flush():
        if cur != comm or not frames:
            return
        if "kernel" in frames[0][1]:
            user = next((s for s, d in frames if "kernel" not in d), "")
            name = next((c for c in SYSCALLS if c in user), "other")
            counts["syscall: " + name] += 1
            return
        for sym, _ in frames:
            s = sym.lstrip("<&")
            part = next((name for prefix, name in THREAD_PARTS if s.startswith(prefix)), None)
            if part:
                counts[part] += 1
                return
        counts["user: libraries (no caller of ours unwound)"] += 1

    for line in lines:
        if not line.strip():
            continue
        if not line[0].isspace():
            flush()
            cur, frames = line.split()[0], []
            continue
        m = frame.match(line.rstrip("\n"))
        if m:
            frames.append((m.group(1), m.group(2)))
    flush()
    return counts


def main():
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == "--thread":
        with open(args[2], errors="replace") as f:
            counts = thread_split(f, args[1])
        total = sum(counts.values())
        if total == 0:
            print(f"e2e-split: no samples of {args[1]}", file=sys.stderr)
            return 1
        print(f"{total} samples of {args[1]}")
        for part, n in counts.most_common():
            print(f"{100 * n / total:5.1f} %  {part}")
        return 0
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with open(args[0], errors="replace") as f:
        counts = split(f)
    total = sum(counts.values())
    if total == 0:
        print("e2e-split: no samples", file=sys.stderr)
        return 1
    print("SPLIT samples=%d " % total + " ".join(
        "%s=%.3f" % (p, counts[p] / total) for p in PARTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
