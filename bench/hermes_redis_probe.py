#!/usr/bin/env python3
"""Where redis's p99 comes from beside the Hermes benchmark's batch job (bench/hermes.py).

The question: is the p99 of redis's SETs beside the batch job set by allocation (page faults and
the cgroup's reclaim, which the reserve and the daemon address) or by CPU contention (redis,
redis-benchmark and the batch job sharing the VM's 2 vCPUs, which neither addresses)? The same
redis-benchmark loads as bench/hermes.py (1 KiB SET/GET, 200 KiB SET/GET, 4 clients), redis as
packaged unless named, each condition run interleaved REPS times:

  * alone:    redis in the 1 GiB cgroup, nothing beside it;
  * cpu:      beside a CPU-only antagonist (one process spinning: the batch job's CPU, none of
              its memory or file pressure);
  * batch:    beside bench/hermes.py's batch job at 100% pressure (600 MiB held, 32 MiB churned
              every 16 MiB read, a file re-read: the cgroup at its limit);
  * batch_reserve: the same with `gleaner run --latency-critical` (the reserve, no daemon).

If `cpu` is as slow as `batch` at the p99, the p99 is CPU contention, not allocation.
`--n-200k N` sends N 200 KiB SETs and GETs per run instead of 500 (with 500 the p99 is the fifth
slowest request), `--loads 200k` runs only those, and `--conditions` picks the conditions (e.g.
`batch,batch_reserve` with a `--reserve-env GLEANER_PRELOAD=OLD.so` to set one build of the
preload library against another in the same window).
Prints one JSON object (medians over the runs, ms) as its last line.
Usage: python3 bench/hermes_redis_probe.py [--reps N] [--n-200k N] [--loads 1k,200k]
       [--conditions alone,cpu,batch,batch_reserve] [--reserve-env K=V] [--out FILE]   (root)
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hermes  # noqa: E402

OPS = ["set_1k", "get_1k", "set_200k", "get_200k"]


def spinner():
    """One process spinning on a CPU (the batch job's CPU without its memory)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out")
    ap.add_argument("--reserve-env", action="append", default=[], metavar="K=V",
                    help="also run batch_reserve with this variable set (condition "
                         "batch_reserve_K=V, right after batch_reserve), e.g. "
                         "GLEANER_RESERVE_PRIORITY=normal")
    ap.add_argument("--n-200k", type=int, default=500, metavar="N",
                    help="200 KiB requests per run (each of SET and GET; default 500)")
    ap.add_argument("--loads", default="1k,200k", help="which loads: 1k, 200k or both")
    ap.add_argument("--conditions", default="alone,cpu,batch,batch_reserve",
                    help="which conditions to run (the --reserve-env ones run with batch_reserve)")
    args = ap.parse_args()
    loads = set(args.loads.split(","))
    hermes.REDIS_LOADS = [(size, list(load))
                          for size, load in hermes.REDIS_LOADS if size in loads]
    for size, load in hermes.REDIS_LOADS:
        if size == "200k":
            load[load.index("-n") + 1] = str(args.n_200k)
    conds = set(args.conditions.split(","))
    if not (shutil.which("redis-server") and shutil.which("redis-benchmark")):
        raise SystemExit("!!! redis is ABSENT (scripts/setup.sh installs it): nothing measured")
    tmp = tempfile.mkdtemp(prefix="gleaner-hermes-probe-")
    bigfile = hermes.big_file(tmp, 1024)
    cg = hermes.Cgroup(hermes.LIMIT)
    sock = os.path.join(tmp, "node.sock")
    extra = [e for e in args.reserve_env if "=" in e]
    runs = {c: [] for c in ["alone", "cpu", "batch", "batch_reserve"] if c in conds}
    if "batch_reserve" in conds:
        runs.update({f"batch_reserve_{e}": [] for e in extra})
    started = time.time()
    try:
        for _ in range(args.reps):
            if "alone" in runs:
                runs["alone"].append(hermes.redis_run(cg, "default", tmp, sock))
            if "cpu" in runs:
                sp = spinner()
                try:
                    runs["cpu"].append(hermes.redis_run(cg, "default", tmp, sock))
                finally:
                    hermes.stop(sp)
            ant, _ = hermes.batch_job(cg, bigfile)
            try:
                if "batch" in runs:
                    runs["batch"].append(hermes.redis_run(cg, "default", tmp, sock, ant.pid))
                if "batch_reserve" in runs:
                    runs["batch_reserve"].append(hermes.redis_run(cg, "reserve", tmp, sock, ant.pid))
                for e in (extra if "batch_reserve" in runs else []):
                    k, v = e.split("=", 1)
                    old = os.environ.get(k)
                    os.environ[k] = v
                    try:
                        runs[f"batch_reserve_{e}"].append(
                            hermes.redis_run(cg, "reserve", tmp, sock, ant.pid))
                    finally:
                        if old is None:
                            del os.environ[k]
                        else:
                            os.environ[k] = old
            finally:
                hermes.stop(ant)
            for cond, rs in runs.items():
                r = rs[-1]
                hermes.log(f"{cond}: " + ", ".join(f"{op} p50 {r[op]['p50_ms']} p99 {r[op]['p99_ms']}"
                                                   for op in OPS if op in r))
    finally:
        cg.remove()
        shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median
    ops = [op for op in OPS if any(op in r for rs in runs.values() for r in rs)]
    summary = {f"{cond}_{op}_{q}_ms": med(r[op][f"{q}_ms"] for r in rs)
               for cond, rs in runs.items() if rs for op in ops for q in ("p50", "p99")}
    for r in (r for rs in runs.values() for r in rs):
        for op in ops:
            r[op].pop("points", None)
    result = {"date": time.strftime("%Y-%m-%d", time.gmtime()),
              "command": "python3 bench/hermes_redis_probe.py"
              + (f" --reps {args.reps}" if args.reps != 3 else "")
              + (f" --n-200k {args.n_200k}" if args.n_200k != 500 else "")
              + (f" --loads {args.loads}" if args.loads != "1k,200k" else "")
              + (f" --conditions {args.conditions}"
                 if args.conditions != "alone,cpu,batch,batch_reserve" else "")
              + "".join(f" --reserve-env {e}" for e in extra)
              + (f" --out {args.out}" if args.out else ""),
              "seconds": round(time.time() - started, 1), "runs": runs, "summary": summary}
    hermes.write_result(result, args.out)


if __name__ == "__main__":
    main()
