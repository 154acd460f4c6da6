"""The workloads. Each one runs its program under a Launch (see systems.py) and returns a record:

    {"ok": bool, "error": str|None, "metrics": {...}, "peak_rss_bytes": int, "usage": {...},
     "command": "...", "verified": "..."}

`metrics` always holds `throughput` (higher is better; its unit in `throughput_unit`) and
`seconds`; workloads with requests add `p50_us`, `p99_us`, `p999_us`.
"""

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time

from .common import (BUILD, GLEANER, JOBS, Child, fmt_cmd, free_port, last_json_line, log, python_exe,
                     run_capture, vm_hwm, wait_port)

MCLOAD = os.path.join(BUILD, "mcload")


def _tail(path, n=1500):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


class Workload:
    name = "?"
    description = ""
    throughput_unit = ""
    has_latency = False
    systems = ["all-local", "gleaner", "gleaner-memnode", "linux-swap"]
    ratios = [100, 75, 50, 25]
    metric_keys = ["throughput", "seconds"]

    def __init__(self, quick, pin=False):
        self.quick = quick
        self.baseline = None      # the all-local record, for output checks and timeouts
        # Servers only: the server pinned to CPU 0 and its clients to CPU 1, under every system
        # alike (`--pin`), so that no system gains from where the scheduler happens to put them.
        self.pin = pin and (os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None

    def pinned(self, role):
        """`taskset` prefix for the server (`"server"`, CPU 0) or a client (CPU 1) when pinned."""
        if not self.pin:
            return []
        return ["taskset", "-c", "0" if role == "server" else "1"]

    def run_params(self):
        """params() plus how the run was placed, as recorded in the results."""
        p = dict(self.params())
        if self.pin:
            p["pinned"] = "server on CPU 0, clients on CPU 1 (taskset), every system alike"
        return p

    def params(self):
        return {}

    def timeout(self):
        """Watchdog for one run: generous against the all-local time, bounded."""
        if self.baseline and self.baseline.get("ok"):
            base = self.baseline["metrics"]["seconds"]
            return min(600, 60 + 15 * base) if not self.quick else min(240, 60 + 15 * base)
        return 600 if not self.quick else 240


# ---- batch jobs ----------------------------------------------------------------------------


class BatchJob(Workload):
    throughput_unit = "jobs/hour"

    def job_cmd(self):
        raise NotImplementedError

    def check(self, out):
        """Compares the job's output with the all-local run's; returns an error or None."""
        return None

    def run(self, launch, tmp):
        cmd = launch.wrap(self.job_cmd())
        errf = os.path.join(tmp, "stderr.txt")
        outf = os.path.join(tmp, "stdout.txt")
        launch.begin()
        with open(outf, "w") as so, open(errf, "w") as se:
            child = Child(cmd, env=launch.env, preexec=launch.preexec, stdout=so, stderr=se,
                          timeout=self.timeout(), name=self.name)
            rc = child.wait()
        rec = {"command": fmt_cmd(cmd, launch.env), "exit_status": rc, "usage": child.usage(),
               "wall_s": round(child.elapsed, 3)}
        out = last_json_line(_tail(outf, 100000))
        if child.timed_out:
            rec.update(ok=False, error=f"timed out after {self.timeout():.0f} s (watchdog); stderr: {_tail(errf)}")
            return rec
        if rc != 0 or out is None:
            rec.update(ok=False, error=f"exit status {rc}; stderr: {_tail(errf)}")
            return rec
        rec["output"] = out
        rec["peak_rss_bytes"] = out.get("peak_rss_bytes")
        err = self.check(out) if self.baseline else None
        rec["verified"] = "output matches all-local" if (self.baseline and not err) else (
            "reference run" if not self.baseline else None)
        if err:
            rec.update(ok=False, error=f"wrong result: {err}")
        else:
            rec.update(ok=True, error=None)
        rec["metrics"] = {"seconds": round(child.elapsed, 3), "throughput": round(3600.0 / child.elapsed, 2)}
        return rec


class XGBoost(BatchJob):
    name = "xgboost"
    description = ("XGBoost training (hist, depth 8, 2 threads) on synthetic float32 data, python "
                   "under the launcher; metric: jobs/hour = 3600 / wall time of the whole job")

    def params(self):
        return ({"rows": 150000, "cols": 24, "rounds": 10} if self.quick
                else {"rows": 800000, "cols": 40, "rounds": 20})

    def job_cmd(self):
        p = self.params()
        return [python_exe(), os.path.join(JOBS, "xgb_job.py"), p["rows"], p["cols"], p["rounds"]]

    def check(self, out):
        ref = self.baseline["output"]["checksum"]
        if abs(out["checksum"] - ref) > 1e-3 * max(1.0, abs(ref)):
            return f"prediction checksum {out['checksum']} != all-local {ref}"
        return None


class PageRank(BatchJob):
    name = "pagerank"
    description = ("PageRank (numpy, edges streamed in 4M-edge chunks) on a synthetic power-law "
                   "graph; metric: jobs/hour = 3600 / wall time of the whole job")

    def params(self):
        return ({"nodes": 200000, "edges": 3000000, "iterations": 5} if self.quick
                else {"nodes": 2000000, "edges": 25000000, "iterations": 8})

    def job_cmd(self):
        p = self.params()
        return [python_exe(), os.path.join(JOBS, "pagerank_job.py"), p["nodes"], p["edges"], p["iterations"]]

    def check(self, out):
        ref = self.baseline["output"]
        if out["top10"] != ref["top10"] or abs(out["checksum"] - ref["checksum"]) > 1e-6 \
                or abs(out["top10_rank_sum"] - ref["top10_rank_sum"]) > 1e-9:
            return f"ranks differ from all-local (top10 {out['top10'][:3]}..., sum {out['checksum']})"
        return None


# ---- servers -------------------------------------------------------------------------------


class Server(Workload):
    has_latency = False
    binary = "?"

    def server_cmd(self, port, tmp):
        raise NotImplementedError

    def clients(self, port, rec):
        """Runs the clients against the server; fills rec['metrics'], returns an error or None."""
        raise NotImplementedError

    def far_faults_mark(self, rec):
        """Reads the run's far-fault count now (between phases, the server idle)."""
        far = getattr(self, "_far_faults", None)
        return far() if far else None

    def phase_far_faults(self, rec, phase, before, requests):
        """Records the far faults of one measured phase (`before`: the count at its start) and
        per 1,000 requests: gleaner's remote faults, or the cgroup's major faults under Linux
        swap, over the same phase. Returns the count at its end."""
        after = self.far_faults_mark(rec)
        if before is not None and after is not None and requests:
            rec.setdefault("phase_far_faults", {})[phase] = {
                "far_faults": after - before, "requests": requests,
                "per_1000_requests": round(1000 * (after - before) / requests, 1)}
        return after

    def run(self, launch, tmp):
        port = free_port()
        cmd = launch.wrap(self.server_cmd(port, tmp))
        errf = os.path.join(tmp, "server-stderr.txt")
        launch.begin()
        se = open(errf, "w")
        child = Child(cmd, env=launch.env, preexec=launch.preexec, stdout=subprocess.DEVNULL, stderr=se,
                      timeout=self.timeout() + 120, name=self.name)
        rec = {"command": fmt_cmd(cmd, launch.env), "metrics": {}}
        err = None
        self._far_faults = lambda: launch.far_faults_now(child.pid, self.binary)
        try:
            if not wait_port(port, child.proc, timeout=60):
                err = f"server did not start listening on {port}"
            else:
                t0 = time.monotonic()
                err = self.clients(port, rec)
                rec["metrics"]["seconds"] = round(time.monotonic() - t0, 3)
                pid = launch.program_pid(child.pid, self.binary)
                rec["peak_rss_bytes"] = vm_hwm(pid) if pid else None
        finally:
            alive = child.poll() is None
            child.stop(signal.SIGTERM, grace=30)
            se.close()
        rec["exit_status"] = child.rc
        rec["usage"] = child.usage()
        rec["wall_s"] = round(child.elapsed, 3)
        if not alive and err is None:
            err = f"server exited during the run (status {child.rc})"
        if child.timed_out and err is None:
            err = "watchdog fired"
        if err:
            rec.update(ok=False, error=f"{err}; server stderr: {_tail(errf)}")
        else:
            rec.update(ok=True, error=None)
        return rec


class Memcached(Server):
    name = "memcached"
    binary = "memcached"
    has_latency = True
    throughput_unit = "requests/s"
    metric_keys = ["throughput", "seconds", "open_throughput", "p50_us", "p99_us", "p999_us"]
    description = ("memcached (2 threads), keys preloaded, then an open-loop phase at a fixed "
                   "offered rate (latency from each request's scheduled send time; p50/p99/p99.9) "
                   "and a closed-loop phase for maximum throughput (metric: requests/s); Zipf "
                   "s=0.99 key popularity, 95% GET; every GET answer is checked byte for byte, "
                   "and a 1/7 sample of all keys is read back and checked at the end")

    def params(self):
        if self.quick:
            return {"keys": 80000, "value_size": 1024, "rate": 5000, "open_s": 3, "closed_s": 2,
                    "conns": 4, "depth": 16, "get_pct": 95, "zipf_s": 0.99}
        # The closed phase runs 20 s: far faults per request move by up to a third from one 5 s
        # window to the next (under either system), and a fixed-length phase lets the faster
        # system reach further past the first windows, so one 5 s window compared two systems at
        # different points of their warm-up (bench/results/access-scan/steady/README.md).
        return {"keys": 300000, "value_size": 1024, "rate": 20000, "open_s": 10, "closed_s": 20,
                "conns": 4, "depth": 16, "get_pct": 95, "zipf_s": 0.99}

    def timeout(self):
        p = self.params()
        return 120 + 2 * (p["open_s"] + p["closed_s"]) + (p["keys"] // 2000)

    def server_cmd(self, port, tmp):
        p = self.params()
        mb = int(p["keys"] * (p["value_size"] + 100) * 1.3 / (1 << 20)) + 64
        return self.pinned("server") + [shutil.which("memcached") or "memcached", "-p", port, "-U", "0", "-l", "127.0.0.1",
                "-m", mb, "-t", "2", "-c", "1024", "-u", "root"]

    def _mc(self, args, timeout):
        rc, out, err = run_capture(self.pinned("client") + [MCLOAD] + [str(a) for a in args], timeout)
        j = last_json_line(out)
        if j is None:
            return None, f"mcload {args[0]} failed ({rc}): {err.strip()[-500:]}"
        if rc != 0:
            return j, f"mcload {args[0]}: {j.get('mismatches')} wrong values, {j.get('errors')} errors: {err.strip()[-300:]}"
        return j, None

    def load_and_open(self, port, rec, p):
        """Preloads the keys, then runs the open-loop phase, its far faults counted. Returns the
        load generator's leading arguments, the far-fault count at the phase's end and an error
        (None when both phases went well)."""
        base = ["127.0.0.1", port, p["keys"], p["value_size"]]
        ph = rec.setdefault("phases", {})
        ph["load"], err = self._mc(["load"] + base, 300)
        if err:
            return base, None, err
        mark = self.far_faults_mark(rec)
        ph["open"], err = self._mc(["open"] + base + [p["rate"], p["open_s"], p["get_pct"], p["zipf_s"],
                                                     p["conns"], 1], p["open_s"] + 120)
        if err:
            return base, None, err
        return base, self.phase_far_faults(rec, "open", mark, ph["open"]["completed"]), None

    def clients(self, port, rec):
        p = self.params()
        base, mark, err = self.load_and_open(port, rec, p)
        if err:
            return err
        ph = rec["phases"]
        ph["closed"], err = self._mc(["closed"] + base + [p["closed_s"], p["get_pct"], p["zipf_s"],
                                                         p["conns"], p["depth"], 2], p["closed_s"] + 120)
        if err:
            return err
        self.phase_far_faults(rec, "closed", mark, ph["closed"]["completed"])
        ph["verify"], err = self._mc(["verify"] + base + [7], 300)
        if err:
            return err
        o, c, v = ph["open"], ph["closed"], ph["verify"]
        rec["metrics"].update({
            "throughput": c["throughput_rps"],
            "open_throughput": o["throughput_rps"],
            "offered_rps": p["rate"],
            "p50_us": o["latency_us"]["p50"], "p99_us": o["latency_us"]["p99"],
            "p999_us": o["latency_us"]["p999"], "max_us": o["latency_us"]["max"],
            "unanswered": o["unanswered"],
            "closed_p99_us": c["latency_us"]["p99"],
        })
        rec["verified"] = (f"{o['hits'] + c['hits'] + v['hits']} GET answers checked byte for byte, "
                           f"0 wrong; misses: {o['misses'] + c['misses'] + v['misses']}")
        if o["unanswered"]:
            # Overload, not an error: the offered rate exceeds what the server sustains, so the
            # backlog outlives the drain; p50/p99 are over the answered requests (a lower bound).
            rec["note"] = (f"overloaded: {o['unanswered']} of {o['sent']} open-loop requests unanswered "
                           "10 s after the last send; latency percentiles are over answered requests "
                           "(lower bounds)")
        if o["misses"] + c["misses"] + v["misses"]:
            return f"{o['misses'] + c['misses'] + v['misses']} GETs missed (keys lost)"
        return None


def _resp(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


class _RedisValues:
    def __init__(self, size):
        self.size = size
        self.block = random.Random(1234).randbytes(1 << 20)

    def __call__(self, k):
        off = (k * 4099) % (len(self.block) - self.size)
        return k.to_bytes(8, "little") + self.block[off:off + self.size - 8]


class Redis(Server):
    name = "redis"
    binary = "redis-server"
    has_latency = True
    throughput_unit = "GET requests/s"
    metric_keys = ["throughput", "seconds", "set_throughput", "p50_us", "p99_us"]
    description = ("redis-server (persistence off), keys preloaded and sampled back, then "
                   "`redis-benchmark -t get` (uniform random keys over the whole key space, 50 "
                   "clients; metric: GET requests/s, p50/p99 from redis-benchmark), a second "
                   "read-back check, then `redis-benchmark -t set`")

    def params(self):
        if self.quick:
            return {"keys": 60000, "value_size": 1024, "requests": 40000, "clients": 50}
        return {"keys": 300000, "value_size": 1024, "requests": 200000, "clients": 50}

    def timeout(self):
        return 400 if not self.quick else 200

    def server_cmd(self, port, tmp):
        return self.pinned("server") + [shutil.which("redis-server") or "redis-server", "--port", port,
                "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", tmp]

    def _preload(self, port, values, n):
        with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
            f = s.makefile("rb")
            for b in range(0, n, 256):
                e = min(n, b + 256)
                s.sendall(b"".join(_resp("SET", b"key:%012d" % i, values(i)) for i in range(b, e)))
                for _ in range(b, e):
                    line = f.readline()
                    if line != b"+OK\r\n":
                        return f"SET answered {line[:80]!r}"
        return None

    def _verify(self, port, values, n, stride):
        bad = checked = 0
        with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
            f = s.makefile("rb")
            keys = list(range(0, n, stride))
            for b in range(0, len(keys), 256):
                chunk = keys[b:b + 256]
                s.sendall(b"".join(_resp("GET", b"key:%012d" % i) for i in chunk))
                for i in chunk:
                    line = f.readline()
                    if not line:
                        raise RuntimeError(
                            f"redis closed the connection while key {i} of {n} was read back "
                            "(killed? under linux-swap, its cgroup's OOM killer)")
                    ln = int(line[1:])
                    data = f.read(ln + 2)[:-2] if ln >= 0 else None
                    checked += 1
                    bad += data != values(i)
        return checked, bad

    def _bench(self, port, test):
        p = self.params()
        cmd = self.pinned("client") + [shutil.which("redis-benchmark") or "redis-benchmark", "-h", "127.0.0.1", "-p", port,
               "-t", test, "-n", p["requests"], "-r", p["keys"], "-d", p["value_size"], "-c", p["clients"],
               "--csv", "--precision", "3"]
        rc, out, err = run_capture(cmd, self.timeout())
        rows = [ln.replace('"', "").split(",") for ln in out.strip().splitlines()]
        if rc != 0 or len(rows) < 2:
            return None, f"redis-benchmark -t {test} failed ({rc}): {err.strip()[-400:]}"
        hdr, vals = rows[0], rows[1]
        return dict(zip(hdr, vals)), None

    def clients(self, port, rec):
        p = self.params()
        values = _RedisValues(p["value_size"])
        ph = rec.setdefault("phases", {})
        t = time.monotonic()
        err = self._preload(port, values, p["keys"])
        ph["preload_s"] = round(time.monotonic() - t, 3)
        if err:
            return err
        checked, bad = self._verify(port, values, p["keys"], 7)
        if bad:
            return f"{bad} of {checked} values wrong after preload"
        mark = self.far_faults_mark(rec)
        g, err = self._bench(port, "get")
        if err:
            return err
        ph["get"] = g
        self.phase_far_faults(rec, "get", mark, p["requests"])
        checked2, bad = self._verify(port, values, p["keys"], 7)
        if bad:
            return f"{bad} of {checked2} values wrong after the GET benchmark"
        s, err = self._bench(port, "set")
        if err:
            return err
        ph["set"] = s
        rec["metrics"].update({
            "throughput": float(g["rps"]), "set_throughput": float(s["rps"]),
            "p50_us": round(float(g["p50_latency_ms"]) * 1000, 1),
            "p99_us": round(float(g["p99_latency_ms"]) * 1000, 1),
            "set_p99_us": round(float(s["p99_latency_ms"]) * 1000, 1),
        })
        rec["verified"] = f"{checked + checked2} values read back and compared, 0 wrong"
        return None


# ---- gleaner bench micro -------------------------------------------------------------------


class Micro(Workload):
    """`gleaner bench micro`: its all-local pass runs in the same process as the far-memory one, so
    the all-local record comes from the first far-memory run; there is no program to put in a
    cgroup, so no linux-swap."""
    throughput_unit = "accesses/s"
    systems = ["all-local", "gleaner", "gleaner-memnode"]
    ratios = [50, 25]

    def __init__(self, quick, pattern):
        super().__init__(quick)
        self.pattern = pattern
        self.name = "micro-" + pattern.replace(":", "")
        self.description = (f"`gleaner bench micro --pattern {pattern}`: a region written once then "
                            "read twice in the pattern, every word checked; all-local is the same "
                            "passes over ordinary memory in the same process")

    def params(self):
        return {"pattern": self.pattern, "size": "64M" if self.quick else "256M"}

    def footprint(self):
        from .common import parse_size
        return parse_size(self.params()["size"])

    def run_micro(self, ratio, memnode, tmp):
        p = self.params()
        cmd = [GLEANER, "bench", "micro", "--pattern", p["pattern"], "--size", p["size"],
               "--local", f"{ratio}%", "--floor-samples", "0", "--json"]
        if memnode:
            cmd += ["--memnode", memnode.addr, "--token-file", memnode.token]
        outf, errf = os.path.join(tmp, "out.json"), os.path.join(tmp, "err.txt")
        mn_cpu = memnode.cpu_s() if memnode else 0.0
        with open(outf, "w") as so, open(errf, "w") as se:
            child = Child(cmd, stdout=so, stderr=se, timeout=self.timeout(), name="gleaner-micro")
            rc = child.wait()
        rec = {"command": fmt_cmd(cmd), "exit_status": rc, "usage": child.usage(), "wall_s": round(child.elapsed, 3)}
        try:
            with open(outf) as f:
                out = json.load(f)
        except (OSError, ValueError):
            out = None
        if rc != 0 or out is None:
            rec.update(ok=False, error=f"exit status {rc}{' (watchdog)' if child.timed_out else ''}; stderr: {_tail(errf)}")
            return rec, None
        if memnode:
            rec["memnode_cpu_s"] = round(memnode.cpu_s() - mn_cpu, 3)
        reg = out.get("region", {})
        flt, ev = reg.get("faults", {}), reg.get("evictions", {})
        rec["gleaner"] = {"remote_faults": flt.get("remote"), "zero_fill_faults": flt.get("zero_fill"),
                          "evicted_clean": ev.get("clean"), "evicted_dirty": ev.get("dirty"),
                          "bytes_in": reg.get("bytes_in"), "bytes_out": reg.get("bytes_out"),
                          "remote_fault_p50_us": (out.get("remote_fault_app_visible") or {}).get("p50_us"),
                          "remote_fault_p99_us": (out.get("remote_fault_app_visible") or {}).get("p99_us")}
        rec["far_faults"] = flt.get("remote")
        rec["bytes_moved"] = (reg.get("bytes_in") or 0) + (reg.get("bytes_out") or 0)
        rec["output"] = {k: v for k, v in out.items() if not isinstance(v, dict)}
        ok = bool(out.get("checksum_ok"))
        rec.update(ok=ok, error=None if ok else "checksum mismatch: a word read back differs from what was written")
        rec["verified"] = "every word read checked (checksum_ok)" if ok else None
        ns = out["ns_per_op"]
        rec["metrics"] = {"seconds": round(child.elapsed, 3), "throughput": round(1e9 / ns, 1), "ns_per_op": round(ns, 1)}
        local = {"ok": True, "error": None, "command": fmt_cmd(cmd) + "  (its all-local pass)",
                 "metrics": {"seconds": None, "throughput": round(1e9 / out["ns_per_op_all_local"], 1),
                             "ns_per_op": round(out["ns_per_op_all_local"], 1)},
                 "far_faults": 0, "bytes_moved": 0, "verified": "same process, checksum_ok"}
        return rec, local


def all_workloads(quick, only=None, pin=False):
    """The workloads to run; `pin` places servers and their clients on fixed CPUs (see
    Workload.pinned)."""
    ws = [Memcached(quick, pin), Redis(quick, pin), XGBoost(quick), PageRank(quick)]
    ws += [Micro(quick, p) for p in (["seq", "random"] if quick else ["seq", "stride:10", "random"])]
    if only:
        names = set(only)
        ws = [w for w in ws if w.name in names or (w.name.startswith("micro") and "micro" in names)]
    return ws
