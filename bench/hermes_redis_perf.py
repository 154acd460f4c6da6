#!/usr/bin/env python3
"""Where redis-server's CPU goes in the 200 KiB phase beside the Hermes batch job, as packaged
and under the reserve (a diagnostic, not a latency benchmark).

For each rep: the batch job of bench/hermes.py (100% pressure) in the 1 GiB cgroup, then for each
configuration a redis-server in the cgroup (as packaged, or `gleaner run --far off
--latency-critical`), `redis-benchmark -c 4 -d 204800 -n N -r 250 -t set,get`, and over that phase
either `perf stat` of the server (page faults, task-clock of all its threads: the reserve's
thread included) or `perf record` of it, summarised as the samples of the server's main thread
(`comm` redis-server: the reserve's thread is `gleaner-reserve`) in its copies: the kernel's socket
copies (`_copy_to_iter`: received data into the query buffer; `_copy_from_iter`: the reply into
the socket) and user space's `memmove`.

A configuration is `default`, `preload` (gleaner's preload library by `LD_PRELOAD` with neither
far memory nor the reserve: its interposition alone, every request forwarded to jemalloc),
`reserve`, or `reserve:K=V` (the reserve with a variable set, e.g.
`reserve:GLEANER_PRELOAD=OLD.so`); `@CPUS` after any of them pins the server (and under the reserve
its thread) to those CPUs (`taskset -c`). Prints one line per run and, last, one JSON object (per
configuration: each run's numbers, and the medians).
Usage: python3 bench/hermes_redis_perf.py [--configs default,reserve] [--reps 3] [--n 2000]
       [--mode stat|record] [--out FILE]   (root; perf)
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

COPIES = ["_copy_to_iter", "_copy_from_iter", "__memmove_avx_unaligned_erms"]


def server(cg, config, port):
    """redis-server in `cg` under `config`; returns (process, the server's pid)."""
    cmd = ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
           "--protected-mode", "no"]
    env = dict(os.environ)
    config, _, cpu = config.partition("@")
    if config == "preload":
        env["LD_PRELOAD"] = os.path.join(os.path.dirname(hermes.GLEANER), "libgleaner_preload.so")
        env.pop("GLEANER_LATENCY_CRITICAL", None)
        env.pop("GLEANER_LOCAL_MEM", None)
    elif config != "default":
        cmd = [hermes.GLEANER, "run", "--far", "off", "--latency-critical", "-q", "--"] + cmd
        if ":" in config:
            k, v = config.split(":", 1)[1].split("=", 1)
            env[k] = v
    if cpu:
        cmd = ["taskset", "-c", cpu] + cmd
    p = subprocess.Popen(cg.wrap(cmd), env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    for _ in range(200):
        if subprocess.run(["redis-cli", "-p", str(port), "ping"],
                          capture_output=True).returncode == 0:
            break
        time.sleep(0.05)
    pid = int(subprocess.run(["pgrep", "-nx", "redis-server"], capture_output=True,
                             text=True).stdout.split()[0])
    return p, pid


def record_summary(data):
    """The main thread's samples: all, and in each copy function."""
    def report(*args):
        return subprocess.run(["perf", "report", "-i", data, "--no-children", "-n", "--stdio",
                               "-g", "none"] + list(args), capture_output=True, text=True).stdout
    out = {"samples": 0}
    for line in report("--sort", "comm").splitlines():
        f = line.split()
        if len(f) >= 3 and not line.startswith("#") and f[2] == "redis-server":
            out["samples"] = int(f[1])
    for line in report("--comm", "redis-server", "--sort", "sym").splitlines():
        f = line.split()
        if len(f) >= 4 and not line.startswith("#") and f[-1] in COPIES:
            out[f[-1]] = int(f[1])
    return out


def stat_summary(text):
    """page-faults and task-clock (ms) from `perf stat -x,`."""
    out = {}
    for line in text.splitlines():
        f = line.split(",")
        if len(f) > 2 and f[2] in ("page-faults", "task-clock") and f[0][:1].isdigit():
            out[f[2]] = float(f[0])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="default,reserve")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--mode", choices=["stat", "record"], default="record")
    ap.add_argument("--out")
    args = ap.parse_args()
    configs = args.configs.split(",")
    tmp = tempfile.mkdtemp(prefix="gleaner-hermes-perf-")
    bigfile = hermes.big_file(tmp, 1024)
    cg = hermes.Cgroup(hermes.LIMIT)
    port = 17379 + (os.getpid() % 1000)
    runs = {c: [] for c in configs}
    started = time.time()
    try:
        for rep in range(args.reps):
            ant, _ = hermes.batch_job(cg, bigfile)
            try:
                for c in configs:
                    srv, pid = server(cg, c, port)
                    try:
                        data = os.path.join(tmp, "perf.data")
                        perf = (["perf", "record", "-g", "-o", data, "-p", str(pid)]
                                if args.mode == "record" else
                                ["perf", "stat", "-x,", "-e", "page-faults,task-clock", "-p",
                                 str(pid)])
                        pp = subprocess.Popen(perf, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.PIPE, text=True)
                        time.sleep(0.2)
                        out = subprocess.run(
                            ["redis-benchmark", "-p", str(port), "-t", "set,get", "-c", "4",
                             "-d", str(200 * 1024), "-n", str(args.n), "-r", "250"],
                            capture_output=True, text=True, timeout=300).stdout
                        pp.send_signal(2)
                        _, err = pp.communicate()
                        r = {f"{op.lower()}_{q}_ms": t[f"{q}_ms"]
                             for op, t in hermes.parse_redis(out).items() for q in ("p50", "p99")}
                        r.update(record_summary(data) if args.mode == "record"
                                 else stat_summary(err))
                        runs[c].append(r)
                        hermes.log(f"rep {rep} {c}: {r}")
                        subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"],
                                       capture_output=True)
                    finally:
                        hermes.stop(srv)
            finally:
                hermes.stop(ant)
    finally:
        cg.remove()
        shutil.rmtree(tmp, ignore_errors=True)
    summary = {}
    for c, rs in runs.items():
        for k in sorted({k for r in rs for k in r}):
            summary[f"{c}_{k}"] = statistics.median(r.get(k, 0) for r in rs)
    result = {"date": time.strftime("%Y-%m-%d", time.gmtime()),
              "command": "python3 bench/hermes_redis_perf.py"
              + (f" --configs {args.configs}" if args.configs != "default,reserve" else "")
              + (f" --reps {args.reps}" if args.reps != 3 else "")
              + (f" --n {args.n}" if args.n != 2000 else "")
              + (f" --mode {args.mode}" if args.mode != "record" else "")
              + (f" --out {args.out}" if args.out else ""),
              "seconds": round(time.time() - started, 1), "runs": runs, "summary": summary}
    hermes.write_result(result, args.out)


if __name__ == "__main__":
    main()
