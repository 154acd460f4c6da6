#!/usr/bin/env python3
"""Many programs, one memnode link (issue 13): memcached beside two batch jobs on one memnode
whose link is capped (each way), with the link served first come first served (`--schedule
fifo`) or in fair order by tenant with demand before prefetch (`--schedule fair`, the default),
against each program alone on the same kind of memnode. Same run, reps interleaved.

    python3 bench/corun.py                 # 2 reps, then render
    python3 bench/corun.py --reps 1 --quick
    python3 bench/corun.py --render-only

Every cell starts a fresh `gleaner memnode --bandwidth B --schedule S` on TCP loopback (at nice
-20 by default: it stands for another host, so the programs here must not delay its replies)
with three tenants of weight 1 (memcached, batch1, batch2: each program has its own token,
quota and queue) and runs, each under `gleaner run` at about a quarter of its footprint local:

* memcached (`-t 2`), its keys loaded, then an open-loop phase at a fixed rate (95% GET,
  Zipf 0.99; latency from each request's scheduled send time): its p99 and the bytes it moved;
* the demo job (`scripts/demo_job.py`) twice, as two batch programs: their wall time and bytes.

"solo" cells run one program alone; the "corun" cell starts memcached's open-loop phase and both
batch jobs together, and ends the phase when both batch jobs have finished a run and at least
`open_s` has passed (as long as alone): a batch job done sooner starts again (its record is its
first run), so memcached has co-runners for its whole phase under every system, and reads every key
back only after it (that bulk read at memcached's weight is not the co-run's load). Reported per
schedule: each program's slowdown (memcached: co-run p99 over solo p99; batch: co-run wall time
over solo), their mean, max and standard deviation, and WMMR (Canvas: min over programs of co-run
bandwidth / solo bandwidth, divided by the max; memcached's bandwidth: what its open-loop phase
moved, over its length).

Linux swap is the third system (`--systems` picks; all three by default): the same programs
with no gleaner, each in its own memory cgroup limited to its gleaner budget plus the program's
own resident size when idle (measured first: the interpreter or the server before any key, which
gleaner's budget does not count), memcached to twice its budget plus that (see `linux_limits`),
all swapping to one zram device made fresh for the cell. zram
has no link to cap: the co-run shares the CPUs, the zram device and the kernel's reclaim. Its
bandwidth for WMMR is the cgroup's major faults × 4 KiB per second (cgroup v1 counts no
swap-outs per cgroup).

Writes bench/results/corun.json and the co-run section of bench/results/DETAILS.md. Exit status
0, or 1 if a cell failed (a wrong value, a lost key, a checksum mismatch, a program that failed).
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
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from bench.doc_section import DOC, write_section  # noqa: E402
from bench.harness import swapenv  # noqa: E402
from bench.harness.__main__ import ensure_built  # noqa: E402
from bench.harness.common import (free_port, git_commit, machine, now_iso, parse_size,  # noqa: E402
                                  python_exe, wait_port)
from bench.harness.workloads import MCLOAD  # noqa: E402
from bench.pool import _checksum, mcload, mcload_result, read_json, stop_server  # noqa: E402
from bench.vs_swap import _med, _remove_cgroup, _write, run_or_render  # noqa: E402

# For A/B runs of two builds: GLEANER_CORUN_BIN=DIR/gleaner (its preload library beside it).
GLEANER = os.environ.get("GLEANER_CORUN_BIN") or os.path.join(ROOT, "target", "release", "gleaner")
DEMO_JOB = os.path.join(ROOT, "scripts", "demo_job.py")
BEGIN, END = "<!-- corun:begin -->", "<!-- corun:end -->"
SCHEDULES = ("fifo", "fair")
# The memnode's nice value by default (--memnode-nice).
MEMNODE_NICE = -20

# The systems compared: gleaner's memnode under each schedule, and Linux swap.
SYSTEMS = SCHEDULES + ("linux-swap",)
PAGE = 4096
PROGRAMS = ("memcached", "batch1", "batch2")


def log(msg):
    print(f"[corun] {msg}", file=sys.stderr, flush=True)


def tree_cpu_s(pid):
    """CPU seconds (user + system) process `pid` and its live descendants have used so far,
    every thread included (their pagers' threads too), from /proc; None if `pid` is gone."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, IndexError, ValueError):
            if p == pid:
                return None
    return total / tick


def wait_measured(proc, timeout):
    """Waits for `proc` (a Popen with text pipes) as `communicate` does, and returns (stdout,
    stderr, cpu_s): cpu_s is the CPU time (user + system) of the process and of every
    descendant it waited for (wait4's resource usage: `gleaner run` waits for its program).
    Past `timeout` seconds the process is killed and TimeoutExpired raised."""
    got = {}

    def drain(name, f):
        got[name] = f.read() if f else ""

    readers = [threading.Thread(target=drain, args=(n, f), daemon=True)
               for n, f in (("out", proc.stdout), ("err", proc.stderr))]
    for r in readers:
        r.start()
    lock, state = threading.Lock(), {"reaped": False, "killed": False}

    def expire():
        with lock:
            if not state["reaped"]:
                state["killed"] = True
                proc.kill()

    timer = threading.Timer(timeout, expire)
    timer.start()
    _, status, usage = os.wait4(proc.pid, 0)
    with lock:
        state["reaped"] = True
    timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    for r in readers:
        r.join()
    if state["killed"]:
        raise subprocess.TimeoutExpired(proc.args, timeout)
    return got.get("out", ""), got.get("err", ""), round(usage.ru_utime + usage.ru_stime, 3)


def mcload_measured(args, timeout):
    """`mcload` as `bench.pool.mcload` runs it, with the load generator's own CPU seconds: its
    JSON, its error and its CPU."""
    proc = subprocess.Popen([MCLOAD] + [str(a) for a in args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err, cpu = wait_measured(proc, timeout)
    j, error = mcload_result(args[0], proc.returncode, out, err)
    return j, error, cpu


class Memnode:
    """One memnode with a capped link and a tenant per program, killed on exit."""

    def __init__(self, tmp, p, schedule):
        self.tokens = {t: os.path.join(tmp, f"{t}.token") for t in PROGRAMS}
        # A memnode stands for another host: `nice` keeps the programs beside it on this one
        # from delaying its replies (see --memnode-nice).
        nice = p.get("memnode_nice", 0)
        args = (["nice", "-n", str(nice)] if nice else []) + [
            GLEANER, "memnode", "--listen", "127.0.0.1:0", "--capacity", "2G", "--token-file",
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

    def cpu_s(self):
        """CPU seconds (user + system) the memnode has used so far: on this host it takes its
        CPU from the programs, where a memnode of its own would not."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)
        except (OSError, IndexError, ValueError):
            return None


class GleanerLaunch:
    """Programs under `gleaner run` on the cell's memnode, each as its own tenant."""

    def __init__(self, node):
        self.node = node

    def prefix(self, name, local, stats):
        # For experiments: GLEANER_CORUN_ARGS="--compress zstd" adds flags to every `gleaner run`.
        extra = os.environ.get("GLEANER_CORUN_ARGS", "").split()
        return [GLEANER, "run", "--local-mem", local, "--memnode", self.node.addr, "--token-file",
                self.node.tokens[name], "--stats", stats] + extra + ["--"]

    def preexec(self, name):
        return None

    def moved(self, name, stats):
        return _moved(read_json(stats))

    def memnode_cpu_s(self):
        """The memnode's CPU seconds so far."""
        return self.node.cpu_s()

    def moved_so_far(self, name, tmp):
        """Bytes program `name` has moved over the link so far (its tenant's queues)."""
        q = (self.queues(tmp) or {}).get(name) or {}
        return q.get("total", {}).get("bytes")

    def lanes_so_far(self, name, tmp):
        """Bytes program `name` has moved so far on each lane of the link, [read, write-back]."""
        q = (self.queues(tmp) or {}).get(name) or {}
        return lane_bytes(q)

    def queues(self, tmp):
        stats = subprocess.run([GLEANER, "memnode", "stats", "--addr", self.node.addr, "--token-file",
                                os.path.join(tmp, "main.token")], capture_output=True, text=True)
        try:
            return {t["name"]: t.get("queue") for t in json.loads(stats.stdout)["tenants"]}
        except (ValueError, KeyError):
            return None


class LinuxLaunch:
    """Programs as they are, each in its own memory cgroup, all swapping to one zram device."""

    def __init__(self, state, p):
        self.state, self.groups = state, {}
        for name in PROGRAMS:
            self.groups[name] = swapenv.Cgroup(state, f"corun-{name}", p["linux_limits"][name])

    def prefix(self, name, local, stats):
        return []

    def preexec(self, name):
        return self.groups[name].preexec()

    def moved(self, name, stats):
        return (self.groups[name].stats().get("pgmajfault") or 0) * PAGE

    def moved_so_far(self, name, tmp):
        """Bytes program `name` has swapped in so far (its cgroup's major faults)."""
        return self.moved(name, None)

    def memnode_cpu_s(self):
        """No memnode: zram's work is in the programs' own CPU time."""
        return None

    def lanes_so_far(self, name, tmp):
        """No link."""
        return None

    def cgroups(self):
        return {n: g.stats() for n, g in self.groups.items()}

    def queues(self, tmp):
        return None

    def close(self):
        for g in self.groups.values():
            _remove_cgroup(self.state, g)


def linux_limits(p):
    """Each program's cgroup limit under Linux swap: its gleaner budget plus its idle resident
    size, but twice the budget for memcached. At budget + idle size (20.5 MiB) the cgroup-v1 OOM
    killer stopped memcached loading its 60,000 keys in 11 of 11 tries on the 2-vCPU VM (its
    anonymous pages refault faster than reclaim frees them; with swappiness 100, in 3 of 4); at
    twice the budget it loaded them in 3 of 3, at 28 MiB in 2 of 2 (2026-11-26)."""
    return {"memcached": 2 * parse_size(p["mc_local"]) + p["mc_baseline"],
            "batch1": parse_size(p["batch_local"]) + p["demo_baseline"],
            "batch2": parse_size(p["batch_local"]) + p["demo_baseline"]}


def _rss_kib(cmd, **kw):
    """The peak resident size of `cmd` (KiB), run to its end."""
    probe = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
             "stdout=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([python_exe(), "-c", probe] + cmd, capture_output=True, text=True,
                         timeout=120, **kw)
    return int(out.stdout.strip())


def baselines():
    """What each program holds before its data (bytes): the demo job's interpreter (the job with
    no objects) and memcached started with no keys. The cgroups get them on top of the budget."""
    demo = _rss_kib([python_exe(), DEMO_JOB, "0"]) * 1024
    port = free_port()
    mc = subprocess.Popen([shutil.which("memcached") or "memcached", "-p", str(port), "-U", "0", "-l",
                           "127.0.0.1", "-m", "64", "-t", "2", "-c", "1024", "-u", "root"])
    try:
        if not wait_port(port, mc, timeout=30):
            raise RuntimeError("memcached did not start listening")
        with open(f"/proc/{mc.pid}/status") as f:
            rss = [int(line.split()[1]) for line in f if line.startswith("VmRSS:")][0] * 1024
    finally:
        mc.kill()
        mc.wait()
    return demo, rss


def lane_bytes(queue):
    """A tenant's bytes by lane of the link, [read (demand and prefetch), write-back], from its
    queue stats; None if it has none."""
    classes = (queue or {}).get("classes")
    if not classes:
        return None
    got = lambda c: (classes.get(c) or {}).get("bytes") or 0  # noqa: E731
    return [got("demand") + got("prefetch"), got("writeback")]


def fault_summary(stats):
    """A gleaner program's far faults from its stats file: how many, their mean and p99 service
    time (the handler's view), the mean of each step (lookup: claim, charge and direct reclaim;
    fetch: request to reply; install), weighted over its processes, and the time its faults
    spent reclaiming directly; None without a stats file or far faults."""
    t = (stats or {}).get("total") or {}
    lat = t.get("remote_fault_latency") or {}
    if not lat.get("count"):
        return None
    steps, timed = {}, 0
    for proc in stats.get("processes") or []:
        fb = (proc.get("stats") or {}).get("fault_breakdown") or {}
        k = fb.get("timed_faults") or 0
        if not k:
            continue
        timed += k
        for step in ("lookup", "fetch", "install"):
            steps[step] = steps.get(step, 0.0) + (fb.get(f"{step}_mean_us") or 0.0) * k
    out = {"remote_faults": lat["count"], "mean_us": lat.get("mean_us"), "p99_us": lat.get("p99_us"),
           "direct_reclaim_ms": round(((t.get("reclaim") or {}).get("direct_ns") or 0) / 1e6, 1)}
    if timed:
        out.update({f"{step}_mean_us": round(v / timed, 1) for step, v in steps.items()})
    return out


def _moved(stats):
    t = (stats or {}).get("total", {})
    return (t.get("bytes_in") or 0) + (t.get("bytes_out") or 0)


class Batch(threading.Thread):
    """A demo job as program `name`, launched by `launch`. Its record is its first run's. With
    `again` (an event), it is started again each time it exits until the event is set, and the
    run going on then is killed: a co-runner for as long as memcached's phase lasts."""

    def __init__(self, launch, name, p, tmp, want, again=None):
        super().__init__(daemon=True)
        self.stats = os.path.join(tmp, f"{name}.json")
        self.launch = launch
        nice = ["nice", "-n", str(p["batch_nice"])] if p.get("batch_nice") else []
        self.cmd = nice + launch.prefix(name, p["batch_local"], self.stats) + [
            python_exe(), DEMO_JOB, str(p["demo_n"])]
        self.again_cmd = nice + launch.prefix(name, p["batch_local"], os.path.join(tmp, f"{name}-again.json")) + [
            python_exe(), DEMO_JOB, str(p["demo_n"])]
        self.name, self.want, self.rec = name, want, {}
        self.again, self.first_done, self.runs = again, threading.Event(), 0

    def run(self):
        try:
            t0 = time.monotonic()
            proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    preexec_fn=self.launch.preexec(self.name))
            out, err, cpu = wait_measured(proc, 1800)
            wall = time.monotonic() - t0
            ok = proc.returncode == 0 and _checksum(out) == self.want
            # cpu_s: the whole run's CPU, its pager's threads (and `gleaner run`) included.
            self.rec = {"ok": ok, "wall_s": round(wall, 3), "cpu_s": cpu,
                        "bytes": self.launch.moved(self.name, self.stats),
                        "faults": fault_summary(read_json(self.stats)),
                        "error": None if ok else f"exit {proc.returncode}: {err[-600:]}"}
        finally:
            self.runs = 1
            self.first_done.set()
        while self.again is not None and not self.again.is_set():
            proc = subprocess.Popen(self.again_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    preexec_fn=self.launch.preexec(self.name), start_new_session=True)
            while proc.poll() is None and not self.again.wait(0.05):
                pass
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            else:
                self.runs += 1
        self.rec["runs"] = self.runs


def memcached(launch, p, tmp, during=None):
    """memcached launched by `launch`: load, then an open-loop phase (beside `during`, the batch
    jobs and the event that stops them starting again: `_open_while`), then every key read
    back."""
    port = free_port()
    stats_path = os.path.join(tmp, "memcached.json")
    mb = int(p["keys"] * (p["vsize"] + 100) * 1.3 / (1 << 20)) + 64
    cmd = launch.prefix("memcached", p["mc_local"], stats_path) + [
        shutil.which("memcached") or "memcached", "-p", str(port), "-U", "0", "-l", "127.0.0.1",
        "-m", str(mb), "-t", "2", "-c", "1024", "-u", "root"]
    errf = open(os.path.join(tmp, "memcached.err"), "w")
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf,
                              preexec_fn=launch.preexec("memcached"))
    rec, err = {}, None
    try:
        if not wait_port(port, server, timeout=60):
            raise RuntimeError("memcached did not start listening")
        base = ["127.0.0.1", port, p["keys"], p["vsize"]]
        _, err = mcload(["load"] + base, 900)
        if not err:
            before = launch.moved_so_far("memcached", tmp)
            lanes_before = launch.lanes_so_far("memcached", tmp)
            cpu_before = launch.memnode_cpu_s()
            server_before = tree_cpu_s(server.pid)
            t0 = time.monotonic()
            if during:
                phase, err, load_cpu = _open_while(base, p, *during)
            else:
                phase, err, load_cpu = mcload_measured(
                    ["open"] + base + [p["rate"], p["open_s"], 95, 0.99, 4, 1], p["open_s"] + 300)
            rec["open_s"] = round(time.monotonic() - t0, 3)
            cpu_after = launch.memnode_cpu_s()
            server_after = tree_cpu_s(server.pid)
            if cpu_before is not None and cpu_after is not None:
                # The memnode's CPU during the phase (the gleaner systems' only).
                rec["memnode_cpu_open_s"] = round(cpu_after - cpu_before, 2)
            if server_before is not None and server_after is not None:
                # memcached's CPU during the phase, its pager's threads included, and its load
                # generator's: what it takes of this host's CPUs beside the batch jobs.
                rec["cpu_open_s"] = round(server_after - server_before, 2)
                rec["load_cpu_open_s"] = load_cpu
            after = launch.moved_so_far("memcached", tmp)
            if before is not None and after is not None:
                # What the open-loop phase moved: its bandwidth, solo and co-run alike.
                rec["open_bytes"] = after - before
            lanes_after = launch.lanes_so_far("memcached", tmp)
            if lanes_before is not None and lanes_after is not None:
                # The same by lane: [read, write-back] bytes.
                rec["open_lane_bytes"] = [a - b for a, b in zip(lanes_after, lanes_before)]
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
    rec["bytes"] = launch.moved("memcached", stats_path)
    # The whole run's far faults (loading and reading back included, not only the open phase).
    rec["faults"] = fault_summary(read_json(stats_path))
    rec["ok"] = err is None
    rec["error"] = err
    return rec


def _open_while(base, p, batches, again):
    """memcached's open-loop phase beside the batch jobs: they start with it, and it lasts until
    the last of them has finished its first run, and at least as long as alone (`open_s`); a
    batch job done sooner starts again, so that memcached has co-runners for its whole phase.
    Every key is read back only after the phase, so the read-back, a bulk read at memcached's
    weight, is not charged to the batch jobs. Returns the phase's JSON, its error and the load
    generator's CPU seconds."""
    args = base + [p["rate"], 3600, 95, 0.99, 4, 1]
    load = subprocess.Popen([MCLOAD, "open"] + [str(a) for a in args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    for t in batches:
        t.start()
    for t in batches:
        t.first_done.wait()
    time.sleep(max(0.0, p["open_s"] - (time.monotonic() - t0)))
    load.send_signal(signal.SIGUSR1)
    again.set()
    for t in batches:
        t.join()
    try:
        out, errs, cpu = wait_measured(load, 300)
    except subprocess.TimeoutExpired:
        return None, "mcload open: no result 300 s after the phase ended", None
    phase, err = mcload_result("open", load.returncode, out, errs)
    return phase, err, cpu


def programs(kind, launch, p, tmp, want):
    """Runs a cell's programs; returns their records by name."""
    out = {}
    if kind == "solo-memcached":
        out["memcached"] = memcached(launch, p, tmp)
    elif kind == "solo-batch":
        b = Batch(launch, "batch1", p, tmp, want)
        b.run()
        out["batch1"] = b.rec
    else:
        again = threading.Event()
        batches = [Batch(launch, n, p, tmp, want, again) for n in ("batch1", "batch2")]
        out["memcached"] = memcached(launch, p, tmp, during=(batches, again))
        for b in batches:
            if b.ident is None:
                # memcached failed before its open phase, which starts the batch jobs.
                b.rec = {"ok": False, "error": "not started: memcached failed before its open phase"}
            else:
                b.join()
            out[b.name] = b.rec
    return out


def cell(kind, system, p, want, rep, state, keep=None):
    # Records name the system "schedule" (the results' key since before Linux swap was added).
    rec = {"kind": kind, "schedule": system, "rep": rep, "programs": {}}
    with tempfile.TemporaryDirectory(prefix="gleaner-corun-") as tmp:
        if system == "linux-swap":
            with swapenv.swap_environment(2 << 30, state=state) as (_, zinfo):
                launch = LinuxLaunch(state, p)
                try:
                    rec["programs"] = programs(kind, launch, p, tmp, want)
                    rec["cgroups"] = launch.cgroups()
                finally:
                    launch.close()
                rec["zram"] = swapenv.zram_stats(zinfo["device"])
            for name, cg in rec["cgroups"].items():
                prog = rec["programs"].get(name)
                if prog and cg.get("oom_kills"):
                    prog["ok"] = False
                    prog["error"] = f"OOM-killed in its cgroup; {prog.get('error')}"
        else:
            with Memnode(tmp, p, system) as node:
                launch = GleanerLaunch(node)
                t0 = time.monotonic()
                rec["programs"] = programs(kind, launch, p, tmp, want)
                rec["queues"] = launch.queues(tmp)
                rec["memnode_cpu_s"] = node.cpu_s()
                rec["memnode_wall_s"] = round(time.monotonic() - t0, 2)
            if keep:
                # Each program's whole `gleaner run` stats file, for a closer look.
                os.makedirs(keep, exist_ok=True)
                for name in rec["programs"]:
                    src = os.path.join(tmp, f"{name}.json")
                    if os.path.exists(src):
                        shutil.copy(src, os.path.join(keep, f"{system}-{kind}-rep{rep + 1}-{name}.json"))
    rec["ok"] = all(x.get("ok") for x in rec["programs"].values())
    return rec


def run_all(args):
    quick = args.quick
    p = {"bandwidth": args.bandwidth, "keys": 30000 if quick else 60000, "vsize": 1024, "rate": args.rate,
         "open_s": 4 if quick else 8, "mc_local": "16M", "demo_n": 15000 if quick else 30000,
         "batch_local": "16M", "mc_weight": args.mc_weight, "memnode_nice": args.memnode_nice,
         "batch_nice": args.batch_nice}
    reps = args.reps or 2
    systems = [s for s in args.systems.split(",") if s]
    bad = [s for s in systems if s not in SYSTEMS]
    if bad:
        sys.exit(f"corun.py: unknown system {', '.join(bad)}: choose from {', '.join(SYSTEMS)}")
    ensure_built()
    if "linux-swap" in systems:
        why = swapenv.unavailable_reason()
        if why:
            sys.exit(f"corun.py: Linux swap cannot be measured here ({why}); pass --systems fifo,fair")
        p["demo_baseline"], p["mc_baseline"] = baselines()
        p["linux_limits"] = linux_limits(p)
    res = {"script": "bench/corun.py", "date": now_iso(), "git_commit": git_commit(),
           "machine": machine(), "reps": reps, "params": p, "systems": systems, "cells": [],
           "complete": False}
    if "linux-swap" in systems:
        res["linux_swap"] = swapenv.linux_swap_settings()
    want = _checksum(subprocess.run([python_exe(), DEMO_JOB, str(p["demo_n"])], capture_output=True,
                                    text=True, timeout=900).stdout)
    res["demo_local_checksum"] = want
    state = swapenv.State()
    try:
        for rep in range(reps):
            order = systems if rep % 2 == 0 else list(reversed(systems))
            for system in order:
                for kind in ("solo-memcached", "solo-batch", "corun"):
                    log(f"rep {rep + 1}: {system} {kind}")
                    rec = run_cell(lambda: cell(kind, system, p, want, rep, state, args.keep_stats),
                                   system)
                    log("  " + ", ".join(f"{n}: {x.get('p99_us') or x.get('wall_s')} {'ok' if x.get('ok') else x.get('error')}"
                                         for n, x in rec["programs"].items()))
                    res["cells"].append(rec)
                    _write(res, args.out)
    finally:
        errors = swapenv.teardown(state)
        if errors:
            log("teardown left errors: " + "; ".join(errors))
    res["complete"] = True
    _write(res, args.out)
    failed = [c for c in res["cells"] if not c["ok"]]
    return (1 if failed else 0), res


def run_cell(run, system):
    """Runs a cell (`run()`). The cgroup-v1 OOM killer fires now and then under heavy swap
    traffic (as in the harness): a Linux-swap cell it stopped is run again, up to twice, with the
    kills on record (`oom_killed_tries`)."""
    rec = run()
    tries = []
    while system == "linux-swap" and _oom_killed(rec) and len(tries) < 2:
        tries.append({n: x.get("error") for n, x in rec["programs"].items() if not x.get("ok")})
        log(f"  OOM-killed in its cgroup: running the cell again ({len(tries)} of 2)")
        rec = run()
    if tries:
        rec["oom_killed_tries"] = tries
    return rec


def _oom_killed(rec):
    return any("OOM-killed" in (x.get("error") or "") for x in rec["programs"].values())


def summarise(res, schedule):
    """Per program: solo and co-run medians, slowdown, bandwidth ratio; and the aggregates."""
    cells = [c for c in res["cells"] if c["schedule"] == schedule]

    def med(kind, prog, key):
        # A program's numbers count where it succeeded, even in a cell where another failed
        # (under Linux swap the OOM killer may stop memcached while the batch jobs finish).
        return _med([c["programs"][prog].get(key) for c in cells
                     if c["kind"] == kind and c["programs"].get(prog, {}).get("ok")])

    out = {}
    # memcached's bandwidth: what its open-loop phase moved, over its length (results from before
    # `open_bytes` was recorded: what the whole run moved, over the phase's length).
    mc_bytes = "open_bytes" if all("open_bytes" in c["programs"].get("memcached", {})
                                   for c in cells if c["kind"] != "solo-batch"
                                   and c["programs"].get("memcached", {}).get("ok")) else "bytes"
    solo_mc = (med("solo-memcached", "memcached", "p99_us"), med("solo-memcached", "memcached", mc_bytes),
               med("solo-memcached", "memcached", "open_s"))
    co_mc = (med("corun", "memcached", "p99_us"), med("corun", "memcached", mc_bytes),
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


def floors(res, system):
    """What no schedule of the link can beat on this host, from `system`'s solo cells (medians):
    lower bounds on the batch jobs' co-run slowdown, assuming that each program needs in the
    co-run the CPU and the link bytes it needed alone for the same work, and that they pack
    perfectly.

    * CPU: the two batch runs need twice a solo run's CPU (the run's own, its pager's included,
      and the memnode's for it), on the CPUs memcached's open phase leaves (its server, pager
      and load generator, and the memnode's work for it, per second alone). A memnode of its own
      host would take none of the programs' CPUs: the memnode's share is shown apart.
    * Link (gleaner's systems): on each lane, two batch runs' bytes over what memcached's open
      phase leaves of the cap.

    Each bound is a co-run time over the solo time (None where a number is missing). Also: the
    CPU a batch run took in the co-run over alone (the work contention adds)."""
    cells = [c for c in res["cells"] if c["schedule"] == system]
    ncpu = (res.get("machine") or {}).get("cpus")

    def med(kind, prog, f):
        return _med([f(c, c["programs"][prog]) for c in cells
                     if c["kind"] == kind and c["programs"].get(prog, {}).get("ok")])

    wall = med("solo-batch", "batch1", lambda c, x: x.get("wall_s"))
    cpu = med("solo-batch", "batch1", lambda c, x: x.get("cpu_s"))
    node = med("solo-batch", "batch1", lambda c, x: c.get("memnode_cpu_s")) or 0.0
    co_cpu = _med([v for c in cells if c["kind"] == "corun"
                   for n in ("batch1", "batch2")
                   for v in [c["programs"].get(n, {}).get("cpu_s")]
                   if c["programs"].get(n, {}).get("ok")])

    def mc_share(c, x):
        parts = (x.get("cpu_open_s"), x.get("load_cpu_open_s"))
        if None in parts or not x.get("open_s"):
            return None
        return (sum(parts) + (x.get("memnode_cpu_open_s") or 0.0)) / x["open_s"]

    share = med("solo-memcached", "memcached", mc_share)
    out = {"batch_cpu_s": cpu, "batch_memnode_cpu_s": node if cpu is not None else None,
           "memcached_cpus": share, "corun_batch_cpu_s": co_cpu,
           "cpu_inflation": co_cpu / cpu if co_cpu and cpu else None, "cpu": None, "link": None}
    if wall and cpu is not None and share is not None and ncpu and ncpu > share:
        out["cpu"] = 2 * (cpu + node) / (ncpu - share) / wall
    cap = parse_size(res["params"]["bandwidth"]) if system != "linux-swap" else None
    solo = [c for c in cells if c["kind"] == "solo-batch" and c["programs"].get("batch1", {}).get("ok")]
    batch_lanes = [lane_bytes((c.get("queues") or {}).get("batch1")) for c in solo]
    mc_rates = [[b / x["open_s"] for b in x["open_lane_bytes"]]
                for c in cells if c["kind"] == "solo-memcached"
                for x in [c["programs"].get("memcached", {})]
                if x.get("ok") and x.get("open_lane_bytes") and x.get("open_s")]
    if cap and wall and mc_rates and batch_lanes and None not in batch_lanes:
        need = [2 * _med([b[lane] for b in batch_lanes]) /
                (cap - _med([r[lane] for r in mc_rates])) for lane in (0, 1)]
        if all(n > 0 for n in need):
            out["link"] = max(need) / wall
    return out


def floors_note(res):
    """The section's paragraph on what no schedule of the link can beat here (`floors`); empty
    for results from before the programs' CPU was recorded."""
    parts = []
    for s in res.get("systems", SCHEDULES):
        f = floors(res, s)
        if f["cpu"] is None:
            continue
        mem = (f" + {f['batch_memnode_cpu_s']:.2f} s of the memnode's"
               if s != "linux-swap" else "")
        link = f", link {f['link']:.2f}x" if f["link"] is not None else ""
        infl = (f"; in the co-run a batch run took {f['corun_batch_cpu_s']:.2f} s of CPU "
                f"({f['cpu_inflation']:.2f}x alone)" if f["cpu_inflation"] else "")
        parts.append(f"{s}: a batch run alone takes {f['batch_cpu_s']:.2f} s of CPU{mem}, "
                     f"memcached's open phase {f['memcached_cpus']:.2f} CPUs; bounds on the batch "
                     f"slowdown: CPU {f['cpu']:.2f}x{link}{infl}")
    if not parts:
        return ""
    return ("What no schedule of the link can beat on this host's "
            f"{res['machine'].get('cpus', '?')} CPUs (`floors` in `bench/corun.py`): if each program "
            "needed in the co-run the CPU and link bytes it needed alone, and they packed "
            "perfectly, the two batch runs' CPU (their pagers' and the memnode's work for them "
            "included) on the CPUs memcached leaves (its server, pager, load generator and "
            "memnode work), and their bytes on each lane beside memcached's, would take at least "
            "this long over a solo run; medians: " + "; ".join(parts) + ".")


def faults_note(res):
    """The section's paragraph on how long a far fault took alone and co-run (gleaner's systems,
    medians of the stats files' means; empty for results from before they were recorded)."""
    parts = []
    for s in res.get("systems", SCHEDULES):
        cells = [c for c in res["cells"] if c["schedule"] == s]

        def med(kind, prog, key):
            return _med([(c["programs"][n].get("faults") or {}).get(key)
                         for c in cells if c["kind"] == kind for n in prog
                         if c["programs"].get(n, {}).get("ok")])

        batch = [(k, med("solo-batch", ["batch1"], k), med("corun", ["batch1", "batch2"], k))
                 for k in ("fetch_mean_us", "lookup_mean_us", "install_mean_us")]
        mc = (med("solo-memcached", ["memcached"], "fetch_mean_us"),
              med("corun", ["memcached"], "fetch_mean_us"))
        if any(a is None or b is None for _, a, b in batch):
            continue
        steps = ", ".join(f"{k.split('_')[0]} {a:.0f} → {b:.0f}" for k, a, b in batch)
        mc_text = (f"; memcached's fetch {mc[0]:.0f} → {mc[1]:.0f} (its whole run, loading and "
                   "reading back included)" if None not in mc else "")
        parts.append(f"{s}: a batch job's {steps}{mc_text}")
    if not parts:
        return ""
    return ("A far fault's steps alone → co-run, µs, means from the programs' stats (lookup: "
            "claim, charge and direct reclaim; fetch: request to reply, the link's queue "
            "included; install), medians: " + "; ".join(parts) + ".")


def nice_note(p):
    """What the header says of the memnode's priority in run parameters `p`."""
    nice = p.get("memnode_nice", 0)
    if nice:
        return (f" (run at nice {nice}, as a memnode on a host of its own: the programs do not "
                "delay its replies)")
    return " (at the programs' priority)"


def open_note(res):
    """How long memcached's co-run phase lasted (results from before it lasted as long as the
    batch jobs: as long as alone)."""
    if any("open_bytes" in c["programs"].get("memcached", {}) for c in res["cells"]):
        return (" and, in the co-run, until both batch jobs have finished a run and at least as long "
                "(a batch job done sooner starts again, its first run counted: memcached has co-runners "
                "throughout; its bandwidth: what that phase moved, over its length)")
    return " and in the co-run"


def memnode_cpu_note(res):
    """The memnode's share of this host's CPUs (gleaner systems; results from before it was
    recorded have none): during memcached's open-loop phase, alone and in the co-run, and over
    a solo batch cell."""
    def shares(kind, cpu_of, wall_of):
        out = []
        for c in res["cells"]:
            if c["kind"] == kind:
                cpu, wall = cpu_of(c), wall_of(c)
                if cpu is not None and wall:
                    out.append(cpu / wall)
        return out
    mc = lambda c: (c["programs"].get("memcached") or {})
    parts = []
    for label, got in (
            ("memcached's open phase alone", shares("solo-memcached", lambda c: mc(c).get("memnode_cpu_open_s"),
                                                    lambda c: mc(c).get("open_s"))),
            ("a batch job alone (the whole cell)", shares("solo-batch", lambda c: c.get("memnode_cpu_s"),
                                                          lambda c: c.get("memnode_wall_s"))),
            ("the co-run phase", shares("corun", lambda c: mc(c).get("memnode_cpu_open_s"),
                                        lambda c: mc(c).get("open_s")))):
        if got:
            parts.append(f"{label} {statistics.median(got):.0%} ({min(got):.0%}-{max(got):.0%})")
    if not parts:
        return ""
    return ("The memnode's CPU, which on this host it takes from the programs (at nice -20, before "
            "them), where a memnode on a host of its own would not: its CPU time over the phase's "
            "length, as a share of one CPU, median (range): " + "; ".join(parts) + ".")


def render(res, doc, name):
    m, p = res["machine"], res["params"]
    lines = [BEGIN, "## Many programs, one memnode link: fair scheduling against first come first served", "",
             f"Generated by `python3 bench/corun.py --reps {res['reps']}"
             f"{'' if p.get('mc_weight', 1) == 1 else ' --mc-weight ' + str(p['mc_weight'])}"
             f"{'' if p['bandwidth'] == '32M' else ' --bandwidth ' + p['bandwidth']}"
             f"{'' if p['rate'] == 2000 else ' --rate ' + str(p['rate'])}"
             f"{'' if p.get('memnode_nice', 0) == MEMNODE_NICE else ' --memnode-nice ' + str(p.get('memnode_nice', 0))}"
             f"{' --batch-nice ' + str(p['batch_nice']) if p.get('batch_nice') else ''}"
             f"` → `{name}` "
             f"({res['date']}, "
             f"{m.get('cpus', '?')} CPUs, Linux {m.get('kernel', '?')}, gleaner at `{res['git_commit']}`). "
             f"One memnode on TCP loopback per cell, its link capped at {p['bandwidth']}/s each way"
             f"{nice_note(p)}"
             ", a tenant per "
             f"program (memcached's weight {p.get('mc_weight', 1)}, the batch jobs' 1). memcached: {p['keys']} keys × {p['vsize']} B, `--local-mem "
             f"{p['mc_local']}`, open loop at {p['rate']} req/s (95% GET, Zipf 0.99) for {p['open_s']} s "
             f"alone{open_note(res)}, then every key read back; batch: `scripts/demo_job.py {p['demo_n']}` at `--local-mem "
             f"{p['batch_local']}`, checksum against all-local. Slowdown: memcached's co-run p99 over "
             "its solo p99, a batch job's co-run wall time over its solo time (both batch jobs are the "
             "same program: one solo run serves both). WMMR: min over programs of co-run bandwidth ÷ "
             "solo bandwidth, over the max (1.0 is perfectly fair). Medians over the reps; failed "
             f"cells: {sum(1 for c in res['cells'] if not c['ok'])} of {len(res['cells'])}.", "",
             "| system | memcached p99 solo → co-run µs | × | batch1 s solo → co-run | × | batch2 × | "
             "mean × | max × | σ | WMMR |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    failures = []
    for s in res.get("systems", SCHEDULES):
        bad = [f"{c['kind']} rep {c['rep'] + 1}: {n}: {x.get('error', '')[:90]}"
               + (f" (after its open phase, whose p99 was {x['p99_us']} µs)" if x.get("p99_us") else "")
               for c in res["cells"] if c["schedule"] == s
               for n, x in c["programs"].items() if not x.get("ok")]
        if bad:
            failures.append(f"{s}: " + "; ".join(bad))
        out, agg = summarise(res, s)
        mc, b1, b2 = out["memcached"], out["batch1"], out["batch2"]
        lines.append(
            f"| {s} | {_f(mc['solo'], '{:.0f}')} → {_f(mc['corun'], '{:.0f}')} | {_f(mc['slowdown'], '{:.2f}')} | "
            f"{_f(b1['solo'], '{:.1f}')} → {_f(b1['corun'], '{:.1f}')} | {_f(b1['slowdown'], '{:.2f}')} | "
            f"{_f(b2['slowdown'], '{:.2f}')} | {_f(agg['mean'], '{:.2f}')} | {_f(agg['max'], '{:.2f}')} | "
            f"{_f(agg['sigma'], '{:.2f}')} | {_f(agg['wmmr'], '{:.2f}')} |")
    if "linux-swap" in res.get("systems", ()):
        lim = p.get("linux_limits") or linux_limits(p)
        lines += ["", "linux-swap: the same programs with no gleaner, each in its own memory cgroup "
                  f"(v1) limited to its budget plus its own idle resident size (the demo job's "
                  f"interpreter {p['demo_baseline'] / 2**20:.1f} MiB: "
                  f"{lim['batch1'] / 2**20:.1f} MiB per batch job), but memcached to twice its "
                  f"budget plus its idle size (with no keys {p['mc_baseline'] / 2**20:.1f} MiB: "
                  f"{lim['memcached'] / 2**20:.1f} MiB; at budget plus idle size the cgroup-v1 OOM "
                  "killer stopped it loading its keys in 11 of 11 tries), all swapping to one fresh "
                  "zram device per cell; "
                  "no link cap (zram has none). Its bandwidth for WMMR: the cgroup's major faults × "
                  "4 KiB per second (cgroup v1 counts no swap-outs per cgroup). Cells the "
                  "cgroup-v1 OOM killer stopped were run again (up to twice): "
                  f"{sum(len(c.get('oom_killed_tries', [])) for c in res['cells'])} such tries."]
    else:
        lines += ["", "Linux swap as a third system is not in this run (`--systems` left it out)."]
    cpu = memnode_cpu_note(res)
    if cpu:
        lines += ["", cpu]
    bound = floors_note(res)
    if bound:
        lines += ["", bound]
    steps = faults_note(res)
    if steps:
        lines += ["", steps]
    if failures:
        lines += ["", "Programs that failed (their numbers are left out; a program's numbers from a cell "
                  "where another failed are kept): " + " | ".join(failures) + "."]
    lines += ["", "Issue 13's targets under the fair schedule: memcached co-run p99 ≤ 1.5× solo, every "
              "batch slowdown ≤ 1.3×, WMMR ≥ 0.9."]
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
    ap.add_argument("--rate", type=int, default=2000,
                    help="memcached's offered load in the open-loop phase, requests/s (default "
                         "2000: near what it sustains alone at 32 MB/s, where any slower fault "
                         "makes its queue grow without bound)")
    ap.add_argument("--bandwidth", default="32M",
                    help="the memnode's link cap, bytes per second (default 32M: the three "
                         "programs' demand is over it; at 96M it fits, and what is left is queueing)")
    ap.add_argument("--memnode-nice", type=int, default=MEMNODE_NICE,
                    help=f"run each memnode at this nice value (default {MEMNODE_NICE}; 0: the "
                         "programs' priority). A memnode stands for another host, whose CPU the "
                         "programs here do not take: at their priority its replies wait for the "
                         "2 vCPUs they share, and the link's order hardly shows")
    ap.add_argument("--batch-nice", type=int, default=0,
                    help="run the batch jobs (under gleaner: program and pager) at this nice value, "
                         "under every system alike (default 0)")
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help="comma-separated: fifo, fair (gleaner's memnode under each schedule), "
                         "linux-swap (needs root, zram and memory cgroups); default all three")
    ap.add_argument("--keep-stats", metavar="DIR",
                    help="copy each gleaner program's stats file of every cell into DIR")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "corun.json"))
    ap.add_argument("--doc", default=DOC)
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--no-render", action="store_true")
    return run_or_render(ap, argv, "corun.py", run_all, render, log)


if __name__ == "__main__":
    sys.exit(main())
