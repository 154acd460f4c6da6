#!/usr/bin/env python3
"""A program whose working set changes size halfway through, and which checks every page it reads.

Run under `gleaner run` by `bench/elastic.py` and by `crates/cli/tests/elastic.rs`. It holds one
buffer of max(FIRST, SECOND) MiB; every page carries its own number and a count of the passes
that wrote it. Phase one sweeps the first FIRST MiB `--passes` times, phase two the first SECOND
MiB `--second-passes` times; each sweep reads every page of the working set, checks both fields and writes the
count back incremented, so a page lost or handed back stale by the pager is caught (exit 1).

Prints one line of JSON at the end: each phase's seconds, the pages checked, the wall time.
"""

import argparse
import json
import struct
import sys
import time

PAGE = 4096
MIB = 1 << 20
STAMP = 0x5EED_0000_0000_0000


def sweep(buf, pages, counts, expect_pass):
    """Reads, checks and rewrites pages 0..pages; returns how many were checked."""
    unpack = struct.unpack_from
    pack = struct.pack_into
    for p in range(pages):
        off = p * PAGE
        stamp, count = unpack("<QQ", buf, off)
        if stamp != STAMP | p or count != counts[p]:
            sys.stderr.write(
                f"elastic_workload: page {p} reads stamp {stamp:#x} count {count}, "
                f"expected {STAMP | p:#x} and {counts[p]} (pass {expect_pass})\n"
            )
            sys.exit(1)
        counts[p] = count + 1
        pack("<Q", buf, off + 8, count + 1)
    return pages


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--first-mib", type=int, required=True, help="working set of phase one")
    ap.add_argument("--second-mib", type=int, required=True, help="working set of phase two")
    ap.add_argument("--passes", type=int, default=10, help="sweeps of phase one (and two)")
    ap.add_argument("--second-passes", type=int, help="sweeps of phase two (default: --passes)")
    ap.add_argument("--first-seconds", type=float, default=0.0,
                    help="sweep phase one for at least this long (after --passes)")
    ap.add_argument("--second-seconds", type=float, default=0.0,
                    help="sweep phase two for at least this long (after its passes)")
    a = ap.parse_args()
    total = max(a.first_mib, a.second_mib) * MIB // PAGE
    t0 = time.monotonic()
    buf = bytearray(total * PAGE)
    for p in range(total):
        struct.pack_into("<QQ", buf, p * PAGE, STAMP | p, 0)
    counts = [0] * total
    t_init = time.monotonic() - t0
    checked = 0
    phases = []
    second = a.passes if a.second_passes is None else a.second_passes
    for mib, passes, at_least in ((a.first_mib, a.passes, a.first_seconds),
                                  (a.second_mib, second, a.second_seconds)):
        pages = mib * MIB // PAGE
        start = time.monotonic()
        n = 0
        while n < passes or time.monotonic() - start < at_least:
            checked += sweep(buf, pages, counts, n)
            n += 1
        phases.append({"mib": mib, "passes": n, "seconds": time.monotonic() - start})
    # A last check of every page, whichever phase wrote it.
    checked += sweep(buf, total, counts, -1)
    print(json.dumps({"init_seconds": t_init, "phases": phases, "pages_checked": checked,
                      "wall_seconds": time.monotonic() - t0}), flush=True)


if __name__ == "__main__":
    main()
