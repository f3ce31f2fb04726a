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

Usage: e2e-split.py PERF_SCRIPT.txt  → prints `SPLIT part=share ...` and a short table.
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


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1], errors="replace") as f:
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
