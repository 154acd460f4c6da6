#!/usr/bin/env python3
"""Which 256 KiB requests are slow with the reserve, and why (bench/hermes.py's micro-benchmark,
raw samples): bench/hermes/alloc_latency.c (256 MiB of 256 KiB blocks, 100 us of busy work
between them) in the 1 GiB cgroup beside bench/hermes.py's antagonist ("anon": 700 MiB held and
a 2 GiB file re-read; "file": the file only), glibc and `gleaner run --far off
--latency-critical` alternating. For each reserve run: the reserve's counters (misses, of them
partial hits, the thread's reaction time and longest wake-up delay) and the indices and
latencies (us) of the requests slower than 20 us, from ALLOC_LATENCY_RAW.

Usage: python3 bench/hermes_raw256.py [anon|file] [PAIRS]   (root, for the cgroup)
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hermes  # noqa: E402


def main():
    scenario = sys.argv[1] if len(sys.argv) > 1 else "anon"
    pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    tmp = tempfile.mkdtemp(prefix="gleaner-hermes-raw-")
    binary = os.path.join(tmp, "alloc_latency")
    subprocess.run(["cc", "-O2", "-o", binary,
                    os.path.join(hermes.ROOT, "bench/hermes/alloc_latency.c")], check=True)
    big = hermes.big_file(tmp, 2048)
    cg = hermes.Cgroup(hermes.LIMIT)
    ant = hermes.antagonist(cg, big, anon_mb=700 if scenario == "anon" else 0)
    raw, st = os.path.join(tmp, "raw.txt"), os.path.join(tmp, "stats.json")
    env = {**os.environ, "ALLOC_LATENCY_RAW": raw}
    try:
        for mode in ["glibc", "hermes"] * pairs:
            pre = [] if mode == "glibc" else [hermes.GLEANER, "run", "--far", "off",
                                              "--latency-critical", "-q", "--stats", st, "--"]
            out = subprocess.run(cg.wrap(pre + [binary, "262144", str(256 << 20), "100"]),
                                 env=env, capture_output=True, text=True, check=True)
            d = json.loads(out.stdout.strip().splitlines()[-1])
            lat = [float(x) for x in open(raw)]
            line = f"{scenario} {mode}: mean {d['mean_ns'] / 1000:.1f} us, p99 {d['p99_ns'] / 1000:.1f} us"
            if mode == "hermes":
                r = json.load(open(st))["latency_critical"]["processes"][0]["reserve"]
                slow = [(i, round(v / 1000)) for i, v in enumerate(lat) if v > 20000]
                line += (f"; misses {r['misses']} (partial {r.get('partial_hits')}), thread "
                         f"reaction {r.get('thread_reaction_us')} us, longest wake-up delay "
                         f"{r.get('thread_wake_delay_max_us')} us\n  slow requests (index, us): {slow}")
            print(line, flush=True)
    finally:
        hermes.stop(ant)
        cg.remove()
        subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
