"""Zero-fill ahead for fills in order that another handler or another fill interrupted: the
build before (`BASE`) against the build with it (`NEW`), interleaved, on the jobs whose first
touches it changes: the quick-start demo job at 64M, the harness's xgboost and pagerank jobs at
100% and 50% of their footprint. Writes ab.json (every run's command, wall time, checksum check
against all-local, fault counts) and prints a line per run.

    BASE=/tmp/base-bin/gleaner NEW=/tmp/new-bin/gleaner python3 bench/results/zero-ahead/ab.py [REPS]

`OUT=name.json` writes that file here instead of ab.json.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
PYTHON = os.path.realpath(sys.executable)
JOBS = os.path.join(ROOT, "bench", "harness", "jobs")
WORK = {
    "demo": ([PYTHON, os.path.join(ROOT, "scripts", "demo_job.py"), "50000"], ["64M"]),
    "xgboost": ([PYTHON, os.path.join(JOBS, "xgb_job.py"), "800000", "40", "20"], ["592M", "296M"]),
    "pagerank": ([PYTHON, os.path.join(JOBS, "pagerank_job.py"), "2000000", "25000000", "8"], ["462M", "231M"]),
}


def result(stdout):
    """What the job's output says of its result: the demo job's checksum, the harness jobs'
    JSON line without its timings."""
    words = stdout.split()
    if "checksum" in words and not stdout.lstrip().startswith("{"):
        return words[words.index("checksum") + 1]
    j = json.loads(stdout.strip().splitlines()[-1])
    return {k: v for k, v in j.items() if not k.endswith("_s") and k != "peak_rss_bytes"}


def one(gleaner, job, local):
    with tempfile.TemporaryDirectory() as tmp:
        stats = os.path.join(tmp, "stats.json")
        cmd = [gleaner, "run", "-q", "--local-mem", local, "--stats", stats, "--"] + job
        t0 = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        wall = time.monotonic() - t0
        t = json.load(open(stats))["total"]
    f = t["faults"]
    return {"command": " ".join(cmd), "exit": p.returncode, "wall_s": round(wall, 3),
            "result": result(p.stdout), "zero_fill_faults": f["zero_fill"],
            "zero_filled_ahead": f["zero_filled_ahead"], "remote_faults": f["remote"],
            "evicted": t["evictions"]["dirty"] + t["evictions"]["clean"]}


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    builds = {"base": os.environ["BASE"], "new": os.environ["NEW"]}
    local = {w: result(subprocess.run(job, capture_output=True, text=True, check=True).stdout)
             for w, (job, _) in WORK.items()}
    runs = []
    for rep in range(reps):
        for w, (job, budgets) in WORK.items():
            for budget in budgets:
                for build, gleaner in builds.items():
                    r = one(gleaner, job, budget)
                    r.update(workload=w, budget=budget, build=build, rep=rep + 1,
                             result_ok=r["result"] == local[w])
                    runs.append(r)
                    print(f"{w:8} {budget:5} {build:4} rep {rep + 1}: {r['wall_s']:6.2f} s, "
                          f"result {'ok' if r['result_ok'] else 'WRONG'}, zero-fill faults "
                          f"{r['zero_fill_faults']} (+{r['zero_filled_ahead']} ahead), remote "
                          f"{r['remote_faults']}, evicted {r['evicted']}", flush=True)
    out = {"script": "bench/results/zero-ahead/ab.py", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "builds": builds, "all_local_results": local, "runs": runs}
    json.dump(out, open(os.path.join(HERE, os.environ.get("OUT", "ab.json")), "w"), indent=1)
    return 0 if all(r["result_ok"] and r["exit"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
