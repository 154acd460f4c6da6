#!/usr/bin/env python3
"""How many hits the soft-memory runtime keeps at a fixed grant, against an exact LRU cache
and the ideal for independent requests, over the bench's request stream (issue 46).

    python3 bench/soft_hits.py [--sizes 4,8,12,16,24] [--secs 12] [--out FILE]

Runs the three applications of bench/midas.py (target/release/soft-workload: storage,
memo-100us, memo-1ms; 2048 items of 16 KiB, Zipf 0.9, 20 us of work a request) at once, with
no daemon, each with the same fixed grant (`--limit`), one grant after another. For each it
takes the miss ratio over the last half of the run from the programs' own counters, and sets
beside it, for the same number of objects (the grant's 2 MiB segments x the items one holds):
an exact LRU cache simulated over a Zipf(0.9) stream of the same items (requests are
independent, so the stream's order beyond its distribution does not matter), and the ideal
for independent requests (the most popular items that fit). Writes a JSON file and prints a
table.
"""
import argparse
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import midas  # noqa: E402  (the same applications and their flags)

MB = 1 << 20
SEG = 2 * MB
HEADER = 16


def zipf_probs(n, s):
    p = [1.0 / (k ** s) for k in range(1, n + 1)]
    t = sum(p)
    return [x / t for x in p]


def lru_miss_ratio(probs, capacity, requests, seed=1):
    """Misses of an exact LRU cache of `capacity` items over `requests` independent Zipf
    requests (the first third warms it)."""
    rng = random.Random(seed)
    keys = rng.choices(range(len(probs)), weights=probs, k=requests)
    cache = collections.OrderedDict()
    warm = requests // 3
    misses = 0
    for t, k in enumerate(keys):
        if k in cache:
            cache.move_to_end(k)
            continue
        if t >= warm:
            misses += 1
        cache[k] = True
        if len(cache) > capacity:
            cache.popitem(last=False)
    return misses / (requests - warm)


def run_size(specs, limit, secs):
    apps = [midas.App(n, a, secs, limit=limit) for n, a in specs]
    for a in apps:
        a.wait(secs + 30)
    out = {}
    for a in apps:
        rep = a.reports
        half = [r for r in rep if r["t"] >= secs / 2]
        first, last = half[0], rep[-1]
        hits = last["hits"] - first["hits"]
        misses = last["misses"] - first["misses"]
        out[a.name] = {"miss_ratio": misses / max(hits + misses, 1), "requests": hits + misses,
                       "bad": a.bad()}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4,8,12,16,24", help="grants to try, MiB (comma-separated)")
    ap.add_argument("--secs", type=float, default=12, help="seconds per grant")
    ap.add_argument("--out", help="results file (default bench/results/midas/soft-hits.json)")
    args = ap.parse_args()
    objects, size = 2048, 16384
    per_seg = SEG // (size + HEADER)
    tmp = tempfile.mkdtemp(prefix="gleaner-soft-hits-")
    blocks = os.path.join(tmp, "blocks")
    midas.make_file(blocks, objects * size)
    specs = midas.app_specs(objects, size, blocks)
    probs = zipf_probs(objects, 0.9)
    ranked = sorted(probs, reverse=True)
    rows = []
    for mib in [int(x) for x in args.sizes.split(",")]:
        limit = mib * MB
        cap = (limit // SEG) * per_seg
        measured = run_size(specs, limit, args.secs)
        lru = lru_miss_ratio(probs, cap, 300_000)
        ideal = 1.0 - sum(ranked[:min(cap, objects)])
        rows.append({"grant_mib": mib, "objects": cap, "lru_miss": lru, "ideal_miss": ideal,
                     "pools": measured})
        print(f"{mib:3d} MiB ({cap:4d} items): LRU {lru:.3f} ideal {ideal:.3f} | " +
              " ".join(f"{n} {m['miss_ratio']:.3f}" for n, m in measured.items()), file=sys.stderr)
    os.unlink(blocks)
    os.rmdir(tmp)
    git = subprocess.run(["git", "-C", midas.ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    res = {"script": "bench/soft_hits.py", "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "git_commit": git.stdout.strip(), "bin": midas.BIN, "secs": args.secs, "rows": rows}
    out = args.out or os.path.join(midas.ROOT, "bench", "results", "midas", "soft-hits.json")
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    bad = sum(m["bad"] or 0 for r in rows for m in r["pools"].values())
    print(json.dumps({"results": os.path.relpath(out, midas.ROOT), "bad_reads": bad}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
