"""Prints the watchdog table of ../README.md from this directory's cell files (run from here).

Files: NAME.json / NAME.stats.json with NAME = [prefix][build][pair]: no prefix = batch 1
(var2, new), `b` = batch 2 (new2, var2), `c` = batch 3 (new3, var2)."""
import json

CELLS = [
    ("var21", "new1", "var22", "new2"),
    ("bnew21", "bvar21", "bnew22", "bvar22"),
    ("cnew31", "cvar21", "cnew32", "cvar22"),
]
print("| cell | req/s | open p99 µs | CPU of the run µs per request | waited on eviction | reclaim CPU µs per evicted page | watchdog looks |")
print("|---|---|---|---|---|---|---|")
for batch in CELLS:
    for name in batch:
        d = json.load(open(f"{name}.json"))
        r = [r for r in d["workloads"]["memcached"]["runs"] if r["system"] == "gleaner"][0]
        s = json.load(open(f"{name}.stats.json"))["processes"][0]["stats"]
        requests = sum(p["completed"] for p in r["phases"].values())
        rec = s["reclaim"]
        looks = s["evictions"].get("watchdog_looks", "-")
        print(
            f"| {name} | {r['metrics']['throughput']:.0f} | {r['metrics']['p99_us']} "
            f"| {r['usage']['cpu_s'] / requests * 1e6:.1f} | {s['faults']['waited_on_eviction']} "
            f"| {rec['pool_cpu_ns'] / rec['pool_pages'] / 1000:.2f} | {looks} |"
        )
