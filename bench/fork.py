#!/usr/bin/env python3
"""Fork with far memory (issue 14): redis BGSAVE of a data set four times the local budget, on
four systems in one run, repetitions interleaved.

    python3 bench/fork.py                 # 2 interleaved reps, then render
    python3 bench/fork.py --reps 1 --quick
    python3 bench/fork.py --render-only   # re-render bench/results/DETAILS.md from the JSON

Every cell starts a fresh redis-server (no persistence of its own, debug commands on), fills it
with `DEBUG POPULATE` (25,000 values of 8,000 bytes: about 200 MB; --quick: 6,000), takes the
data set's `DEBUG DIGEST`, runs `BGSAVE` and waits for it, then shuts redis down and loads the
dump into a plain redis-server, whose digest must match. Systems:

* `all-local`: redis alone (no limit): the memory the data set takes, and how fast a fork is.
* `gleaner-far`: `gleaner run --local-mem 48M` (the default `--fork far`: the BGSAVE child pages
  from a snapshot of the parent's far memory with a budget of its own, 12 MiB).
* `gleaner-home`: the same with `--fork home` (every far page is brought home before the fork).
* `linux-swap`: redis in a memory cgroup limited to 48 MiB plus redis's own memory before any
  data (measured by the all-local cell of the same rep), swap on a fresh zram device.

Measured: the fork's latency (redis's `latest_fork_usec`), the BGSAVE's duration (from the
command to `rdb_bgsave_in_progress:0`), and the peaks of the summed anonymous memory of redis and
its children sampled every 5 ms: `Pss_Anon` (a page shared by parent and child counts once: the
memory they take) and `RssAnon` (counted in each process that maps it).

Writes bench/results/fork.json and the fork section of bench/results/DETAILS.md. Exit status 0,
or 1 if any cell failed (a digest mismatch, a BGSAVE that failed or did not finish).
"""
import argparse
import os
import shutil
import socket
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
from bench.harness.common import free_port, git_commit, machine, now_iso  # noqa: E402
from bench.vs_swap import _med, _write, run_or_render  # noqa: E402

GLEANER = os.path.join(ROOT, "target", "release", "gleaner")
BEGIN, END = "<!-- fork:begin -->", "<!-- fork:end -->"
SYSTEMS = ("all-local", "gleaner-far", "gleaner-home", "linux-swap")
LOCAL_MIB = 48


def log(msg):
    print(f"[fork] {msg}", file=sys.stderr, flush=True)


class Redis:
    """A minimal RESP client."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.f = self.sock.makefile("rb")

    def cmd(self, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.sock.sendall(out)
        return self._reply()

    def _reply(self):
        line = self.f.readline()
        kind, rest = line[:1], line[1:-2]
        if kind in (b"+", b"-"):
            if kind == b"-":
                raise RuntimeError(rest.decode())
            return rest.decode()
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.f.read(n + 2)[:-2].decode()
        raise RuntimeError(f"unexpected reply {line!r}")

    def info(self, section, field):
        for line in self.cmd("INFO", section).splitlines():
            if line.startswith(field + ":"):
                return line.split(":", 1)[1].strip()
        raise RuntimeError(f"no {field} in INFO {section}")


def _kb_field(path, field):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


def anon_mib(pid):
    """(Pss_Anon, RssAnon) of pid in MiB, or (None, None) once it is gone."""
    return _kb_field(f"/proc/{pid}/smaps_rollup", "Pss_Anon"), _kb_field(f"/proc/{pid}/status", "RssAnon")


class Sampler(threading.Thread):
    """Peaks of the summed Pss_Anon and RssAnon of a process and its children, every 5 ms."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.stop, self.pss, self.rss, self.child_seen = pid, False, 0.0, 0.0, False

    def run(self):
        while not self.stop:
            try:
                with open(f"/proc/{self.pid}/task/{self.pid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                kids = []
            pss, rss = anon_mib(self.pid)
            pss, rss = pss or 0.0, rss or 0.0
            for k in kids:
                p, r = anon_mib(k)
                if p is not None and r is not None:
                    pss, rss, self.child_seen = pss + p, rss + r, True
            self.pss, self.rss = max(self.pss, pss), max(self.rss, rss)
            time.sleep(0.005)


def _wait_port(port, timeout):
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on port {port} after {timeout} s")
            time.sleep(0.05)


def redis_args(port, data_dir):
    return [shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", data_dir, "--dbfilename", "dump.rdb",
            "--enable-debug-command", "yes"]


def drive(port, p, rec):
    """Fills the server, runs BGSAVE with the sampler on, shuts it down (recording into rec)."""
    _wait_port(port, 60)
    r = Redis(port)
    pid = int(r.info("server", "process_id"))
    rec["non_heap_mib"] = anon_mib(pid)[1]
    r.cmd("DEBUG", "POPULATE", p["keys"], "k", p["value_bytes"])
    rec["digest"] = r.cmd("DEBUG", "DIGEST")
    rec["before_mib"] = anon_mib(pid)[1]
    sampler = Sampler(pid)
    sampler.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    r.cmd("BGSAVE")
    deadline = t0 + 300
    time.sleep(0.01)
    while r.info("persistence", "rdb_bgsave_in_progress") != "0":
        if time.monotonic() > deadline:
            raise RuntimeError("BGSAVE did not finish in 300 s")
        time.sleep(0.01)
    rec["bgsave_s"] = round(time.monotonic() - t0, 3)
    sampler.stop = True
    sampler.join()
    rec["bgsave_status"] = r.info("persistence", "rdb_last_bgsave_status")
    rec["fork_us"] = int(r.info("stats", "latest_fork_usec"))
    rec["peak_pss_anon_mib"] = round(sampler.pss, 1)
    rec["peak_rss_anon_mib"] = round(sampler.rss, 1)
    rec["child_seen"] = sampler.child_seen
    try:
        r.cmd("SHUTDOWN", "NOSAVE")
    except (RuntimeError, OSError):
        pass


def check_dump(data_dir, want):
    """The dump loaded into a plain redis: its digest."""
    port = free_port()
    p = subprocess.Popen(redis_args(port, data_dir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port, 60)
        r = Redis(port)
        while r.info("persistence", "loading") != "0":
            time.sleep(0.05)
        return r.cmd("DEBUG", "DIGEST") == want
    finally:
        p.kill()
        p.wait()


def cell(system, p, ctx, tmp):
    data_dir = os.path.join(tmp, "data")
    os.makedirs(data_dir)
    port = free_port()
    cmd = redis_args(port, data_dir)
    if system.startswith("gleaner"):
        cmd = [GLEANER, "run", "--local-mem", f"{LOCAL_MIB}M", "--quiet"] + (
            ["--fork", "home"] if system == "gleaner-home" else []) + ["--"] + cmd
    rec = {"system": system, "ok": False}
    errors = []

    def driver():
        try:
            drive(port, p, rec)
        except Exception as e:  # noqa: BLE001 - recorded as the cell's failure
            errors.append(f"{type(e).__name__}: {e}")
            subprocess.run(["pkill", "-f", f"redis-server 127.0.0.1:{port}"], check=False)

    t = threading.Thread(target=driver, daemon=True)
    t.start()
    if system == "linux-swap":
        from bench.vs_swap import under_linux_swap
        limit = ctx["linux_limit"]
        rc, _, err, _, _, timed_out, swap = under_linux_swap(
            ctx["state"], "fork", limit, ctx["zram_bytes"], cmd, tmp, 600)
        rec["cgroup_limit_mib"] = round(limit / (1 << 20), 1)
        rec["swap_ins"] = swap.get("swap_ins")
    else:
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "err"), "w"),
                              timeout=600, check=False)
        rc = proc.returncode
    t.join(60)
    if errors:
        rec["error"] = errors[0]
        return rec
    if rec.get("bgsave_status") != "ok" or not rec.get("child_seen"):
        rec["error"] = f"BGSAVE status {rec.get('bgsave_status')}, child seen {rec.get('child_seen')}"
        return rec
    rec["dump_matches"] = check_dump(data_dir, rec["digest"])
    rec["ok"] = rec["dump_matches"]
    if not rec["ok"]:
        rec["error"] = "the dump's digest differs from the data set's"
    rec["server_exit"] = rc
    return rec


def run_all(args):
    ensure_built()
    from bench.harness import swapenv
    from bench.harness.runner import _become_subreaper
    _become_subreaper()
    p = {"keys": 6000 if args.quick else 25000, "value_bytes": 8000, "local_mib": LOCAL_MIB}
    res = {"script": "bench/fork.py", "date": now_iso(), "git_commit": git_commit(), "machine": machine(),
           "reps": args.reps, "params": p, "cells": [], "complete": False}
    reason = swapenv.unavailable_reason() if os.geteuid() == 0 else "not root"
    state = swapenv.State()
    ctx = {"state": state, "zram_bytes": 1 << 30}
    try:
        for rep in range(args.reps):
            # all-local first: its memory before any data sets the Linux cgroup's limit.
            others = list(SYSTEMS[1:])
            others = others[rep % 3:] + others[:rep % 3]
            for system in ["all-local"] + others:
                if system == "linux-swap" and reason:
                    log(f"linux-swap skipped: {reason}")
                    continue
                with tempfile.TemporaryDirectory(prefix="gleaner-fork-") as tmp:
                    log(f"rep {rep + 1}: {system}")
                    rec = dict(cell(system, p, ctx, tmp), rep=rep)
                if system == "all-local" and rec.get("non_heap_mib"):
                    ctx["linux_limit"] = int((LOCAL_MIB + rec["non_heap_mib"]) * (1 << 20)) // 4096 * 4096
                log(f"  {system}: " + ", ".join(f"{k} {rec.get(k)}" for k in (
                    "fork_us", "bgsave_s", "peak_pss_anon_mib", "peak_rss_anon_mib", "ok", "error")))
                res["cells"].append(rec)
                _write(res, args.out)
        res["complete"] = True
    finally:
        errors = swapenv.teardown(state)
        if errors:
            res["cleanup_errors"] = errors
        _write(res, args.out)
    failed = [c for c in res["cells"] if not c["ok"]]
    return (1 if failed or not res["complete"] else 0), res


def render(res, doc, name):
    cells = res["cells"]
    m, p = res["machine"], res["params"]
    by = {s: [c for c in cells if c["system"] == s and c["ok"]] for s in SYSTEMS}

    def med(s, k):
        return _med([c.get(k) for c in by[s]])

    lines = [BEGIN, "## Fork with far memory: redis BGSAVE at a quarter of its data set", "",
             f"Generated by `python3 bench/fork.py --reps {res['reps']}` → `{name}` ({res['date']}, "
             f"{m.get('cpus', '?')} CPUs, Linux {m.get('kernel', '?')}, gleaner at `{res['git_commit']}`). "
             f"redis with {p['keys']} values of {p['value_bytes']} B (`DEBUG POPULATE`), "
             f"`--local-mem {p['local_mib']}M`; the BGSAVE child of `gleaner-far` pages with its own "
             f"{p['local_mib'] // 4} MiB. Memory: peaks of the summed anonymous memory of redis and its "
             "fork child, sampled every 5 ms (`Pss_Anon` counts a page the two share once; `RssAnon` in "
             "each). Every dump loaded into a plain redis has the data set's `DEBUG DIGEST`. Medians "
             f"over the reps; failed cells: {sum(1 for c in cells if not c['ok'])} of {len(cells)}.", "",
             "| system | fork ms | BGSAVE s | peak memory MiB (Pss_Anon) | peak RssAnon MiB | dumps match |",
             "|---|---:|---:|---:|---:|---|"]
    for s in SYSTEMS:
        runs = [c for c in cells if c["system"] == s]
        if not runs:
            lines.append(f"| {s} | not run | | | | |")
            continue
        fork = med(s, "fork_us")
        lines.append(f"| {s} | {_f(fork and fork / 1000, '{:.1f}')} | {_f(med(s, 'bgsave_s'), '{:.2f}')} | "
                     f"{_f(med(s, 'peak_pss_anon_mib'), '{:.0f}')} | {_f(med(s, 'peak_rss_anon_mib'), '{:.0f}')} | "
                     f"{'all' if all(c['ok'] for c in runs) else 'FAILED: ' + str(next(c.get('error') for c in runs if not c['ok']))} |")
    nh = med("all-local", "non_heap_mib")
    far = med("gleaner-far", "peak_pss_anon_mib")
    if nh and far:
        bound = 1.5 * p["local_mib"] + 2 * nh
        lines += ["", f"Target (issue 14): parent + child within 1.5× the budget plus the program's own "
                  f"memory (redis before any data: {nh:.1f} MiB, once per process): {bound:.0f} MiB; "
                  f"`gleaner-far` peaked at {far:.0f} MiB ({far / bound:.2f}× the bound)."]
    lines.append(END)
    write_section("\n".join(lines), BEGIN, END, doc, at_end=True)
    log(f"wrote the fork section of {doc}")


def _f(v, fmt):
    return "n/a" if v is None else fmt.format(v)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="a smaller data set")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "fork.json"))
    ap.add_argument("--doc", default=DOC)
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--no-render", action="store_true")
    return run_or_render(ap, argv, "fork.py", run_all, render, log)


if __name__ == "__main__":
    sys.exit(main())
