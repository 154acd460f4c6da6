#!/usr/bin/env python3
"""Prefetching and eviction benchmarks (Leap, RackMem; issue 5), every variant in the same run.

1. `gleaner bench micro` patterns seq, stride:10, two threads with different strides (two:2,5)
   and random, at 50% and 25% local memory, under every prefetcher (none, next:8, stride,
   readahead, leap with marker install, and leap with staged install to compare the two ways of
   handing pages over): wall time per access, remote faults, accuracy, coverage, late ratio;
   all-local ns/access beside them (measured by the same command). Every run verifies a
   checksum of all the data it read.
2. Fault traces of two real programs recorded under `gleaner run --trace` (a PageRank job and
   memcached under a Zipf load), replayed with `gleaner trace replay` under every prefetcher and
   eviction policy, with exact LRU and Belady's optimum as references.

    python3 bench/prefetch.py [--quick] [--out bench/results/prefetch.json]
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.harness.common import (BUILD, GLEANER, free_port, machine, now_iso,  # noqa: E402
                                  git_commit, wait_port)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MCLOAD = os.path.join(BUILD, "mcload")
PATTERNS = ["seq", "stride:10", "two:2,5", "random"]
VARIANTS = [("none", "marker"), ("next:8", "marker"), ("stride", "marker"),
            ("readahead", "marker"), ("leap", "marker"), ("leap", "staged"), ("leap:32", "marker")]
# Random access is where a prefetcher must back off, and the differences to measure are a few
# percent: its runs are repeated, interleaved, and the median reported.
RANDOM_REPS = 3


def log(*a):
    print("[prefetch]", *a, file=sys.stderr, flush=True)


def micro(pattern, ratio, prefetch, install, size, passes):
    cmd = [GLEANER, "bench", "micro", "--pattern", pattern, "--size", size, "--local",
           f"{ratio}%", "--prefetch", prefetch, "--prefetch-install", install, "--passes",
           str(passes), "--floor-samples", "0", "--json"]
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {out.stderr[-600:]}")
    d = json.loads(out.stdout)
    if not d["checksum_ok"]:
        raise RuntimeError(f"{' '.join(cmd)}: checksum mismatch")
    st = d["region"]
    pf = st["prefetch"]
    return {"pattern": pattern, "ratio": ratio, "prefetch": prefetch, "install": install,
            "command": " ".join(cmd), "wall_s": round(time.monotonic() - t0, 2),
            "ns_per_access": d["ns_per_op"], "ns_per_access_all_local": d["ns_per_op_all_local"],
            "remote_faults": st["faults"]["remote"], "prefetch_hit_faults": st["faults"]["prefetch_hit"],
            "issued": pf["issued"], "used": pf["used"], "late": pf["late"], "wasted": pf["wasted"],
            "accuracy": pf["accuracy"], "coverage": pf["coverage"], "late_ratio": pf["late_ratio"],
            "checksum_ok": d["checksum_ok"]}


def record_pagerank(tmp, mib_nodes):
    path = os.path.join(tmp, "pagerank-%p.trace")
    job = os.path.join(ROOT, "bench", "harness", "jobs", "pagerank_job.py")
    cmd = [GLEANER, "run", "-q", "--local-mem", "32M", "--trace", path, "--", sys.executable, job] + mib_nodes
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"{cmd}: {p.stderr[-500:]}")
    return biggest(glob.glob(os.path.join(tmp, "pagerank-*.trace"))), " ".join(cmd)


def record_memcached(tmp, keys):
    path = os.path.join(tmp, "memcached-%p.trace")
    port = free_port()
    cmd = [GLEANER, "run", "-q", "--local-mem", "48M", "--trace", path, "--", "memcached", "-p", str(port),
           "-U", "0", "-l", "127.0.0.1", "-m", "1024", "-t", "2", "-u", "root"]
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not wait_port(port, srv, timeout=60):
            raise RuntimeError("memcached did not start")
        base = ["127.0.0.1", str(port), str(keys), "1024"]
        for args in (["load"] + base, ["open"] + base + ["5000", "6", "95", "0.99", "4", "1"]):
            r = subprocess.run([MCLOAD] + args, capture_output=True, text=True, timeout=900)
            if r.returncode != 0:
                raise RuntimeError(f"mcload {args[0]}: {r.stderr[-300:]}")
    finally:
        srv.terminate()
        srv.wait(60)
    return biggest(glob.glob(os.path.join(tmp, "memcached-*.trace"))), " ".join(cmd)


def biggest(paths):
    if not paths:
        raise RuntimeError("no trace was written")
    return max(paths, key=os.path.getsize)


def replay(trace, local):
    cmd = [GLEANER, "trace", "replay", trace, "--local", local, "--visibility", "fault", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"{cmd}: {p.stderr[-500:]}")
    return json.loads(p.stdout), " ".join(cmd[:3] + [os.path.basename(trace)] + cmd[4:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "prefetch.json"))
    ap.add_argument("--only", choices=["micro", "traces"], action="append")
    a = ap.parse_args()
    only = set(a.only or ["micro", "traces"])
    size, passes = ("64M", 1) if a.quick else ("256M", 2)
    res = {"schema": 1, "date": now_iso(), "git_commit": git_commit(), "machine": machine(),
           "command": "python3 bench/prefetch.py" + (" --quick" if a.quick else ""),
           "micro": {"size": size, "passes": passes, "runs": []}, "traces": []}
    if "micro" in only:
        for pattern in PATTERNS:
            for ratio in (50, 25):
                reps = RANDOM_REPS if pattern == "random" else 1
                by_variant = {v: [] for v in VARIANTS}
                for rep in range(reps):
                    for prefetch, install in VARIANTS:
                        r = micro(pattern, ratio, prefetch, install, size, passes)
                        log(f"{pattern:10s} {ratio}% {prefetch:9s} {install:6s} {r['ns_per_access']:9.0f} ns "
                            f"acc {r['accuracy']:.2f} cov {r['coverage']:.2f} faults {r['remote_faults']}")
                        by_variant[(prefetch, install)].append(r)
                for v, rs in by_variant.items():
                    rs.sort(key=lambda r: r["ns_per_access"])
                    med = dict(rs[len(rs) // 2])
                    if reps > 1:
                        med["reps_ns_per_access"] = [r["ns_per_access"] for r in rs]
                    res["micro"]["runs"].append(med)
    if "traces" in only:
        tmp = tempfile.mkdtemp(prefix="gleaner-traces-")
        for name, rec in (("pagerank", lambda: record_pagerank(tmp, ["50000", "1000000", "3"] if a.quick else ["300000", "6000000", "5"])),
                          ("memcached", lambda: record_memcached(tmp, 30000 if a.quick else 100000))):
            log(f"recording {name}")
            path, cmd = rec()
            for local in ("50%", "25%"):
                log(f"replaying {name} at {local}")
                out, rcmd = replay(path, local)
                res["traces"].append({"program": name, "record_command": cmd, "replay_command": rcmd,
                                      "trace_bytes": os.path.getsize(path), "local": local, "replay": out})
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    log("wrote", a.out)


if __name__ == "__main__":
    main()
