"""The quick-start demo job (`scripts/demo_job.py 50000` at `--local-mem 64M`) with freed big
blocks discarded at once (`--heap-retain 0`) and kept (the default), interleaved, writing
demo.json: wall time, checksum and the stats that say what happened to the freed blocks.

    GLEANER=/tmp/new-bin/gleaner python3 bench/results/heap-retain/demo.py [REPS]
"""

import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
GLEANER = os.environ.get("GLEANER", os.path.join(ROOT, "target", "release", "gleaner"))
PYTHON = os.path.realpath(sys.executable)
JOB = [PYTHON, os.path.join(ROOT, "scripts", "demo_job.py"), "50000"]


def checksum(stdout):
    """The hex digest after `checksum` in the job's output line."""
    words = stdout.split()
    return words[words.index("checksum") + 1] if "checksum" in words else None


def one(extra):
    with tempfile.TemporaryDirectory() as tmp:
        stats = os.path.join(tmp, "stats.json")
        cmd = [GLEANER, "run", "-q", "--local-mem", "64M", "--stats", stats] + extra + ["--"] + JOB
        t0 = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        wall = time.monotonic() - t0
        t = json.load(open(stats))["total"]
    return {"command": " ".join(cmd), "exit": p.returncode, "wall_s": round(wall, 3),
            "checksum": checksum(p.stdout),
            "discarded_pages": t["discarded_pages"], "reused_pages": t["reused_pages"],
            "released_by_allocator": t["reclaim"]["released_by_allocator"],
            "remote_faults": t["faults"]["remote"], "zero_fill_faults": t["faults"]["zero_fill"]}


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    local = checksum(subprocess.run(JOB, capture_output=True, text=True, check=True).stdout)
    runs = []
    for rep in range(reps):
        for name, extra in (("off", ["--heap-retain", "0"]), ("on", [])):
            r = one(extra)
            r.update(variant=name, rep=rep + 1, checksum_ok=r["checksum"] == local)
            runs.append(r)
            print(f"{name} rep {rep + 1}: {r['wall_s']} s, checksum {'ok' if r['checksum_ok'] else 'WRONG'}, "
                  f"reused {r['reused_pages']}, released by reclaim {r['released_by_allocator']}, "
                  f"remote {r['remote_faults']}", flush=True)
    out = {"script": "bench/results/heap-retain/demo.py", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "local_checksum": local, "runs": runs}
    json.dump(out, open(os.path.join(HERE, "demo.json"), "w"), indent=1)
    return 0 if all(r["checksum_ok"] and r["exit"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
