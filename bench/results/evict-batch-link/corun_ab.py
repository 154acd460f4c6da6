"""The co-run cell (fair schedule) with two builds of gleaner, interleaved.

    python3 corun_ab.py OUT.json NAME=DIR ...   (DIR holds gleaner and libgleaner_preload.so)
"""
import json, os, subprocess, sys, time
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)
from bench import corun
from bench.harness.common import python_exe
p = {"bandwidth": "32M", "keys": 60000, "vsize": 1024, "rate": 2000, "open_s": 8, "mc_local": "16M",
     "demo_n": 30000, "batch_local": "16M", "mc_weight": 4, "memnode_nice": -20}
want = corun._checksum(subprocess.run([python_exe(), corun.DEMO_JOB, str(p["demo_n"])], capture_output=True,
                                      text=True, timeout=900).stdout)
builds = [a.split("=", 1) for a in sys.argv[2:]]
res = []
for rep in range(int(os.environ.get("REPS", "3"))):
    for name, d in builds:
        corun.GLEANER = os.path.join(d, "gleaner")
        t0 = time.monotonic()
        rec = corun.cell("corun", "fair", p, want, rep, None)
        pr = rec["programs"]
        line = {"build": name, "rep": rep, "mc_p99": pr["memcached"].get("p99_us"),
                "b1": pr["batch1"].get("wall_s"), "b2": pr["batch2"].get("wall_s"),
                "ok": rec["ok"], "s": round(time.monotonic() - t0)}
        print(json.dumps(line), flush=True)
        res.append({"line": line, "rec": rec})
json.dump(res, open(sys.argv[1], "w"), indent=1)
