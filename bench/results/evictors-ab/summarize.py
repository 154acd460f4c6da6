"""Prints the table of this directory's README from its cell files (run from this directory)."""
import json

print("| cell | req/s | open p99 µs | CPU of the run (memcached, pager, memnode) µs per request | remote faults | fault p99 µs | duplicate faults | waited on eviction | reclaim CPU µs per evicted page |")
print("|---|---|---|---|---|---|---|---|---|")
for n in (1, 2, 3, 4):
    for x in ("base", "new"):
        d = json.load(open(f"{x}{n}.json"))
        r = [r for r in d["workloads"]["memcached"]["runs"] if r["system"] == "gleaner"][0]
        s = json.load(open(f"{x}{n}.stats.json"))["processes"][0]["stats"]
        requests = sum(p["completed"] for p in r["phases"].values())
        rec = s["reclaim"]
        print(
            f"| {x}{n} | {r['metrics']['throughput']:.0f} | {r['metrics']['p99_us']} "
            f"| {r['usage']['cpu_s'] / requests * 1e6:.1f} | {s['faults']['remote']} "
            f"| {r['gleaner']['remote_fault_p99_us']:.0f} | {s['faults']['concurrent_duplicate']} "
            f"| {s['faults']['waited_on_eviction']} "
            f"| {rec['pool_cpu_ns'] / max(rec['pool_pages'], 1) / 1000:.2f} |"
        )
