"""Prints the table of this directory's README from its cell files (run from this directory)."""
import json

print("| cell | req/s | open p99 µs | CPU of the run µs per request | remote faults | waited on eviction | reclaim CPU µs per evicted page |")
print("|---|---|---|---|---|---|---|")
for cell in ("I1", "B1", "B2", "I2"):
    d = json.load(open(f"{cell}.json"))
    r = [r for r in d["workloads"]["memcached"]["runs"] if r["system"] == "gleaner"][0]
    s = json.load(open(f"{cell}.stats.json"))["processes"][0]["stats"]
    requests = sum(p["completed"] for p in r["phases"].values())
    rec = s["reclaim"]
    print(
        f"| {cell} | {r['metrics']['throughput']:.0f} | {r['metrics']['p99_us']} "
        f"| {r['usage']['cpu_s'] / requests * 1e6:.1f} | {s['faults']['remote']} "
        f"| {s['faults']['waited_on_eviction']} "
        f"| {rec['pool_cpu_ns'] / max(rec['pool_pages'], 1) / 1000:.2f} |"
    )
