#!/usr/bin/env python3
"""Many programs, one memnode link (issue 13): memcached beside two batch jobs on one memnode
whose link is capped, with the link served first come first served (`--schedule fifo`) or in
fair order by tenant with demand before prefetch before write-back (`--schedule fair`, the
default), against each program alone on the same kind of memnode. Same run, reps interleaved.

    python3 bench/corun.py                 # 2 reps, then render
    python3 bench/corun.py --reps 1 --quick
    python3 bench/corun.py --render-only

Every cell starts a fresh `gleaner memnode --bandwidth B --schedule S` on TCP loopback with three
tenants of weight 1 (memcached, batch1, batch2: each program has its own token, quota and queue)
and runs, each under `gleaner run` at about a quarter of its footprint local:

* memcached (`-t 2`), its keys loaded, then an open-loop phase at a fixed rate (95% GET,
  Zipf 0.99; latency from each request's scheduled send time): its p99 and the bytes it moved;
* the demo job (`scripts/demo_job.py`) twice, as two batch programs: their wall time and bytes.

"solo" cells run one program alone; the "corun" cell starts both batch jobs and then memcached's
open-loop phase beside them. Reported per schedule: each program's slowdown (memcached: co-run
p99 over solo p99; batch: co-run wall time over solo), their mean, max and standard deviation,
and WMMR (Canvas: min over programs of co-run bandwidth / solo bandwidth, divided by the max).
Linux swap as a third system (each program in its own memory cgroup, one shared zram device) is
not run here yet.

Writes bench/results/corun.json and the co-run section of docs/BENCHMARKS.md. Exit status 0, or 1
if a cell failed (a wrong value, a lost key, a checksum mismatch, a program that failed).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from bench.doc_section import DOC, write_section  # noqa: E402
from bench.harness.__main__ import ensure_built  # noqa: E402
from bench.harness.common import free_port, git_commit, machine, now_iso, python_exe, wait_port  # noqa: E402
from bench.pool import _checksum, mcload, read_json, stop_server  # noqa: E402
from bench.vs_swap import _med, _write, run_or_render  # noqa: E402

GLEANER = os.path.join(ROOT, "target", "release", "gleaner")
DEMO_JOB = os.path.join(ROOT, "scripts", "demo_job.py")
BEGIN, END = "<!-- corun:begin -->", "<!-- corun:end -->"
SCHEDULES = ("fifo", "fair")
PROGRAMS = ("memcached", "batch1", "batch2")


def log(msg):
    print(f"[corun] {msg}", file=sys.stderr, flush=True)


class Memnode:
    """One memnode with a capped link and a tenant per program, killed on exit."""

    def __init__(self, tmp, p, schedule):
        self.tokens = {t: os.path.join(tmp, f"{t}.token") for t in PROGRAMS}
        args = [GLEANER, "memnode", "--listen", "127.0.0.1:0", "--capacity", "2G", "--token-file",
                os.path.join(tmp, "main.token"), "--bandwidth", p["bandwidth"], "--schedule", schedule]
        for t in PROGRAMS:
            weight = p["mc_weight"] if t == "memcached" else 1
            args += ["--tenant", f"{t}:{self.tokens[t]}:600M:{weight}"]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE,
                                     stderr=open(os.path.join(tmp, "memnode.err"), "w"), text=True)
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            raise RuntimeError(f"the memnode printed {line!r}")
        self.addr = line[len("listening on "):]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def _moved(stats):
    t = (stats or {}).get("total", {})
    return (t.get("bytes_in") or 0) + (t.get("bytes_out") or 0)


class Batch(threading.Thread):
    """A demo job under `gleaner run`, as tenant `name`."""

    def __init__(self, node, name, p, tmp, want):
        super().__init__(daemon=True)
        self.stats = os.path.join(tmp, f"{name}.json")
        self.cmd = [GLEANER, "run", "--local-mem", p["batch_local"], "--memnode", node.addr,
                    "--token-file", node.tokens[name], "--stats", self.stats, "--",
                    python_exe(), DEMO_JOB, str(p["demo_n"])]
        self.name, self.want, self.rec = name, want, {}

    def run(self):
        t0 = time.monotonic()
        r = subprocess.run(self.cmd, capture_output=True, text=True, timeout=1800)
        wall = time.monotonic() - t0
        ok = r.returncode == 0 and _checksum(r.stdout) == self.want
        self.rec = {"ok": ok, "wall_s": round(wall, 3), "bytes": _moved(read_json(self.stats)),
                    "error": None if ok else f"exit {r.returncode}: {r.stderr[-600:]}"}


def memcached(node, p, tmp, during=None):
    """memcached under `gleaner run` as tenant memcached: load, then an open-loop phase (with
    `during` started just before it), then every key read back."""
    port = free_port()
    stats_path = os.path.join(tmp, "memcached.json")
    mb = int(p["keys"] * (p["vsize"] + 100) * 1.3 / (1 << 20)) + 64
    cmd = [GLEANER, "run", "--local-mem", p["mc_local"], "--memnode", node.addr, "--token-file",
           node.tokens["memcached"], "--stats", stats_path, "--",
           shutil.which("memcached") or "memcached", "-p", str(port), "-U", "0", "-l", "127.0.0.1",
           "-m", str(mb), "-t", "2", "-c", "1024", "-u", "root"]
    errf = open(os.path.join(tmp, "memcached.err"), "w")
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf)
    rec, err = {}, None
    try:
        if not wait_port(port, server, timeout=60):
            raise RuntimeError("memcached did not start listening")
        base = ["127.0.0.1", port, p["keys"], p["vsize"]]
        _, err = mcload(["load"] + base, 900)
        if not err:
            for t in during or []:
                t.start()
            t0 = time.monotonic()
            phase, err = mcload(["open"] + base + [p["rate"], p["open_s"], 95, 0.99, 4, 1],
                                p["open_s"] + 300)
            rec["open_s"] = round(time.monotonic() - t0, 3)
            if phase:
                rec["p50_us"] = phase["latency_us"]["p50"]
                rec["p99_us"] = phase["latency_us"]["p99"]
                rec["unanswered"] = phase.get("unanswered")
        if not err:
            _, err = mcload(["verify"] + base + [1], 900)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        err = str(e)
    finally:
        stop_server(server)
        errf.close()
    rec["bytes"] = _moved(read_json(stats_path))
    rec["ok"] = err is None
    rec["error"] = err
    return rec


def cell(kind, schedule, p, want, rep):
    with tempfile.TemporaryDirectory(prefix="gleaner-corun-") as tmp, Memnode(tmp, p, schedule) as node:
        rec = {"kind": kind, "schedule": schedule, "rep": rep, "programs": {}}
        if kind == "solo-memcached":
            rec["programs"]["memcached"] = memcached(node, p, tmp)
        elif kind == "solo-batch":
            b = Batch(node, "batch1", p, tmp, want)
            b.run()
            rec["programs"]["batch1"] = b.rec
        else:
            batches = [Batch(node, n, p, tmp, want) for n in ("batch1", "batch2")]
            rec["programs"]["memcached"] = memcached(node, p, tmp, during=batches)
            for b in batches:
                b.join()
                rec["programs"][b.name] = b.rec
        stats = subprocess.run([GLEANER, "memnode", "stats", "--addr", node.addr, "--token-file",
                                os.path.join(tmp, "main.token")], capture_output=True, text=True)
        try:
            rec["queues"] = {t["name"]: t.get("queue") for t in json.loads(stats.stdout)["tenants"]}
        except (ValueError, KeyError):
            rec["queues"] = None
        rec["ok"] = all(x.get("ok") for x in rec["programs"].values())
        return rec


def run_all(args):
    ensure_built()
    quick = args.quick
    p = {"bandwidth": args.bandwidth, "keys": 30000 if quick else 60000, "vsize": 1024, "rate": 2000,
         "open_s": 4 if quick else 8, "mc_local": "16M", "demo_n": 15000 if quick else 30000,
         "batch_local": "16M", "mc_weight": args.mc_weight}
    reps = args.reps or 2
    res = {"script": "bench/corun.py", "date": now_iso(), "git_commit": git_commit(),
           "machine": machine(), "reps": reps, "params": p, "cells": [], "complete": False}
    want = _checksum(subprocess.run([python_exe(), DEMO_JOB, str(p["demo_n"])], capture_output=True,
                                    text=True, timeout=900).stdout)
    res["demo_local_checksum"] = want
    for rep in range(reps):
        order = list(SCHEDULES) if rep % 2 == 0 else list(reversed(SCHEDULES))
        for schedule in order:
            for kind in ("solo-memcached", "solo-batch", "corun"):
                log(f"rep {rep + 1}: {schedule} {kind}")
                rec = cell(kind, schedule, p, want, rep)
                log("  " + ", ".join(f"{n}: {x.get('p99_us') or x.get('wall_s')} {'ok' if x.get('ok') else x.get('error')}"
                                     for n, x in rec["programs"].items()))
                res["cells"].append(rec)
                _write(res, args.out)
    res["complete"] = True
    _write(res, args.out)
    failed = [c for c in res["cells"] if not c["ok"]]
    return (1 if failed else 0), res


def summarise(res, schedule):
    """Per program: solo and co-run medians, slowdown, bandwidth ratio; and the aggregates."""
    cells = [c for c in res["cells"] if c["schedule"] == schedule and c["ok"]]

    def med(kind, prog, key):
        return _med([c["programs"][prog].get(key) for c in cells
                     if c["kind"] == kind and prog in c["programs"]])

    out = {}
    solo_mc = (med("solo-memcached", "memcached", "p99_us"), med("solo-memcached", "memcached", "bytes"),
               med("solo-memcached", "memcached", "open_s"))
    co_mc = (med("corun", "memcached", "p99_us"), med("corun", "memcached", "bytes"),
             med("corun", "memcached", "open_s"))
    out["memcached"] = {"solo": solo_mc[0], "corun": co_mc[0],
                        "slowdown": co_mc[0] / solo_mc[0] if solo_mc[0] and co_mc[0] else None,
                        "bw_ratio": (co_mc[1] / co_mc[2]) / (solo_mc[1] / solo_mc[2])
                        if all(solo_mc) and all(co_mc) else None}
    solo_b = (med("solo-batch", "batch1", "wall_s"), med("solo-batch", "batch1", "bytes"))
    for prog in ("batch1", "batch2"):
        co = (med("corun", prog, "wall_s"), med("corun", prog, "bytes"))
        out[prog] = {"solo": solo_b[0], "corun": co[0],
                     "slowdown": co[0] / solo_b[0] if solo_b[0] and co[0] else None,
                     "bw_ratio": (co[1] / co[0]) / (solo_b[1] / solo_b[0])
                     if all(solo_b) and all(co) else None}
    slow = [v["slowdown"] for v in out.values() if v["slowdown"]]
    bw = [v["bw_ratio"] for v in out.values() if v["bw_ratio"]]
    agg = {"mean": statistics.mean(slow) if slow else None, "max": max(slow) if slow else None,
           "sigma": statistics.pstdev(slow) if len(slow) > 1 else None,
           "wmmr": min(bw) / max(bw) if len(bw) == 3 else None}
    return out, agg


def render(res, doc, name):
    m, p = res["machine"], res["params"]
    lines = [BEGIN, "## Many programs, one memnode link: fair scheduling against first come first served", "",
             f"Generated by `python3 bench/corun.py --reps {res['reps']}"
             f"{'' if p.get('mc_weight', 1) == 1 else ' --mc-weight ' + str(p['mc_weight'])}"
             f"{'' if p['bandwidth'] == '32M' else ' --bandwidth ' + p['bandwidth']}` → `{name}` "
             f"({res['date']}, "
             f"{m.get('cpus', '?')} CPUs, Linux {m.get('kernel', '?')}, gleaner at `{res['git_commit']}`). "
             f"One memnode on TCP loopback per cell, its link capped at {p['bandwidth']}/s, a tenant per "
             f"program (memcached's weight {p.get('mc_weight', 1)}, the batch jobs' 1). memcached: {p['keys']} keys × {p['vsize']} B, `--local-mem "
             f"{p['mc_local']}`, open loop at {p['rate']} req/s for {p['open_s']} s (95% GET, Zipf 0.99), "
             f"every key read back; batch: `scripts/demo_job.py {p['demo_n']}` at `--local-mem "
             f"{p['batch_local']}`, checksum against all-local. Slowdown: memcached's co-run p99 over "
             "its solo p99, a batch job's co-run wall time over its solo time (both batch jobs are the "
             "same program: one solo run serves both). WMMR: min over programs of co-run bandwidth ÷ "
             "solo bandwidth, over the max (1.0 is perfectly fair). Medians over the reps; failed "
             f"cells: {sum(1 for c in res['cells'] if not c['ok'])} of {len(res['cells'])}.", "",
             "| schedule | memcached p99 solo → co-run µs | × | batch1 s solo → co-run | × | batch2 × | "
             "mean × | max × | σ | WMMR |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in SCHEDULES:
        out, agg = summarise(res, s)
        mc, b1, b2 = out["memcached"], out["batch1"], out["batch2"]
        lines.append(
            f"| {s} | {_f(mc['solo'], '{:.0f}')} → {_f(mc['corun'], '{:.0f}')} | {_f(mc['slowdown'], '{:.2f}')} | "
            f"{_f(b1['solo'], '{:.1f}')} → {_f(b1['corun'], '{:.1f}')} | {_f(b1['slowdown'], '{:.2f}')} | "
            f"{_f(b2['slowdown'], '{:.2f}')} | {_f(agg['mean'], '{:.2f}')} | {_f(agg['max'], '{:.2f}')} | "
            f"{_f(agg['sigma'], '{:.2f}')} | {_f(agg['wmmr'], '{:.2f}')} |")
    lines += ["", "Issue 13's targets under the fair schedule: memcached co-run p99 ≤ 1.5× solo, every "
              "batch slowdown ≤ 1.3×, WMMR ≥ 0.9. Linux swap as a third system is not measured here yet."]
    lines.append(END)
    write_section("\n".join(lines), BEGIN, END, doc, at_end=True)
    log(f"wrote the co-run section of {doc}")


def _f(v, fmt):
    return "n/a" if v is None else fmt.format(v)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=None, help="interleaved repetitions (default 2)")
    ap.add_argument("--quick", action="store_true", help="smaller programs, shorter phases")
    ap.add_argument("--mc-weight", type=int, default=1,
                    help="memcached's tenant weight (the batch jobs have 1)")
    ap.add_argument("--bandwidth", default="32M",
                    help="the memnode's link cap, bytes per second (default 32M: the three "
                         "programs' demand is over it; at 96M it fits, and what is left is queueing)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "corun.json"))
    ap.add_argument("--doc", default=DOC)
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--no-render", action="store_true")
    return run_or_render(ap, argv, "corun.py", run_all, render, log)


if __name__ == "__main__":
    sys.exit(main())
