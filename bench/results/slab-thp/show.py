#!/usr/bin/env python3
"""One line per run of ab.sh: the fault's steps and the reclaim thread's CPU per page.

    show.py micro FILE LABEL    (a `gleaner bench micro --json` file)
    show.py run FILE LABEL      (a `gleaner run --stats` file)
"""
import json
import sys

kind, path, label = sys.argv[1:4]
d = json.load(open(path))
s = d["region"] if kind == "micro" else d["processes"][0]["stats"]
fb, rc, c = s["fault_breakdown"], s["reclaim"], s["store"]["codec"]
line = (f"{label} | lookup {fb['lookup_mean_us']:.2f} fetch {fb['fetch_mean_us']:.2f} "
        f"install {fb['install_mean_us']:.2f} µs; blob copy "
        f"{c['blob_copy_ns_total'] / max(1, c['blobs_open_timed']):.0f} ns; reclaim CPU "
        f"{rc['pool_cpu_ns'] / max(1, rc['pool_pages']):.0f} ns/page; far faults "
        f"{s['faults']['remote']}")
if kind == "micro":
    f = d["remote_fault_app_visible"]
    line += f"; ns/op {d['ns_per_op']:.0f}, fault p50 {f['p50_us']:.2f} mean {f['mean_us']:.2f} µs"
print(line)
