#!/usr/bin/env python3
"""Prints each harness file's gleaner cell: throughput, open-loop p99, process-tree CPU (this
folder's files by default, or the folder named)."""
import glob
import json
import os
import sys

d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
for p in sorted(glob.glob(os.path.join(d, "*.json"))):
    j = json.load(open(p))
    for w, wd in j["workloads"].items():
        for r in wd["runs"]:
            if r["system"] == "gleaner" and r.get("metrics"):
                m = r["metrics"]
                print(f"{os.path.basename(p):<16} {w} thr {m['throughput']:>8.0f} "
                      f"p99 {m['p99_us']:>7.0f} us  CPU {r['usage']['cpu_s']:.1f}")
