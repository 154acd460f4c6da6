#!/usr/bin/env python3
"""Prints the tables of this folder's README from its JSON files: far faults per 1,000
requests over each measured phase, throughput and p99 of every gleaner and Linux-swap cell of the
harness runs, and the programs' wall times and far faults.

    python3 bench/results/access-scan/two-lists/summarize.py
"""
import glob
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))


def servers(pattern):
    for f in sorted(glob.glob(os.path.join(HERE, pattern))):
        d = json.load(open(f))
        for wname, w in d["workloads"].items():
            for r in w["runs"]:
                if r["system"] == "all-local":
                    continue
                m = r["metrics"]
                pf = r.get("phase_far_faults", {})
                phases = ", ".join(f"{k} {v['per_1000_requests']:.0f}" for k, v in pf.items())
                print(f"| {os.path.basename(f)} | {wname} | {r['system']} | {r['ratio']}% | "
                      f"{m.get('throughput', 0):,.0f} | {m.get('p99_us')} | {phases} |")


def programs():
    rows = {}
    for f in sorted(glob.glob(os.path.join(HERE, "programs", "*.json"))):
        build = os.path.basename(f).split("-")[1]
        d = json.load(open(f))
        for name, job in d["jobs"].items():
            for r in job.get("gleaner", []):
                if r.get("ok"):
                    rows.setdefault((name, build), []).append((r["wall_s"], r["far_faults"]))
    for (job, build), xs in sorted(rows.items()):
        walls = [w for w, _ in xs]
        faults = [f for _, f in xs]
        print(f"| {job} | {build} | {', '.join(f'{w:.2f}' for w in walls)} | "
              f"{statistics.median(walls):.2f} | {', '.join(f'{f:,}' for f in faults)} |")


if __name__ == "__main__":
    print("| file | workload | system | local | throughput/s | p99 us (open loop) | far faults / 1,000 requests |")
    print("|---|---|---|---|---|---|---|")
    servers("*.json")
    print()
    print("| job | build | gleaner wall s | median | far faults |")
    print("|---|---|---|---|---|")
    programs()
