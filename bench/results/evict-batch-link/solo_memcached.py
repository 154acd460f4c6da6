"""memcached alone on a memnode whose link carries 32 MB/s each way: bench/corun.py's solo
memcached cell (fair schedule, 60,000 keys x 1 KiB at 16 MiB local, open loop at 2000 req/s for
8 s, every key read back), run for each variant in turn, REPS times (default 2).

    python3 solo_memcached.py OUT.json NAME[=VALUE] ...

A variant NAME=VALUE sets the environment variable $VAR (default GLEANER_EVICT_BATCH) to VALUE
for its cells (`gleaner run` passes it to the program's pager); a bare NAME unsets it. With
VAR=GLEANER_BIN a variant's VALUE is instead the gleaner binary its cells run (an older build,
its preload library beside it), and a bare NAME runs this tree's. One JSON
line per cell on stdout (memcached's p50/p99 in µs, its pager's fault and eviction stats); OUT.json
keeps every cell's record, and OUT.json.stats/ each cell's `gleaner run --stats` file.
"""
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)
from bench import corun  # noqa: E402
p = {"bandwidth": "32M", "keys": 60000, "vsize": 1024, "rate": 2000, "open_s": 8, "mc_local": "16M",
     "demo_n": 30000, "batch_local": "16M", "mc_weight": 4, "memnode_nice": -20}
DEFAULT_GLEANER = corun.GLEANER
variants = [v.split("=", 1) if "=" in v else (v, None) for v in sys.argv[2:]]
out = sys.argv[1]
res = []
for rep in range(int(os.environ.get("REPS", "2"))):
    for name, val in variants:
        env_key = os.environ.get("VAR", "GLEANER_EVICT_BATCH")
        if env_key == "GLEANER_BIN":
            # The variant names a gleaner binary (an older build) instead; bare: this tree's.
            corun.GLEANER = val or DEFAULT_GLEANER
        elif val is None:
            os.environ.pop(env_key, None)
        else:
            os.environ[env_key] = val
        t0 = time.monotonic()
        rec = corun.cell("solo-memcached", "fair", p, None, rep, None, keep=f"{out}.stats/{name}-{rep}")
        m = rec["programs"]["memcached"]
        st = json.load(open(f"{out}.stats/{name}-{rep}/fair-solo-memcached-rep{rep+1}-memcached.json"))["processes"][0]["stats"]
        line = {"variant": name, "rep": rep, "p50": m.get("p50_us"), "p99": m.get("p99_us"), "ok": m["ok"],
                "fault_p99": st["remote_fault_latency"]["p99_us"], "fault_mean": round(st["remote_fault_latency"]["mean_us"]),
                "waited_on_eviction": st["faults"]["waited_on_eviction"], "handed_back": st["evictions"].get("handed_back"), "lookup_mean": round(st["fault_breakdown"]["lookup_mean_us"]),
                "fetch_mean": round(st["fault_breakdown"]["fetch_mean_us"]), "batches": st["evictions"]["batches"], "next": st["evictions"].get("batch_pages_next"), "us_pp": st["evictions"].get("batch_us_per_page"), "s": round(time.monotonic()-t0)}
        print(json.dumps(line), flush=True)
        res.append({"line": line, "rec": rec})
json.dump(res, open(out, "w"), indent=1)
