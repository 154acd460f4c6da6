#!/usr/bin/env python3
"""A pool of memnodes (issue 14): what two replicas cost against one, and what losing a memnode
does to a server under load, each comparison in one run, repetitions interleaved.

    python3 bench/pool.py                 # 2 interleaved reps, then render
    python3 bench/pool.py --reps 1 --quick
    python3 bench/pool.py --render-only   # re-render bench/results/DETAILS.md from the JSON

Every cell starts three fresh `gleaner memnode` processes on TCP loopback (one token, 1 GiB
each) and runs one program under `gleaner run --memnode A,B,C`:

(a) write-back cost: the demo job (scripts/demo_job.py 50000, taskset -c 0, --local-mem 64M)
    with one memnode (`--memnode A`), a pool with `--replicas 1`, and a pool with `--replicas 2`
    (the default). Wall time, pages written to the memnodes (a pool's per-memnode counts summed;
    one memnode: the dirty evictions), and each run's checksum against all-local.
(b) memcached at about 50% local memory (`-m` sized for the keys, `--local-mem` half its
    footprint after loading), `--replicas 1` and `--replicas 2`: keys loaded with the harness's
    mcload, an open-loop phase at a fixed rate (latency from each request's scheduled send time),
    a closed-loop phase (throughput), then every key read back and checked.
(c) a memnode killed under load (`--replicas 2`): load, an open-loop phase ("before"), `kill -9`
    of one memnode, a second open-loop phase ("during recovery"), every key read back and checked;
    the pool's stats give the pages re-replicated and the time the copy took (its throughput).

Writes bench/results/pool.json and the pool section of bench/results/DETAILS.md. Exit status 0,
or 1 if any cell failed (a wrong value, a lost key, a checksum mismatch).
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from bench.doc_section import DOC, write_section  # noqa: E402
from bench.harness.__main__ import ensure_built  # noqa: E402
from bench.harness.common import (  # noqa: E402
    free_port, git_commit, last_json_line, machine, now_iso, python_exe, wait_port)
from bench.harness.workloads import MCLOAD  # noqa: E402
from bench.vs_swap import _med, _write, run_or_render  # noqa: E402

GLEANER = os.path.join(ROOT, "target", "release", "gleaner")
DEMO_JOB = os.path.join(ROOT, "scripts", "demo_job.py")
BEGIN, END = "<!-- pool:begin -->", "<!-- pool:end -->"


def log(msg):
    print(f"[pool] {msg}", file=sys.stderr, flush=True)


class Memnodes:
    """Three memnode processes on loopback sharing one token, killed on exit."""

    def __init__(self, tmp, n=3):
        self.token = os.path.join(tmp, "token")
        self.procs, self.addrs = [], []
        for i in range(n):
            p = subprocess.Popen([GLEANER, "memnode", "--listen", "127.0.0.1:0", "--capacity", "1G",
                                  "--token-file", self.token], stdout=subprocess.PIPE,
                                 stderr=open(os.path.join(tmp, f"memnode{i}.err"), "w"), text=True)
            line = p.stdout.readline().strip()
            if not line.startswith("listening on "):
                raise RuntimeError(f"memnode {i} printed {line!r}")
            self.procs.append(p)
            self.addrs.append(line[len("listening on "):])

    def kill(self, i):
        self.procs[i].kill()
        self.procs[i].wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def pool_of(stats):
    if not stats or not stats.get("processes"):
        return None
    return stats["processes"][0]["stats"]["store"].get("pool")


def demo_local_checksum():
    out = subprocess.run(["taskset", "-c", "0", python_exe(), DEMO_JOB, "50000"], capture_output=True,
                         text=True, timeout=600, check=True).stdout
    return _checksum(out)


def _checksum(stdout):
    """The demo job's checksum line without its timing ("checksum X over N objects")."""
    lines = [l for l in stdout.splitlines() if l.startswith("checksum ")]
    return lines[-1].split(" in ")[0] if lines else None


def demo_cell(config, tmp, want):
    with Memnodes(tmp) as nodes:
        stats_path = os.path.join(tmp, f"demo-{config}.json")
        memnode = nodes.addrs[0] if config == "one" else ",".join(nodes.addrs)
        extra = [] if config == "one" else ["--replicas", "1" if config == "pool-r1" else "2"]
        cmd = [GLEANER, "run", "--local-mem", "64M", "--memnode", memnode, "--token-file",
               nodes.token, "--stats", stats_path] + extra + [
            "--", "taskset", "-c", "0", python_exe(), DEMO_JOB, "50000"]
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        wall = time.monotonic() - t0
        stats = read_json(stats_path)
        ok = r.returncode == 0 and _checksum(r.stdout) == want
        pool = pool_of(stats)
        if pool:
            written = sum(m["pages_written"] for m in pool["memnodes"])
        else:
            written = (stats or {}).get("total", {}).get("evictions", {}).get("dirty")
        return {"kind": "demo", "config": config, "command": cmd, "ok": bool(ok), "wall_s": round(wall, 3),
                "exit_status": r.returncode, "pages_written": written,
                "pool": pool_of(stats), "stderr_tail": r.stderr[-1500:] if not ok else None}


def stop_server(server):
    """Stops a server started under `gleaner run`: SIGTERM (the launcher forwards it), then
    SIGKILL after a minute."""
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def mcload(args, timeout):
    r = subprocess.run([MCLOAD] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=timeout)
    return mcload_result(args[0], r.returncode, r.stdout, r.stderr)


def mcload_result(mode, returncode, stdout, stderr):
    """An mcload run's JSON and its error (None if every answer was right and every key there)."""
    j = last_json_line(stdout)
    err = None
    if j is None:
        err = f"mcload {mode} failed ({returncode}): {stderr.strip()[-400:]}"
    elif returncode != 0 or j.get("mismatches") or j.get("errors"):
        err = f"mcload {mode}: {j.get('mismatches')} wrong, {j.get('errors')} errors"
    elif j.get("misses"):
        err = f"mcload {mode}: {j['misses']} keys missing"
    return j, err


def memcached_cell(replicas, kill, p, tmp):
    with Memnodes(tmp) as nodes:
        port = free_port()
        stats_path = os.path.join(tmp, f"mc-r{replicas}-{int(kill)}.json")
        mb = int(p["keys"] * (p["vsize"] + 100) * 1.3 / (1 << 20)) + 64
        cmd = [GLEANER, "run", "--local-mem", p["local"], "--memnode", ",".join(nodes.addrs),
               "--token-file", nodes.token, "--replicas", str(replicas), "--stats", stats_path, "--",
               "taskset", "-c", "0", shutil.which("memcached") or "memcached", "-p", str(port),
               "-U", "0", "-l", "127.0.0.1", "-m", str(mb), "-t", "2", "-c", "1024", "-u", "root"]
        errf = open(os.path.join(tmp, "memcached.err"), "w")
        server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf)
        rec = {"kind": "memcached", "replicas": replicas, "kill": kill, "command": cmd, "phases": {}}
        err = None
        try:
            if not wait_port(port, server, timeout=60):
                raise RuntimeError("memcached did not start listening")
            base = ["127.0.0.1", port, p["keys"], p["vsize"]]
            ph = rec["phases"]
            ph["load"], err = mcload(["load"] + base, 600)
            if not err:
                ph["open"], err = mcload(["open"] + base + [p["rate"], p["open_s"], 95, 0.99, 4, 1],
                                         p["open_s"] + 120)
            if not err and kill:
                nodes.kill(1)
                rec["killed"] = nodes.addrs[1]
                ph["open_recovery"], err = mcload(
                    ["open"] + base + [p["rate"], p["open_s"], 95, 0.99, 4, 3], p["open_s"] + 120)
            if not err and not kill:
                ph["closed"], err = mcload(["closed"] + base + [p["closed_s"], 95, 0.99, 4, 16, 2],
                                           p["closed_s"] + 120)
            if not err:
                ph["verify"], err = mcload(["verify"] + base + [1], 600)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            err = str(e)
        finally:
            stop_server(server)
            errf.close()
        rec["exit_status"] = server.returncode
        stats = read_json(stats_path)
        rec["pool"] = pool_of(stats)
        if err is None and server.returncode not in (0, -signal.SIGTERM, 128 + signal.SIGTERM):
            err = f"memcached exited with status {server.returncode}"
        rec["ok"] = err is None
        rec["error"] = err
        if err:
            with open(os.path.join(tmp, "memcached.err")) as f:
                rec["stderr_tail"] = f.read()[-1500:]
        return rec


def run_all(args):
    ensure_built()
    p = {"keys": 40000 if args.quick else 150000, "vsize": 1024, "rate": 5000 if args.quick else 10000,
         "open_s": 3 if args.quick else 6, "closed_s": 2 if args.quick else 4,
         "local": "32M" if args.quick else "96M"}
    res = {"script": "bench/pool.py", "date": now_iso(), "git_commit": git_commit(),
           "machine": machine(), "reps": args.reps, "params": p, "cells": [], "complete": False}
    log("all-local demo checksum")
    want = demo_local_checksum()
    res["demo_local_checksum"] = want
    configs = ["one", "pool-r1", "pool-r2"]
    for rep in range(args.reps):
        order = configs[rep % 3:] + configs[:rep % 3]
        for c in order:
            with tempfile.TemporaryDirectory(prefix="gleaner-pool-") as tmp:
                log(f"rep {rep + 1}: demo job, {c}")
                res["cells"].append(dict(demo_cell(c, tmp, want), rep=rep))
        for r in ([1, 2] if rep % 2 == 0 else [2, 1]):
            with tempfile.TemporaryDirectory(prefix="gleaner-pool-") as tmp:
                log(f"rep {rep + 1}: memcached, {r} replica(s)")
                res["cells"].append(dict(memcached_cell(r, False, p, tmp), rep=rep))
        with tempfile.TemporaryDirectory(prefix="gleaner-pool-") as tmp:
            log(f"rep {rep + 1}: memcached, a memnode killed under load")
            res["cells"].append(dict(memcached_cell(2, True, p, tmp), rep=rep))
        _write(res, args.out)
    res["complete"] = True
    _write(res, args.out)
    failed = [c for c in res["cells"] if not c["ok"]]
    for c in failed:
        log(f"FAILED: {c['kind']} {c.get('config', c.get('replicas'))}: {c.get('error') or c.get('stderr_tail')}")
    return (1 if failed else 0), res


def render(res, doc, name):
    cells = res["cells"]
    demo = {c: [x for x in cells if x["kind"] == "demo" and x["config"] == c and x["ok"]]
            for c in ("one", "pool-r1", "pool-r2")}
    wall = {c: _med([x["wall_s"] for x in v]) for c, v in demo.items()}
    out = {c: _med([x["pages_written"] for x in v]) for c, v in demo.items()}
    mc = {r: [x for x in cells if x["kind"] == "memcached" and not x["kill"] and x["replicas"] == r
              and x["ok"]] for r in (1, 2)}
    kills = [x for x in cells if x["kind"] == "memcached" and x["kill"]]
    m = res["machine"]
    lines = [BEGIN, "## A pool of memnodes: two replicas against one, and a memnode killed under load", "",
             f"Generated by `python3 bench/pool.py --reps {res['reps']}` → `{name}` ({res['date']}, "
             f"{m.get('cpus', '?')} CPUs, Linux {m.get('kernel', '?')}, gleaner at `{res['git_commit']}`). "
             "Three `gleaner memnode` processes on TCP loopback per cell; medians over the reps. "
             f"Failed cells: {sum(1 for c in cells if not c['ok'])} of {len(cells)}.", "",
             "| demo job (64 MiB local) | wall s | × one memnode | pages written to memnodes | checksum |",
             "|---|---:|---:|---:|---|"]
    for c, label in (("one", "one memnode"), ("pool-r1", "pool of 3, 1 replica"), ("pool-r2", "pool of 3, 2 replicas")):
        ratio = wall[c] / wall["one"] if wall[c] and wall["one"] else None
        lines.append(f"| {label} | {_f(wall[c], '{:.2f}')} | {_f(ratio, '{:.2f}')} | "
                     f"{_f(out[c], '{:.0f}')} | "
                     f"{'all match' if demo[c] and all(x['ok'] for x in demo[c]) else 'FAILED'} |")
    p = res["params"]
    lines += ["", f"memcached, {p['keys']} keys × {p['vsize']} B, `--local-mem {p['local']}` (about half "
              f"its footprint), open loop at {p['rate']} req/s for {p['open_s']} s, closed loop "
              f"{p['closed_s']} s (4 connections × 16), 95% GET, Zipf 0.99; every key read back and "
              "checked at the end of every cell.", "",
              "| replicas | closed-loop req/s | open-loop p50 µs | p99 µs | wrong or missing values |",
              "|---:|---:|---:|---:|---:|"]
    for r in (1, 2):
        v = mc[r]
        lines.append(f"| {r} | {_f(_med([x['phases']['closed']['throughput_rps'] for x in v]), '{:.0f}')} | "
                     f"{_f(_med([x['phases']['open']['latency_us']['p50'] for x in v]), '{:.0f}')} | "
                     f"{_f(_med([x['phases']['open']['latency_us']['p99'] for x in v]), '{:.0f}')} | "
                     f"{'0' if v else 'n/a'} |")
    if mc[1] and mc[2]:
        t1 = _med([x['phases']['closed']['throughput_rps'] for x in mc[1]])
        t2 = _med([x['phases']['closed']['throughput_rps'] for x in mc[2]])
        lines.append("")
        lines.append(f"Two replicas against one: {t2 / t1:.2f}× the closed-loop throughput.")
    lines += ["", "A memnode killed (`kill -9`) between two open-loop phases (2 replicas):", "",
              "| rep | p99 before µs | p99 during recovery µs | unanswered | wrong | missing at the end | "
              "pages re-replicated | copy s | pages/s |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for k in kills:
        ph = k.get("phases", {})
        b, d, v = ph.get("open"), ph.get("open_recovery"), ph.get("verify")
        pool = k.get("pool") or {}
        pages, secs = pool.get("pages_repaired"), pool.get("repair_seconds")
        lines.append(f"| {k['rep'] + 1} | {_f(b and b['latency_us']['p99'], '{:.0f}')} | "
                     f"{_f(d and d['latency_us']['p99'], '{:.0f}')} | {_f(d and d['unanswered'], '{}')} | "
                     f"{_f(d and d['mismatches'], '{}')} | {_f(v and v['misses'], '{}')} | {_f(pages, '{}')} | "
                     f"{_f(secs, '{:.2f}')} | {_f(pages / secs if pages and secs else None, '{:.0f}')} |"
                     + ("" if k["ok"] else f" FAILED: {k.get('error')}"))
    lines.append(END)
    write_section("\n".join(lines), BEGIN, END, doc, at_end=True)
    log(f"wrote the pool section of {doc}")


def _f(v, fmt):
    return "n/a" if v is None else fmt.format(v)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="smaller memcached cells")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "pool.json"))
    ap.add_argument("--doc", default=DOC)
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--no-render", action="store_true")
    return run_or_render(ap, argv, "pool.py", run_all, render, log)


if __name__ == "__main__":
    sys.exit(main())
