#!/usr/bin/env python3
"""Hermes (Middleware'21) benchmark: malloc + first touch latency, and redis beside a batch job.

1. malloc + first touch: bench/hermes/alloc_latency.c allocates 1 KiB blocks (64 MiB in all,
   2 us of busy work between requests) and 256 KiB blocks (256 MiB, 100 us between), touching
   one byte per page, under glibc, jemalloc, tcmalloc (as Debian packages them, by LD_PRELOAD)
   and gleaner's reserve (`gleaner run --far off --latency-critical`, over glibc), each:
     * alone;
     * under pressure ("anon"): in a memory cgroup (v1 or v2) of 1 GiB beside an antagonist that
       holds 700 MiB of anonymous memory and re-reads a 2 GiB file, so the cgroup sits at its limit
       and every first touch beyond it meets the cgroup's direct reclaim. (This VM has no swap: the
       reclaim takes the antagonist's page cache, which is what a first touch pays for here.)
   Each cell is run REPS times; the median of the runs' means and p99s is reported.
2. redis beside a batch job: redis-server (Debian's, on its own jemalloc) in the same kind of
   cgroup as the antagonist, redis-benchmark SET/GET of 1 KiB values; baseline: redis alone with
   the antagonist; hermes: redis under `gleaner run --far off --latency-critical`, the antagonist
   under `gleaner run --far off --batch`, and a node daemon watching the cgroup.

The last line printed is one JSON object (fractions: 1 - hermes / glibc, same run).
Usage: python3 bench/hermes.py --quick [--out FILE]   (needs root for the cgroup)
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLEANER = os.path.join(ROOT, "target", "release", "gleaner")
LIBDIR = "/usr/lib/x86_64-linux-gnu"
LIMIT = 1 << 30


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def tcmalloc():
    path = os.path.join(LIBDIR, "libtcmalloc.so.4")
    if not os.path.exists(path):
        log("tcmalloc missing: installing libgoogle-perftools4 with apt-get")
        subprocess.run(["apt-get", "install", "-y", "-qq", "libgoogle-perftools4"],
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    if not os.path.exists(path):
        log("!!! tcmalloc is ABSENT (libgoogle-perftools4 could not be installed): its rows are missing")
        return None
    return path


def allocators():
    out = {"glibc": ([], {})}
    je = os.path.join(LIBDIR, "libjemalloc.so.2")
    if os.path.exists(je):
        out["jemalloc"] = ([], {"LD_PRELOAD": je})
    else:
        log("!!! jemalloc is ABSENT (libjemalloc2): its rows are missing")
    tc = tcmalloc()
    if tc:
        out["tcmalloc"] = ([], {"LD_PRELOAD": tc})
    out["hermes"] = ([GLEANER, "run", "--far", "off", "--latency-critical", "-q", "--"], {})
    return out


class Cgroup:
    """A memory cgroup of `limit` bytes (v2 or v1)."""

    def __init__(self, limit):
        v2 = "/sys/fs/cgroup"
        v1 = "/sys/fs/cgroup/memory"
        if os.path.exists(os.path.join(v2, "cgroup.controllers")):
            base, knob = v2, "memory.max"
        elif os.path.exists(os.path.join(v1, "memory.limit_in_bytes")):
            base, knob = v1, "memory.limit_in_bytes"
        else:
            raise SystemExit("no memory cgroup: the pressure runs cannot be made")
        self.path = os.path.join(base, f"gleaner-hermes-{os.getpid()}")
        os.mkdir(self.path)
        with open(os.path.join(self.path, knob), "w") as f:
            f.write(str(limit))

    def wrap(self, cmd):
        procs = os.path.join(self.path, "cgroup.procs")
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh"] + cmd

    def remove(self):
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)


def antagonist(cg, bigfile, prefix=()):
    """700 MiB of anonymous memory held, and a 2 GiB file re-read, inside the cgroup."""
    code = ("import sys,time\nb=bytearray(700<<20)\nfor i in range(0,len(b),4096): b[i]=1\n"
            "print('ready',flush=True)\nwhile True:\n  f=open(sys.argv[1],'rb')\n"
            "  while f.read(1<<20): pass\n  f.close()\n")
    p = subprocess.Popen(cg.wrap(list(prefix) + [sys.executable, "-c", code, bigfile]),
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    assert p.stdout.readline().strip() == b"ready", "antagonist did not start"
    time.sleep(2)  # the file cache fills the rest of the cgroup
    return p


def stop(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def alloc_run(binary, prefix, env, size, total, think, cg=None):
    cmd = list(prefix) + [binary, str(size), str(total), str(think)]
    if cg:
        cmd = cg.wrap(cmd)
    out = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd}: {out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def micro(binary, allocs, reps, cg, bigfile):
    cells = {}
    sizes = [(1024, 64 << 20, 2), (256 * 1024, 256 << 20, 100)]
    for scenario in ["alone", "anon"]:
        ant = antagonist(cg, bigfile) if scenario == "anon" else None
        try:
            for size, total, think in sizes:
                for name, (prefix, env) in allocs.items():
                    runs = [alloc_run(binary, prefix, env, size, total, think,
                                      cg if scenario == "anon" else None) for _ in range(reps)]
                    cell = {
                        "mean_ns": statistics.median(r["mean_ns"] for r in runs),
                        "p99_ns": statistics.median(r["p99_ns"] for r in runs),
                        "runs": runs,
                    }
                    key = f"{'1k' if size == 1024 else '256k'}_{scenario}_{name}"
                    cells[key] = cell
                    log(f"{key}: mean {cell['mean_ns'] / 1000:.1f} us, p99 {cell['p99_ns'] / 1000:.1f} us")
        finally:
            if ant:
                stop(ant)
    return cells


def redis_p99(cg, bigfile, mode, tmp):
    """redis beside the batch job: `default` (redis as packaged), `reserve` (the reserve only) or
    `hermes` (the reserve, the batch job marked, the node daemon watching the cgroup)."""
    hermes = mode == "hermes"
    port = 16379 + (os.getpid() % 1000)
    sock = os.path.join(tmp, "node.sock")
    env = {**os.environ, "GLEANER_NODE_SOCKET": sock}
    daemon = None
    if hermes:
        daemon = subprocess.Popen([GLEANER, "node", "--socket", sock, "--cgroup", cg.path,
                                   "--reserve", "256M"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                  start_new_session=True)
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
    prefix = [GLEANER, "run", "--far", "off", "--batch", "-q", "--"] if hermes else []
    os.environ["GLEANER_NODE_SOCKET"] = sock
    ant = antagonist(cg, bigfile, prefix)
    rprefix = [GLEANER, "run", "--far", "off", "--latency-critical", "-q", "--"] if mode != "default" else []
    server = subprocess.Popen(cg.wrap(rprefix + ["redis-server", "--port", str(port), "--save", "",
                                                 "--appendonly", "no", "--protected-mode", "no"]),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                              start_new_session=True)
    try:
        for _ in range(100):
            if subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).returncode == 0:
                break
            time.sleep(0.05)
        out = subprocess.run(["redis-benchmark", "-p", str(port), "-t", "set,get", "-d", "1024",
                              "-n", "100000", "-r", "200000", "-c", "4", "--csv"],
                             capture_output=True, text=True, timeout=300).stdout
        rows = {}
        lines = out.strip().splitlines()
        head = [h.strip('"') for h in lines[0].split(",")]
        for line in lines[1:]:
            vals = [v.strip('"') for v in line.split(",")]
            rows[vals[0]] = dict(zip(head, vals))
        drops = None
        if hermes:
            st = subprocess.run([GLEANER, "node", "status", "--socket", sock], capture_output=True,
                                text=True).stdout
            try:
                drops = json.loads(st)["batch"]
            except (ValueError, KeyError):
                drops = st[:500]
        return {"set_p99_ms": float(rows["SET"]["p99_latency_ms"]),
                "get_p99_ms": float(rows["GET"]["p99_latency_ms"]),
                "set_avg_ms": float(rows["SET"]["avg_latency_ms"]), "daemon": drops}
    finally:
        stop(server)
        stop(ant)
        if daemon:
            stop(daemon)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="3 runs per cell (the only mode)")
    ap.add_argument("--out", help="write the results JSON here too")
    args = ap.parse_args()
    reps = 3
    tmp = tempfile.mkdtemp(prefix="gleaner-hermes-bench-")
    binary = os.path.join(tmp, "alloc_latency")
    subprocess.run(["cc", "-O2", "-o", binary, os.path.join(ROOT, "bench/hermes/alloc_latency.c")], check=True)
    bigfile = os.path.join(tmp, "big.dat")
    with open(bigfile, "wb") as f:
        chunk = os.urandom(1 << 20)
        for _ in range(2048):
            f.write(chunk)
    cg = Cgroup(LIMIT)
    started = time.time()
    try:
        cells = micro(binary, allocators(), reps, cg, bigfile)
        redis = {}
        if shutil.which("redis-server") and shutil.which("redis-benchmark"):
            for _ in range(5):  # interleaved, so a neighbour's burst on this shared VM hits all
                for mode in ["default", "reserve", "hermes"]:
                    redis.setdefault(mode, []).append(redis_p99(cg, bigfile, mode, tmp))
            log(f"redis: {redis}")
        else:
            log("!!! redis is ABSENT: redis_p99_reduction is missing")
    finally:
        cg.remove()
        shutil.rmtree(tmp, ignore_errors=True)

    def red(key, metric, base="glibc"):
        b, h = cells[f"{key}_{base}"][metric], cells[f"{key}_hermes"][metric]
        return round(1 - h / b, 4)

    result = {"quick": True, "seconds": round(time.time() - started, 1), "cells": cells, "redis": redis}
    summary = {}
    for key in ["1k_alone", "1k_anon", "256k_alone", "256k_anon"]:
        summary[f"p99_reduction_{key}"] = red(key, "p99_ns")
        summary[f"mean_reduction_{key}"] = red(key, "mean_ns")
        for other in ["jemalloc", "tcmalloc"]:
            if f"{key}_{other}" in cells:
                summary[f"p99_reduction_{key}_vs_{other}"] = red(key, "p99_ns", other)
    if redis:
        b = statistics.median(r["set_p99_ms"] for r in redis["default"])
        h = statistics.median(r["set_p99_ms"] for r in redis["hermes"])
        summary["redis_set_p99_ms_default"] = b
        summary["redis_set_p99_ms_hermes"] = h
        summary["redis_p99_reduction"] = round(1 - h / b, 4)
        r = statistics.median(x["set_p99_ms"] for x in redis["reserve"])
        summary["redis_set_p99_ms_reserve_only"] = r
        summary["redis_p99_reduction_reserve_only"] = round(1 - r / b, 4)
        summary["redis_daemon_scan_seconds"] = [x["daemon"].get("scan_seconds") for x in redis["hermes"]
                                                if isinstance(x["daemon"], dict)]
    result["summary"] = summary
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
