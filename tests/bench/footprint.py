#!/usr/bin/env python3
"""footprint.py: the code a request runs, from a valgrind lackey trace of superblocks.

Reads `valgrind --tool=lackey --trace-superblocks=yes --log-file=LOG PROG ...` output of a
program that served N requests (plus its start-up) and prints, for the blocks that ran at least
N times (once per request or more; start-up and one-off paths stay out):
  distinct    how many distinct blocks (each a translation block to QEMU's TCG),
  pages       how many distinct 4 KiB pages of code they lie on,
  executions  block executions per request,
and, with --top K, the functions owning most distinct blocks (from `nm` of PROG, which
valgrind loads at 0x108000 when it is position-independent).

Under TCG every distinct block and page costs a lookup again after each switch between
processes (tests/bench/tcg_cold.c; tests/bench/README.md, "Cold code after every switch").

Usage: footprint.py LOG N [--prog PROG] [--top K] [--label TEXT]
"""

import argparse
import bisect
import collections
import subprocess
import sys

LOAD_BASE = 0x108000  # where valgrind maps a position-independent main program


def blocks(log):
    counts = collections.Counter()
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("SB "):
                counts[int(line.split()[1], 16)] += 1
    return counts


def symbols(prog):
    out = subprocess.run(["nm", "-C", "--defined-only", prog], capture_output=True, text=True,
                         check=True).stdout
    syms = []
    for line in out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in "tTwW":
            syms.append((int(parts[0], 16) + LOAD_BASE, parts[2]))
    syms.sort()
    return syms


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("n", type=int, help="requests the traced run served")
    ap.add_argument("--prog", help="the traced program, for --top")
    ap.add_argument("--top", type=int, default=0)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    if a.n <= 0:
        sys.exit("footprint.py: N must be positive")
    hot = {addr: k for addr, k in blocks(a.log).items() if k >= a.n}
    if not hot:
        sys.exit(f"footprint.py: no block ran {a.n} times in {a.log}")
    pages = len({addr >> 12 for addr in hot})
    execs = sum(hot.values()) / a.n
    print(f"{a.label or a.log}: {len(hot)} distinct blocks on {pages} code pages, "
          f"{execs:.0f} block executions per request")
    if a.top and a.prog:
        syms = symbols(a.prog)
        starts = [s for s, _ in syms]
        owner = collections.Counter()
        for addr in hot:
            i = bisect.bisect_right(starts, addr) - 1
            owner[syms[i][1] if i >= 0 and addr - starts[i] < 1 << 16 else "(shared libraries)"] += 1
        for name, k in owner.most_common(a.top):
            print(f"  {k:5}  {name[:110]}")


if __name__ == "__main__":
    main()
