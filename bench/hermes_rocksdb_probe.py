#!/usr/bin/env python3
"""Where RocksDB's p99 and SLO violations come from beside the Hermes benchmark's batch job
(bench/hermes.py).

The same RocksDB program and loads as bench/hermes.py (bench/hermes/rocksdb_latency.c: 40000
puts of 1 KiB records, 600 of 200 KiB, every record read back), run interleaved REPS times:

  * alone:         glibc, no cgroup, nothing beside it (its pooled p90 per class is the SLO);
  * cpu:           glibc beside a CPU-only antagonist (one process spinning);
  * batch:         glibc in the cgroup beside bench/hermes.py's batch job at 100% pressure;
  * batch_reserve: the same under `gleaner run --latency-critical` (the reserve, no daemon);
  * batch_hermes:  the reserve and a node daemon reclaiming the batch job's page cache (eager).

Per run it keeps each class's p50/p99, its SLO violations, and RocksDB's own cumulative write
stall and flush lines ("rocksdb.stats"). If `cpu` violates as often as `batch`, the violations
are CPU contention; if `batch_reserve` does no better than `batch` but `batch_hermes` does, the
page cache is what matters, not allocation.
Prints one JSON object (medians over the runs) as its last line.
Usage: python3 bench/hermes_rocksdb_probe.py [--reps N] [--out FILE]   (root, for the cgroup)
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hermes  # noqa: E402
from hermes_redis_probe import spinner  # noqa: E402

CONDS = ["alone", "cpu", "batch", "batch_reserve", "batch_hermes"]


def stall_lines(path):
    """RocksDB's cumulative write stall (seconds, percent) and flush count from rocksdb.stats."""
    try:
        text = open(path).read()
    except OSError:
        return None
    out = {}
    m = re.search(r"Cumulative stall: (\d+):(\d+):([\d.]+) H:M:S, ([\d.]+) percent", text)
    if m:
        out["stall_s"] = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
        out["stall_percent"] = float(m.group(4))
    m = re.search(r"Flush\(GB\): cumulative ([\d.]+)", text)
    if m:
        out["flush_gb"] = float(m.group(1))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="gleaner-hermes-rocks-")
    rocks = hermes.rocksdb_binary(tmp)
    bigfile = hermes.big_file(tmp, 1024)
    cg = hermes.Cgroup(hermes.LIMIT)
    sock = os.path.join(tmp, "node.sock")
    glibc = hermes.allocators()["glibc"]
    reserve = hermes.allocators()["hermes"]
    stats = os.path.join(tmp, "rocksdb.stats")
    runs = {c: [] for c in CONDS}
    started = time.time()

    def one(cond, cgroup, name, alloc, batch_pid=None):
        prefix, env = alloc
        r = hermes.rocksdb_run(rocks, cgroup, name, prefix, {**env, "ROCKSDB_LATENCY_STATS": stats},
                               tmp, sock, batch_pid)
        r["rocksdb_stats"] = stall_lines(stats)
        runs[cond].append(r)

    try:
        for _ in range(args.reps):
            one("alone", None, "glibc", glibc)
            sp = spinner()
            try:
                one("cpu", None, "glibc", glibc)
            finally:
                hermes.stop(sp)
            ant, _ = hermes.batch_job(cg, bigfile)
            try:
                one("batch", cg, "glibc", glibc, ant.pid)
                one("batch_reserve", cg, "reserve", reserve, ant.pid)
                one("batch_hermes", cg, "hermes", reserve, ant.pid)
            finally:
                hermes.stop(ant)
            for cond, rs in runs.items():
                r = rs[-1]
                hermes.log(f"{cond}: " + ", ".join(f"{c} p99 {r[c]['p99_ns'] / 1000:.0f} us"
                                                   for c in hermes.ROCKS_CLASSES)
                           + f"; {r['rocksdb_stats']}")
    finally:
        cg.remove()
        shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median
    slo = {}
    for c in hermes.ROCKS_CLASSES:
        pooled = sorted(v for r in runs["alone"] for v in r["samples"][c])
        slo[c] = pooled[int((len(pooled) - 1) * 0.9)]
    summary = {"slo_us": {c: round(v / 1000, 1) for c, v in slo.items()}}
    for cond, rs in runs.items():
        for r in rs:
            r["slo_violations"] = {c: sum(1 for v in r["samples"][c] if v > slo[c])
                                   for c in hermes.ROCKS_CLASSES}
            r.pop("samples")
        for c in hermes.ROCKS_CLASSES:
            summary[f"{cond}_{c}_p50_us"] = round(med(r[c]["p50_ns"] for r in rs) / 1000, 1)
            summary[f"{cond}_{c}_p99_us"] = round(med(r[c]["p99_ns"] for r in rs) / 1000, 1)
            summary[f"{cond}_{c}_violations"] = med(r["slo_violations"][c] for r in rs)
        summary[f"{cond}_violations"] = med(sum(r["slo_violations"].values()) for r in rs)
        stalls = [r["rocksdb_stats"].get("stall_s") for r in rs
                  if r.get("rocksdb_stats") and "stall_s" in r["rocksdb_stats"]]
        summary[f"{cond}_write_stall_s"] = med(stalls) if stalls else None
    result = {"date": time.strftime("%Y-%m-%d", time.gmtime()),
              "command": "python3 bench/hermes_rocksdb_probe.py"
              + (f" --reps {args.reps}" if args.reps != 3 else "")
              + (f" --out {args.out}" if args.out else ""),
              "seconds": round(time.time() - started, 1), "runs": runs, "summary": summary}
    hermes.write_result(result, args.out)


if __name__ == "__main__":
    main()
