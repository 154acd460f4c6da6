#!/usr/bin/env python3
"""Programs as a new user would run them, under `gleaner run` and under Linux swap on zram at the
same limit, in the same run: wall time and far faults (gleaner's remote faults; the cgroup's
major faults).

    sudo python3 bench/programs_vs_swap.py [--reps 3] [--jobs sqlite,node,jvm,demo] [--out FILE]

For each job the all-local run comes first and gives the footprint (its peak RSS); the limit is
half of it (`--local-pct`), the same number for `gleaner run --local-mem` and for the memory
cgroup (which also charges the interpreter, libraries and page cache, so Linux has less room
for the heap). Then `--reps` rounds, gleaner and Linux swap alternating (order rotated), every
checksum compared with all-local's. Jobs (each prints `checksum HEX over N objects in S s`):

* sqlite: bench/jobs/sqlite_job.py 400000 (`:memory:`, 400k rows, an index, a group-by);
* node:   bench/jobs/node_job.js 1500000 (a Map of 1.5M small objects; `--max-old-space-size`
          2048 under every system: V8 otherwise takes its heap limit from Linux's cgroup);
* jvm:    bench/java/FarHeap.java (compiled with javac into a temporary directory; a HashMap of
          300k 1 KiB byte arrays, two GCs, a checksum pass; bench/codec.py's JVM options);
* demo:   scripts/demo_job.py 50000 (the quick start's job).

Far faults are reported per job run and per 1,000 of the job's objects (`far_faults_per_1k`), so
the jobs compare with the servers' faults per 1,000 requests.

Every job is pinned to CPU 0 with taskset under every system. Writes the JSON results (every
command, raw counters) to --out. Needs root (zram, cgroups).
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from bench.harness import swapenv  # noqa: E402
from bench.harness.common import git_commit, machine, now_iso, python_exe  # noqa: E402
from bench.codec import JAVA_N, compile_java, java_job  # noqa: E402
from bench.vs_swap import _write, demo_cell  # noqa: E402

JOBS = {
    "sqlite": lambda: [python_exe(), os.path.join(ROOT, "bench", "jobs", "sqlite_job.py"), "400000"],
    # V8 sizes its heap limit from the memory cgroup's limit: in Linux swap's cgroup node gave
    # up at it ("JavaScript heap out of memory") with swap free. The same explicit limit under
    # every system, above what the job needs, makes it the memory system that is compared.
    "node": lambda: [shutil.which("node") or "node", f"--max-old-space-size={NODE_HEAP_MB}",
                     os.path.join(ROOT, "bench", "jobs", "node_job.js"), "1500000"],
    "demo": lambda: [python_exe(), os.path.join(ROOT, "scripts", "demo_job.py"), "50000"],
}
# The V8 heap limit given to node under every system (MiB; see JOBS).
NODE_HEAP_MB = 2048
# Objects each job makes, for faults per 1,000 objects.
OBJECTS = {"sqlite": 400_000, "node": 1_500_000, "jvm": JAVA_N, "demo": 50_000}
# Where the JVM job's classes are (compiled once, in main).
JAVA = {}


def job_command(job):
    """The job's command, pinned to CPU 0."""
    if job == "jvm":
        # java_job pins it itself.
        return java_job(JAVA["java"], JAVA["classes"])
    return ["taskset", "-c", "0"] + JOBS[job]()


def cell(ctx, job, system, rep, local_mem, limit):
    tmp = tempfile.mkdtemp(prefix=f"pvs-{job}-")
    try:
        cmd = job_command(job)
        rec = demo_cell(ctx, system, rep, tmp, job=cmd, local_mem=local_mem, cgroup_limit=limit,
                        kind=job)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if system == "gleaner":
        rec["far_faults"] = (rec.get("gleaner") or {}).get("remote_faults")
    elif system == "linux-swap":
        rec["far_faults"] = (((rec.get("swap") or {}).get("cgroup")) or {}).get("pgmajfault")
    if rec.get("far_faults") is not None:
        rec["far_faults_per_1k"] = round(rec["far_faults"] * 1000 / OBJECTS[job], 2)
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", default="sqlite,node,jvm,demo")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--local-pct", type=int, default=50)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "programs-vs-swap.json"))
    args = ap.parse_args()
    ctx = {"state": swapenv.State(), "timeout": 600}
    res = {"date": now_iso(), "git_commit": git_commit(), "machine": machine(),
           "params": vars(args), "jobs": {}}
    ok = True
    jobs = args.jobs.split(",")
    unknown = [j for j in jobs if j not in JOBS and j != "jvm"]
    if unknown:
        ap.error(f"unknown job(s) {', '.join(unknown)}: choose from sqlite, node, jvm, demo")
    java_tmp = tempfile.mkdtemp(prefix="pvs-java-")
    if "jvm" in jobs:
        classes, rec, err = compile_java(java_tmp)
        res["java_build"] = rec
        if err:
            print(f"jvm: {err}", file=sys.stderr)
            res["jobs"]["jvm"] = {"error": err}
            jobs.remove("jvm")
            ok = False
        JAVA.update(java=rec.get("java"), classes=classes)
    for job in jobs:
        base = cell(ctx, job, "all-local", 0, "0", None)
        peak = (base.get("usage") or {}).get("maxrss_bytes") or (base.get("usage") or {}).get("maxrss_tree_bytes")
        if not base.get("ok") or not peak:
            print(f"{job}: all-local failed: {base.get('error')}", file=sys.stderr)
            res["jobs"][job] = {"all_local": base, "error": "all-local failed"}
            ok = False
            continue
        limit = max(16 << 20, (peak * args.local_pct // 100) >> 20 << 20)
        local_mem = f"{limit >> 20}M"
        out = {"all_local": base, "limit_bytes": limit, "local_mem": local_mem,
               "gleaner": [], "linux-swap": []}
        for rep in range(args.reps):
            order = ["gleaner", "linux-swap"] if rep % 2 == 0 else ["linux-swap", "gleaner"]
            for system in order:
                rec = cell(ctx, job, system, rep, local_mem, limit)
                if rec.get("checksum") != base.get("checksum"):
                    rec["ok"] = False
                    rec["error"] = rec.get("error") or "checksum differs from all-local's"
                ok &= bool(rec.get("ok"))
                out[system].append(rec)
                print(f"{job} rep {rep + 1} {system}: wall {rec.get('wall_s')} s, far faults "
                      f"{rec.get('far_faults')}, ok {rec.get('ok')} {rec.get('error') or ''}",
                      file=sys.stderr)
        walls = {s: [r["wall_s"] for r in out[s] if r.get("ok")] for s in ("gleaner", "linux-swap")}
        faults = {s: [r["far_faults"] for r in out[s] if r.get("ok") and r.get("far_faults") is not None]
                  for s in ("gleaner", "linux-swap")}
        if all(walls.values()):
            out["median_wall_s"] = {s: statistics.median(v) for s, v in walls.items()}
            out["wall_ratio_gleaner_to_linux"] = round(
                out["median_wall_s"]["gleaner"] / out["median_wall_s"]["linux-swap"], 3)
        if all(faults.values()):
            out["median_far_faults"] = {s: statistics.median(v) for s, v in faults.items()}
            out["far_faults_ratio_gleaner_to_linux"] = round(
                out["median_far_faults"]["gleaner"] / max(out["median_far_faults"]["linux-swap"], 1), 3)
        res["jobs"][job] = out
        _write(res, args.out)
        print(f"{job}: limit {local_mem}, median wall {out.get('median_wall_s')}, ratio "
              f"{out.get('wall_ratio_gleaner_to_linux')}, far faults {out.get('median_far_faults')}",
              file=sys.stderr)
    shutil.rmtree(java_tmp, ignore_errors=True)
    res["complete"] = True
    _write(res, args.out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
