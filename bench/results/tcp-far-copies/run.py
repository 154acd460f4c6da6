#!/usr/bin/env python3
"""What a memnode reached over TCP holds for one program: before Forget (every page the program
ever evicted, resident again or not) and after (its far pages, plus the clean resident pages'
copies, which a clean eviction reuses).

Each cell starts a memnode on TCP loopback (no link cap), runs the program under `gleaner run`
on it, and polls the memnode's stats every 50 ms for the session's stored bytes; reported: the
peak and the end, the program's wall time and the region's own count of far pages at the end
(from `--stats`). Builds interleaved per rep.

    python3 run.py OUT.json NAME=GLEANER_BINARY [NAME=GLEANER_BINARY ...]

Environment: REPS (default 2). Programs: the quick-start demo job (`scripts/demo_job.py 50000`
at 64 MiB local) and memcached (60,000 × 1 KiB keys at 16 MiB local, loaded, then served
for 5 s (95% GET, Zipf 0.99, closed loop), then every key checked: `bench.pool.mcload`).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)
from bench.harness.common import free_port, wait_port  # noqa: E402
from bench.pool import mcload  # noqa: E402

DEMO = os.path.join(ROOT, "scripts", "demo_job.py")


def memnode(gleaner, tmp):
    p = subprocess.Popen([gleaner, "memnode", "--listen", "127.0.0.1:0", "--capacity", "4G",
                          "--token-file", f"{tmp}/token"], stdout=subprocess.PIPE,
                         stderr=open(f"{tmp}/memnode.err", "w"), text=True)
    line = p.stdout.readline().strip()
    assert line.startswith("listening on "), line
    return p, line[len("listening on "):]


class Poller(threading.Thread):
    """Polls the memnode's stored bytes (all sessions) until stopped."""

    def __init__(self, gleaner, addr, tmp):
        super().__init__(daemon=True)
        self.cmd = [gleaner, "memnode", "stats", "--addr", addr, "--token-file", f"{tmp}/token"]
        self.peak = self.last = 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            r = subprocess.run(self.cmd, capture_output=True, text=True)
            if r.returncode == 0:
                st = json.loads(r.stdout)
                held = sum(s["stored_bytes"] for s in st.get("sessions", []))
                self.peak, self.last = max(self.peak, held), held
            self.stop.wait(0.05)


def run_demo(gleaner, addr, tmp):
    out = subprocess.run([gleaner, "run", "--local-mem", "64M", "--memnode", addr, "--token-file",
                          f"{tmp}/token", "--stats", f"{tmp}/stats.json", "--", sys.executable, DEMO,
                          "50000"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "checksum" in out.stdout, out.stderr[-2000:]
    return out.stdout.split()[1]


def run_memcached(gleaner, addr, tmp):
    port = free_port()
    mc = subprocess.Popen([gleaner, "run", "--local-mem", "16M", "--memnode", addr, "--token-file",
                           f"{tmp}/token", "--stats", f"{tmp}/stats.json", "--",
                           shutil.which("memcached") or "memcached", "-p", str(port), "-U", "0", "-l",
                           "127.0.0.1", "-m", "128", "-t", "2", "-u", "root"],
                          stderr=open(f"{tmp}/mc.err", "w"))
    try:
        assert wait_port(port, mc, timeout=30), open(f"{tmp}/mc.err").read()
        base = ["127.0.0.1", port, 60000, 1024]
        for phase in (["load"] + base, ["closed"] + base + [5, 95, 0.99, 4, 16, 2],
                      ["verify"] + base + [1]):
            _, err = mcload(phase, 600)
            assert err is None, err
        return "verified"
    finally:
        mc.terminate()
        mc.wait(timeout=30)


def cell(gleaner, program):
    with tempfile.TemporaryDirectory() as tmp:
        node, addr = memnode(gleaner, tmp)
        poll = Poller(gleaner, addr, tmp)
        poll.start()
        try:
            t0 = time.monotonic()
            check = {"demo": run_demo, "memcached": run_memcached}[program](gleaner, addr, tmp)
            wall = time.monotonic() - t0
            poll.stop.set()
            poll.join()
            stats = json.load(open(f"{tmp}/stats.json"))
            total = stats.get("total", {})
            return {"program": program, "wall_s": round(wall, 2), "check": check,
                    "memnode_peak_bytes": poll.peak, "memnode_end_bytes": poll.last,
                    "far_pages_at_end": total.get("remote_pages"),
                    "copies_dropped": (total.get("store") or {}).get("copies_dropped"),
                    "dirty_tracking": stats.get("dirty_tracking")}
        finally:
            poll.stop.set()
            node.kill()
            node.wait()


def main():
    out = sys.argv[1]
    builds = dict(a.split("=", 1) for a in sys.argv[2:])
    reps = int(os.environ.get("REPS", "2"))
    cells = []
    for rep in range(reps):
        for program in ("demo", "memcached"):
            for name, gleaner in builds.items():
                c = cell(gleaner, program)
                c.update(build=name, rep=rep)
                print(json.dumps(c), flush=True)
                cells.append(c)
    json.dump({"command": " ".join(["python3"] + sys.argv), "reps": reps, "builds": builds,
               "cells": cells}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
