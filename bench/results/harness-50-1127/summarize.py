#!/usr/bin/env python3
"""Summarise the issue-11 target cells of this directory's harness runs: per run and workload,
gleaner's and Linux swap's throughput and p99, their ratios, and the medians over the runs of
each placement (pinned / unpinned)."""
import glob
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def cells(path):
    d = json.load(open(path))
    out = {}
    for w, wd in d["workloads"].items():
        by = {}
        for r in wd["runs"]:
            # A failed cell (an OOM kill under Linux swap, say) has no throughput: left out.
            if r["system"] in ("gleaner", "linux-swap") and "throughput" in r.get("metrics", {}):
                by[r["system"]] = r
        if len(by) == 2:
            out[w] = by
    return d, out


def main():
    # The folder to summarise: this script's own by default, or the one named (another run of
    # the same cells, e.g. `python3 ../harness-50-1127/summarize.py .`).
    here = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else HERE
    rows = {}
    for path in sorted(glob.glob(os.path.join(here, "p*.json")) + glob.glob(os.path.join(here, "u*.json"))):
        name = os.path.basename(path)[:-5]
        placement = "pinned" if name.startswith("pinned") else "unpinned"
        d, cs = cells(path)
        for w, by in cs.items():
            g, l = by["gleaner"], by["linux-swap"]
            gt, lt = g["metrics"]["throughput"], l["metrics"]["throughput"]
            gp, lp = g["metrics"]["p99_us"], l["metrics"]["p99_us"]
            print(f"{name:<12} {w:<10} gleaner {gt:>9.0f} p99 {gp:>7.0f} µs | linux {lt:>9.0f} "
                  f"p99 {lp:>7.0f} µs | throughput {gt / lt:.2f}x p99 {gp / lp:.2f}x | "
                  f"faults {g.get('far_faults', '?')} / "
                  f"{l.get('far_faults', '?')} | "
                  f"CPU s {g['usage']['cpu_s']:.1f} / {l['usage']['cpu_s']:.1f}")
            rows.setdefault((placement, w), []).append((gt / lt, gp / lp))
    print()
    for (placement, w), v in sorted(rows.items()):
        t = [x[0] for x in v]
        p = [x[1] for x in v]
        print(f"{placement:<9} {w:<10} runs {len(v)}: throughput median {statistics.median(t):.2f}x "
              f"({min(t):.2f}-{max(t):.2f}), p99 median {statistics.median(p):.2f}x "
              f"({min(p):.2f}-{max(p):.2f})")


if __name__ == "__main__":
    main()
