#!/usr/bin/env python3
"""Summarises the harness runs of this folder: per workload and system, throughput, p99 and far
faults per 1,000 requests over the measured phase (memcached's closed loop, redis's GET
benchmark), each as a ratio to Linux swap in the same round.

    python3 bench/results/access-scan/summarize.py bench/results/access-scan
"""
import glob
import json
import os
import sys

PHASE = {"memcached": "closed", "redis": "get"}


def cells(path):
    d = json.load(open(path))
    for wl, w in d["workloads"].items():
        for r in w["runs"]:
            if r["system"] == "all-local" or not r.get("ok"):
                continue
            yield wl, r


def main(folder):
    rounds = sorted({os.path.basename(f).split("-")[-1] for f in glob.glob(f"{folder}/*-[0-9].json")})
    print("| workload | round | system | throughput | x Linux | p99 us | x Linux | far faults / 1,000 req "
          "(phase) | x Linux |")
    print("|---|---|---|---|---|---|---|---|---|")
    for wl in PHASE:
        for rnd in rounds:
            rows = {}
            for f in sorted(glob.glob(f"{folder}/*-{rnd}")):
                label = os.path.basename(f).rsplit("-", 1)[0]
                for w, r in cells(f):
                    if w != wl:
                        continue
                    name = "linux-swap" if r["system"] == "linux-swap" else f"gleaner ({label})"
                    ph = (r.get("phase_far_faults") or {}).get(PHASE[wl], {})
                    rows[name] = (r["metrics"]["throughput"], r["metrics"].get("p99_us"),
                                  ph.get("per_1000_requests"))
            lx = rows.get("linux-swap")
            for name, (thr, p99, ff) in sorted(rows.items()):
                def ratio(i, v):
                    return f"{v / lx[i]:.2f}" if lx and v and lx[i] else "-"
                print(f"| {wl} | {rnd[:-5]} | {name} | {thr:,.0f} | {ratio(0, thr)} | {p99} | "
                      f"{ratio(1, p99)} | {ff} ({PHASE[wl]}) | {ratio(2, ff)} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
