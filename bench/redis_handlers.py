#!/usr/bin/env python3
"""redis at 50% local memory under gleaner with different fault-handler settings, same run.

    python3 bench/redis_handlers.py [--reps 2] [--out bench/results/redis-handlers.json]

Each cell starts `gleaner run --local-mem 207M` (the harness's 50% budget for redis, full size)
around `redis-server` with the handler settings of its configuration (environment variables the
preload library reads), preloads 300,000 keys of 1 KiB with the harness's values, then runs
`redis-benchmark -t get -n 200000 -r 300000 -d 1024 -c 50` and records its GET throughput and
p50, and gleaner's stats (remote faults, handler wake-ups). Configurations run interleaved, in
rotated order per repetition: the default (one handler per CPU, blocking, no spin) is the
same-run baseline the others are compared with, as ratios.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from bench.harness.common import free_port, git_commit, machine, now_iso, wait_port  # noqa: E402
from bench.harness.workloads import Redis, _RedisValues  # noqa: E402

GLEANER = os.path.join(ROOT, "target", "release", "gleaner")
CONFIGS = {
    "default": {},
    "spin-50us": {"GLEANER_HANDLER_SPIN_US": "50"},
    "spin-200us": {"GLEANER_HANDLER_SPIN_US": "200"},
    "one-handler": {"GLEANER_HANDLERS": "1"},
}
KEYS, VSIZE, REQUESTS, CLIENTS, BUDGET = 300_000, 1024, 200_000, 50, "207M"


def log(msg):
    print(f"[redis-handlers] {msg}", file=sys.stderr, flush=True)


def cell(name, env_extra, tmp):
    port = free_port()
    stats = os.path.join(tmp, f"{name}-stats.json")
    server = [GLEANER, "run", "-q", "--local-mem", BUDGET, "--stats", stats, "--",
              shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind",
              "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp]
    env = dict(os.environ, **env_extra)
    proc = subprocess.Popen(server, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    rec = {"config": name, "env": env_extra, "command": " ".join(server), "ok": False}
    try:
        if not wait_port(port, proc):
            rec["error"] = "redis did not listen within 30 s (or gleaner run exited)"
            return rec
        err = Redis._preload(Redis.__new__(Redis), str(port), _RedisValues(VSIZE), KEYS)
        if err:
            rec["error"] = f"preload: {err}"
            return rec
        bench = [shutil.which("redis-benchmark") or "redis-benchmark", "-h", "127.0.0.1", "-p",
                 str(port), "-t", "get", "-n", str(REQUESTS), "-r", str(KEYS), "-d", str(VSIZE),
                 "-c", str(CLIENTS), "-q"]
        rec["bench_command"] = " ".join(bench)
        out = subprocess.run(bench, capture_output=True, text=True, timeout=600).stdout
        m = re.findall(r"GET: ([\d.]+) requests per second, p50=([\d.]+) msec", out)
        if not m:
            rec["error"] = f"no GET line from redis-benchmark: {out[-300:]!r}"
            return rec
        rec["get_rps"], rec["p50_ms"] = float(m[-1][0]), float(m[-1][1])
        rec["ok"] = True
    finally:
        subprocess.run([shutil.which("redis-cli") or "redis-cli", "-p", str(port), "shutdown",
                        "nosave"], capture_output=True, timeout=30)
        try:
            _, stderr = proc.communicate(timeout=60)
            rec["stderr_tail"] = stderr.decode(errors="replace")[-500:]
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        if os.path.exists(stats):
            with open(stats) as f:
                total = json.load(f).get("total", {})
            rec["remote_faults"] = total.get("faults", {}).get("remote")
            fb = total.get("fault_breakdown", {})
            rec["handler_wakeups"] = fb.get("handler_wakeups")
            rec["handler_empty_wakeups"] = fb.get("handler_empty_wakeups")
    return rec


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "redis-handlers.json"))
    args = ap.parse_args(argv)
    res = {"script": "bench/redis_handlers.py", "date": now_iso(), "git_commit": git_commit(),
           "machine": machine(), "reps": args.reps, "configs": CONFIGS, "cells": []}
    names = list(CONFIGS)
    with tempfile.TemporaryDirectory(prefix="gleaner-redis-handlers-") as tmp:
        for rep in range(args.reps):
            order = names[rep % len(names):] + names[:rep % len(names)]
            for name in order:
                rec = cell(name, CONFIGS[name], tmp)
                rec["rep"] = rep
                log(f"rep {rep + 1} {name}: {rec.get('get_rps')} GET/s "
                    f"{'ok' if rec['ok'] else rec.get('error')}")
                res["cells"].append(rec)
    base = [c["get_rps"] for c in res["cells"] if c["config"] == "default" and c["ok"]]
    res["summary"] = {}
    for name in names:
        v = [c["get_rps"] for c in res["cells"] if c["config"] == name and c["ok"]]
        res["summary"][name] = {"get_rps": v, "vs_default": (sum(v) / len(v)) / (sum(base) / len(base))
                                if v and base else None}
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    log(f"wrote {args.out}")
    print(json.dumps(res["summary"], indent=1))
    return 0 if all(c["ok"] for c in res["cells"]) else 1


if __name__ == "__main__":
    sys.exit(main())
