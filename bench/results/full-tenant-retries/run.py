#!/usr/bin/env python3
"""A tenant whose quota is used up, beside a batch job on the same capped memnode link.

The "full" tenant runs a Python program holding more than its local budget, with a memnode
quota (1 MiB) far below what it would evict: its write-backs are refused, and it keeps its
pages locally within its overflow allowance (it is not stopped: it never needs more than the
allowance). Beside it, the quick-start demo job (`scripts/demo_job.py 30000`, 16 MiB local) runs
as a second tenant with room to spare. Measured per gleaner build, reps interleaved: the demo
job's wall time alone and beside the full tenant, and how many write-back batches the memnode
refused the full tenant while the demo job ran (each crossed the emulated 32 MB/s link).

    python3 run.py OUT.json NAME=GLEANER_BINARY [NAME=GLEANER_BINARY ...]

Environment: REPS (default 3).
"""
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEMO = os.path.join(ROOT, "scripts", "demo_job.py")
HOG = ("import os, sys, time\n"
       "held = os.urandom(28 << 20)\n"
       "print('holding', flush=True)\n"
       "time.sleep(120)\n")


def memnode(gleaner, tmp):
    args = [gleaner, "memnode", "--listen", "127.0.0.1:0", "--capacity", "2G", "--token-file",
            os.path.join(tmp, "main.token"), "--bandwidth", "32M",
            "--tenant", f"full:{tmp}/full.token:1M:1", "--tenant", f"batch:{tmp}/batch.token:600M:1"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=open(os.path.join(tmp, "memnode.err"), "w"),
                         text=True)
    line = p.stdout.readline().strip()
    assert line.startswith("listening on "), line
    return p, line[len("listening on "):]


def run_cell(gleaner, with_full):
    with tempfile.TemporaryDirectory() as tmp:
        node, addr = memnode(gleaner, tmp)
        hog = None
        try:
            if with_full:
                hog = subprocess.Popen(
                    [gleaner, "run", "--local-mem", "32M", "--memnode", addr, "--token-file",
                     f"{tmp}/full.token", "--stats", f"{tmp}/full.json", "--", sys.executable, "-c", HOG],
                    stdout=subprocess.PIPE, stderr=open(f"{tmp}/full.err", "w"), text=True)
                assert hog.stdout.readline().strip() == "holding", open(f"{tmp}/full.err").read()
                time.sleep(2)
                assert hog.poll() is None, open(f"{tmp}/full.err").read()
            t0 = time.monotonic()
            out = subprocess.run(
                [gleaner, "run", "--local-mem", "16M", "--memnode", addr, "--token-file",
                 f"{tmp}/batch.token", "--stats", f"{tmp}/batch.json", "--", sys.executable, DEMO, "30000"],
                capture_output=True, text=True, timeout=300)
            wall = time.monotonic() - t0
            assert out.returncode == 0 and "checksum" in out.stdout, out.stderr[-2000:]
            cell = {"batch_wall_s": round(wall, 3), "batch_checksum": out.stdout.split()[1]}
            st = json.loads(subprocess.run(
                [gleaner, "memnode", "stats", "--addr", addr, "--token-file", f"{tmp}/main.token"],
                capture_output=True, text=True, check=True).stdout)
            # Writes the memnode refused (only the full tenant's are), and what each tenant's
            # write-backs took of the link, whether stored or refused.
            cell["writes_refused"] = st["totals"]["errors_full"]
            cell["writeback_bytes"] = {t["name"]: t["queue"]["classes"]["writeback"]["bytes"]
                                       for t in st["tenants"] if t.get("queue")}
            if hog:
                assert hog.poll() is None, open(f"{tmp}/full.err").read()
                err = open(f"{tmp}/full.err").read()
                assert "memnode full" in err, err[-2000:]
                hog.terminate()
                hog.wait(timeout=30)
            return cell
        finally:
            if hog and hog.poll() is None:
                hog.kill()
            node.kill()
            node.wait()


def main():
    out = sys.argv[1]
    builds = dict(a.split("=", 1) for a in sys.argv[2:])
    reps = int(os.environ.get("REPS", "3"))
    cells = []
    for rep in range(reps):
        for name, gleaner in builds.items():
            for with_full in (False, True):
                c = run_cell(gleaner, with_full)
                c.update(build=name, rep=rep, beside_full_tenant=with_full)
                print(json.dumps(c), flush=True)
                cells.append(c)
    summary = {}
    for name in builds:
        alone = sorted(c["batch_wall_s"] for c in cells if c["build"] == name and not c["beside_full_tenant"])
        beside = sorted(c["batch_wall_s"] for c in cells if c["build"] == name and c["beside_full_tenant"])
        summary[name] = {"alone_median_s": alone[len(alone) // 2], "beside_median_s": beside[len(beside) // 2],
                         "slowdown": round(beside[len(beside) // 2] / alone[len(alone) // 2], 3)}
    json.dump({"command": " ".join(["python3"] + sys.argv), "reps": reps, "builds": builds,
               "cells": cells, "summary": summary}, open(out, "w"), indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
