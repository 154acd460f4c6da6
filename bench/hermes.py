#!/usr/bin/env python3
"""Hermes (Middleware'21) benchmark: malloc + first touch latency, and redis and RocksDB beside a
batch job, against glibc, jemalloc and tcmalloc (as Debian packages them) in the same run.

1. malloc + first touch: bench/hermes/alloc_latency.c allocates 1 KiB blocks (64 MiB in all,
   2 us of busy work between requests) and 256 KiB blocks (256 MiB, 100 us between), touching
   one byte per page, under glibc, jemalloc, tcmalloc (LD_PRELOAD) and gleaner's reserve
   (`gleaner run --far off --latency-critical`, over glibc), each:
     * alone;
     * "anon": in a 1 GiB memory cgroup (v1 or v2) beside an antagonist that holds 700 MiB of
       anonymous memory and re-reads a 2 GiB file, so the cgroup sits at its limit and every
       first touch beyond it meets the cgroup's direct reclaim (this VM has no swap: the reclaim
       takes the antagonist's page cache, which is what a first touch pays for here);
     * "file": the same cgroup beside an antagonist that only re-reads the 2 GiB file (the
       cgroup full of page cache, no anonymous pressure).
   Each cell is run REPS times; the median of the runs' means and p99s is reported.
2. Services beside a batch job that is memory- and file-heavy (600 MiB of anonymous memory held,
   32 MiB allocated, touched and freed every 16 MiB read, and a file re-read), in the 1 GiB cgroup,
   at two pressure levels: 100% (held memory + re-read file = the cgroup's limit: whatever the
   service adds must be reclaimed) and 125% (1.25 x the limit: the batch job's file no longer
   fits). Per level, configurations run interleaved, 5 times each (medians reported):
     * redis (Debian's, on its own jemalloc): `redis-benchmark` SET/GET of 1 KiB values (30000
       requests over 100000 keys) and of 200 KiB values (500 over 250 keys), 4 clients;
       "default" (as packaged), "reserve" (`gleaner run --latency-critical`), "hermes" (the
       reserve, the batch job marked batch, a node daemon watching the cgroup with its default
       `--batch-reclaim eager`: whole files every 250 ms while under its watermark) and
       "hermes_adaptive" (the same with `--batch-reclaim adaptive`: only the bytes needed,
       behind the reader, and futile reclaims backed off; the two reclaimers side by side);
     * RocksDB: bench/hermes/rocksdb_latency.c on librocksdb (40000 puts of 1 KiB records, 600
       of 200 KiB, then every record read back and compared); glibc, jemalloc, tcmalloc,
       "hermes" and "hermes_adaptive".
   SLO: for each service and operation, glibc's (redis: as packaged) p90 with the node to itself
   (no antagonist, same run); violations = operations slower than it (redis: estimated from
   redis-benchmark's latency distribution, linear between its points). The batch job's
   throughput (bytes it read per second while the service ran) with the daemon against without.
   Overhead: the reserve thread's CPU time over its process's run (from `gleaner run --stats`)
   and the daemon's CPU time over its life (/proc), as fractions of one CPU.

The last line printed is one JSON object (reductions: 1 - hermes / glibc, same run).
Usage: python3 bench/hermes.py --quick [--out FILE]   (needs root for the cgroup)
"""
import argparse
import json
import os
import re
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


def antagonist(cg, bigfile, anon_mb=700, read_mb=None, churn=False, counter=None, prefix=()):
    """A batch job inside the cgroup: `anon_mb` MiB of anonymous memory held; the first `read_mb`
    MiB of `bigfile` (all of it by default) re-read for ever; with `churn`, 32 MiB allocated,
    touched and freed every 16 MiB read. With `counter`, the bytes read so far are written
    there every 0.2 s (its throughput)."""
    code = ("import os,sys,time\n"
            "anon,limit,churn,cnt=int(sys.argv[2]),int(sys.argv[3]),sys.argv[4]=='1',sys.argv[5]\n"
            "b=bytearray(anon<<20)\nfor i in range(0,len(b),4096): b[i]=1\n"
            "print('ready',flush=True)\nn=0\nlast=time.time()\n"
            "while True:\n  f=open(sys.argv[1],'rb')\n  got=0\n"
            "  while limit==0 or got<limit:\n    d=f.read(1<<20)\n    if not d: break\n"
            "    got+=len(d)\n    n+=len(d)\n"
            "    if churn and n%(16<<20)==0:\n      c=b'\\1'*(32<<20)\n      del c\n"
            "    t=time.time()\n"
            "    if cnt!='-' and t-last>0.2:\n"
            "      open(cnt+'.t','w').write(str(n)+' '+str(t))\n      os.replace(cnt+'.t',cnt)\n"
            "      last=t\n"
            "  f.close()\n")
    limit = (read_mb or 0) << 20
    p = subprocess.Popen(cg.wrap(list(prefix) + [sys.executable, "-c", code, bigfile, str(anon_mb),
                                                 str(limit), "1" if churn else "0",
                                                 counter or "-"]),
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    assert p.stdout.readline().strip() == b"ready", "antagonist did not start"
    time.sleep(2)  # the file cache fills the rest of the cgroup
    return p


def read_counter(path):
    """(bytes read, time) from an antagonist's counter file."""
    for _ in range(20):
        try:
            n, t = open(path).read().split()
            return int(n), float(t)
        except (OSError, ValueError):
            time.sleep(0.05)
    raise RuntimeError(f"the batch job's counter {path} is unreadable")


def batch_mib_s(counter, before):
    """The batch job's read rate (MiB/s) since `before`, a `read_counter` of `counter`."""
    after = read_counter(counter)
    return round((after[0] - before[0]) / (after[1] - before[1]) / 2**20, 1)


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


def with_stats(prefix, path):
    """`gleaner run ... --` with `--stats path` added (other prefixes unchanged)."""
    if prefix and prefix[0] == GLEANER:
        i = prefix.index("--")
        return prefix[:i] + ["--stats", path] + prefix[i:]
    return list(prefix)


def thread_share(stats_path, part="all"):
    """The reserve thread's CPU time over its process's run, from `gleaner run --stats`; with
    part="overhead", less the time it spent pre-faulting (the page faults, and under pressure the
    reclaim, that the program's first touches would otherwise have met)."""
    try:
        st = json.load(open(stats_path))
    except (OSError, ValueError):
        return None
    procs = st.get("latency_critical", {}).get("processes", [])
    cpu = sum(p["reserve"].get("thread_cpu_seconds", 0) for p in procs)
    if part == "overhead":
        cpu -= sum(p["reserve"].get("thread_populate_cpu_seconds", 0) for p in procs)
    wall = st.get("wall_seconds") or 0
    return round(cpu / wall, 5) if wall else None


def reserve_counts(stats_path):
    """The reserve's request counters of a run (hits, misses, of them the partial hits and the
    small misses, fallbacks), from `gleaner run --stats`; None if unreadable."""
    try:
        st = json.load(open(stats_path))
        r = st["latency_critical"]["processes"][0]["reserve"]
    except (OSError, ValueError, KeyError, IndexError):
        return None
    keys = ["hits", "misses", "partial_hits", "large_hits", "fresh_hits", "reallocs_kept",
            "reallocs_moved", "reallocs_moved_large", "realloc_copied_bytes", "small_misses", "small_misses_at", "busy",
            "fallbacks", "populate_failures", "thread_reaction_us", "thread_wake_delay_max_us",
            "thread_heap_refill_seconds", "thread_pool_refill_seconds",
            "thread_pool_refill_max_us", "thread_wakeups", "thread_wakeups_on_need",
            "populated_bytes", "thread_cpu_seconds"]
    return {k: r.get(k) for k in keys}


def micro(binary, allocs, reps, cg, bigfile, tmp):
    cells = {}
    shares = []
    sizes = [(1024, 64 << 20, 2), (256 * 1024, 256 << 20, 100)]
    for scenario in ["alone", "anon", "file"]:
        ant = None
        if scenario == "anon":
            ant = antagonist(cg, bigfile)
        elif scenario == "file":
            ant = antagonist(cg, bigfile, anon_mb=0)
        try:
            for size, total, think in sizes:
                for name, (prefix, env) in allocs.items():
                    runs = []
                    for _ in range(reps):
                        st = os.path.join(tmp, "stats.json")
                        runs.append(alloc_run(binary, with_stats(prefix, st), env, size, total,
                                              think, cg if ant else None))
                        if name == "hermes":
                            shares.append((thread_share(st), thread_share(st, "overhead")))
                            runs[-1]["reserve"] = reserve_counts(st)
                    cell = {
                        "mean_ns": statistics.median(r["mean_ns"] for r in runs),
                        "p99_ns": statistics.median(r["p99_ns"] for r in runs),
                        "runs": runs,
                    }
                    key = f"{'1k' if size == 1024 else '256k'}_{scenario}_{name}"
                    cells[key] = cell
                    misses = [(r.get("reserve") or {}).get("misses") for r in runs]
                    log(f"{key}: mean {cell['mean_ns'] / 1000:.1f} us, p99 {cell['p99_ns'] / 1000:.1f} us"
                        + (f", reserve misses {misses}" if name == "hermes" else ""))
        finally:
            if ant:
                stop(ant)
    return cells, shares


class Daemon:
    """A node daemon watching the cgroup, with the batch job marked batch by pid."""

    def __init__(self, cg, sock, batch_pid, reclaim):
        args = [GLEANER, "node", "--socket", sock, "--cgroup", cg.path, "--reserve", "256M",
                "--batch-reclaim", reclaim]
        if os.path.exists(sock):
            os.unlink(sock)
        self.p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        self.started = time.time()
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        if batch_pid:
            subprocess.run([GLEANER, "node", "mark", "--batch", str(batch_pid), "--socket", sock],
                           check=True, capture_output=True)
        self.sock = sock
        self.cpu0, self.t0 = self.cpu(), time.time()

    def cpu(self):
        fields = open(f"/proc/{self.p.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def finish(self):
        """The daemon's batch state and its CPU share while the service ran (from the batch
        job's mark to now: its start-up is left out); stops it."""
        st = subprocess.run([GLEANER, "node", "status", "--socket", self.sock],
                            capture_output=True, text=True).stdout
        try:
            batch = json.loads(st)["batch"]
        except (ValueError, KeyError):
            batch = {"unreadable": st[:300]}
        cpu, life = self.cpu() - self.cpu0, time.time() - self.t0
        stop(self.p)
        keep = ["drops", "dropped_bytes", "rounds_under_watermark", "scan_seconds",
                "ticks_backing_off", "reclaim_interval_s", "watermark_bytes"]
        return {**{k: batch.get(k) for k in keep}, "cpu_share": round(cpu / life, 4),
                "cpu_s": round(cpu, 3), "measured_s": round(life, 1)}


def parse_redis(out):
    """redis-benchmark's (non-CSV) output: per test, p50/p90-ish/p99 from its summary and the
    (latency ms, cumulative count) points of its distributions."""
    tests = {}
    chunks = re.split(r"====== (\S+) ======", out)
    for name, text in zip(chunks[1::2], chunks[2::2]):
        pts = sorted({(float(ms), int(c)) for ms, c in
                      re.findall(r"[\d.]+% <= ([\d.]+) milliseconds \(cumulative count (\d+)\)", text)})
        m = re.search(r"avg\s+min\s+p50\s+p95\s+p99\s+max\s*\n\s*([\d.]+)\s+([\d.]+)\s+([\d.]+)"
                      r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", text)
        total = int(re.search(r"(\d+) requests completed", text).group(1))
        avg, _, p50, p95, p99, mx = (float(x) for x in m.groups())
        tests[name] = {"avg_ms": avg, "p50_ms": p50, "p95_ms": p95, "p99_ms": p99, "max_ms": mx,
                       "count": total, "points": pts}
    return tests


def redis_quantile(points, total, q):
    """The latency under which a fraction q of the requests fall (from the distribution points)."""
    want = q * total
    for ms, c in points:
        if c >= want:
            return ms
    return points[-1][0]


def redis_over(points, total, slo_ms):
    """Requests slower than slo_ms, linear between the distribution's points."""
    below_ms, below_c = 0.0, 0
    for ms, c in points:
        if ms >= slo_ms:
            frac = (slo_ms - below_ms) / (ms - below_ms) if ms > below_ms else 1.0
            return round(total - (below_c + frac * (c - below_c)))
        below_ms, below_c = ms, c
    return 0


REDIS_LOADS = [("1k", ["-d", "1024", "-n", "30000", "-r", "100000"]),
               ("200k", ["-d", str(200 * 1024), "-n", "500", "-r", "250"])]


def daemon_for(config, cg, sock, batch_pid):
    """The node daemon a configuration runs beside: none but for hermes (eager reclaim) and
    hermes_adaptive."""
    if not config.startswith("hermes"):
        return None
    return Daemon(cg, sock, batch_pid, "adaptive" if config == "hermes_adaptive" else "eager")


def redis_run(cg, mode, tmp, sock, batch_pid=None, counter=None):
    """One redis run: mode default | reserve | hermes | hermes_adaptive; inside `cg` if given."""
    port = 16379 + (os.getpid() % 1000)
    env = {**os.environ, "GLEANER_NODE_SOCKET": sock}
    daemon = daemon_for(mode, cg, sock, batch_pid)
    st = os.path.join(tmp, "redis-stats.json")
    if os.path.exists(st):
        os.unlink(st)
    rprefix = ([GLEANER, "run", "--far", "off", "--latency-critical", "-q", "--stats", st, "--"]
               if mode != "default" else [])
    cmd = rprefix + ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
                     "--protected-mode", "no"]
    server = subprocess.Popen(cg.wrap(cmd) if cg else cmd, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        for _ in range(200):
            if subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).returncode == 0:
                break
            time.sleep(0.05)
        before = read_counter(counter) if counter else None
        res = {}
        for size, load in REDIS_LOADS:
            out = subprocess.run(["redis-benchmark", "-p", str(port), "-t", "set,get", "-c", "4"] + load,
                                 capture_output=True, text=True, timeout=300).stdout
            for op, t in parse_redis(out).items():
                res[f"{op.lower()}_{size}"] = t
        if counter:
            res["batch_mib_s"] = batch_mib_s(counter, before)
        subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if mode != "default":
            res["thread_cpu_share"] = thread_share(st)
            res["thread_overhead_share"] = thread_share(st, "overhead")
            res["reserve"] = reserve_counts(st)
        if daemon:
            res["daemon"] = daemon.finish()
            daemon = None
        return res
    finally:
        stop(server)
        if daemon:
            stop(daemon.p)


def rocksdb_run(binary, cg, name, prefix, env, tmp, sock, batch_pid=None, counter=None):
    """One RocksDB run under allocator `name` (hermes / hermes_adaptive: with a daemon)."""
    daemon = daemon_for(name, cg, sock, batch_pid)
    db = os.path.join(tmp, "rocksdb")
    shutil.rmtree(db, ignore_errors=True)
    samples = os.path.join(tmp, "rocksdb-samples")
    st = os.path.join(tmp, "rocksdb-stats.json")
    cmd = with_stats(prefix, st) + [binary, db, str(ROCKS_SMALL), str(ROCKS_LARGE), samples]
    try:
        before = read_counter(counter) if counter else None
        out = subprocess.run(cg.wrap(cmd) if cg else cmd,
                             env={**os.environ, **env, "GLEANER_NODE_SOCKET": sock},
                             capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise RuntimeError(f"{cmd}: {out.stderr}")
        res = json.loads(out.stdout.strip().splitlines()[-1])
        res["samples"] = {}
        for line in open(samples):
            cls, *vals = line.split()
            res["samples"][cls] = [float(v) for v in vals]
        if counter:
            res["batch_mib_s"] = batch_mib_s(counter, before)
        if prefix and prefix[0] == GLEANER:
            res["thread_cpu_share"] = thread_share(st)
            res["thread_overhead_share"] = thread_share(st, "overhead")
            res["reserve"] = reserve_counts(st)
        if daemon:
            res["daemon"] = daemon.finish()
            daemon = None
        return res
    finally:
        shutil.rmtree(db, ignore_errors=True)
        if daemon:
            stop(daemon.p)


ROCKS_SMALL, ROCKS_LARGE = 40000, 600
ROCKS_CLASSES = ["put_1k", "get_1k", "put_200k", "get_200k"]
LEVELS = {"100": 1.0, "125": 1.25}
BATCH_ANON_MB = 600
SERVICE_REPS = 5


def batch_job(cg, bigfile, factor=1.0, counter=None):
    """The services' batch job in `cg`, at `factor` times the cgroup's limit: BATCH_ANON_MB MiB of
    anonymous memory, the rest of that much re-read from `bigfile`, with churn (`antagonist`).
    Returns the process and the MiB it re-reads."""
    read_mb = int(LIMIT / 2**20 * factor) - BATCH_ANON_MB
    ant = antagonist(cg, bigfile, anon_mb=BATCH_ANON_MB, read_mb=read_mb, churn=True,
                     counter=counter)
    return ant, read_mb


def services(rocks_bin, allocs, reps, cg, bigfile, tmp):
    """redis and RocksDB alone (the SLOs), then beside the batch job at each pressure level."""
    sock = os.path.join(tmp, "node.sock")
    have_redis = bool(shutil.which("redis-server") and shutil.which("redis-benchmark"))
    if not have_redis:
        log("!!! redis is ABSENT: the redis keys are missing")
    out = {"alone": {"redis": [], "rocksdb": []}, "levels": {}}
    prefix, env = allocs["glibc"]
    for _ in range(reps):
        if have_redis:
            out["alone"]["redis"].append(redis_run(None, "default", tmp, sock))
        r = rocksdb_run(rocks_bin, None, "glibc", prefix, env, tmp, sock)
        out["alone"]["rocksdb"].append(r)
    rocks_modes = dict(allocs)
    rocks_modes["hermes_adaptive"] = allocs["hermes"]
    for level, factor in LEVELS.items():
        counter = os.path.join(tmp, f"batch-counter-{level}")
        ant, read_mb = batch_job(cg, bigfile, factor, counter)
        lv = {"batch_read_mib": read_mb, "redis": {}, "rocksdb": {}}
        try:
            for _ in range(reps):  # interleaved: a neighbour's burst on this shared VM hits all
                if have_redis:
                    for mode in ["default", "reserve", "hermes_adaptive", "hermes"]:
                        r = redis_run(cg, mode, tmp, sock, ant.pid, counter)
                        lv["redis"].setdefault(mode, []).append(r)
                        log(f"redis {level}% {mode}: SET 1k p99 {r['set_1k']['p99_ms']} ms, "
                            f"batch {r['batch_mib_s']} MiB/s, daemon {r.get('daemon')}")
                for name, (prefix, env) in rocks_modes.items():
                    r = rocksdb_run(rocks_bin, cg, name, prefix, env, tmp, sock, ant.pid, counter)
                    lv["rocksdb"].setdefault(name, []).append(r)
                    log(f"rocksdb {level}% {name}: p99 " + ", ".join(
                        f"{c} {r[c]['p99_ns'] / 1000:.0f} us" for c in ROCKS_CLASSES)
                        + f"; batch {r['batch_mib_s']} MiB/s, daemon {r.get('daemon')}")
        finally:
            stop(ant)
        out["levels"][level] = lv
    return out


def summarize_services(sv):
    """The services' summary keys, and the services' results without their raw samples."""
    med = statistics.median
    summary = {}
    slo = {}
    # SLOs: p90 with the node to itself (glibc; redis as packaged), pooled over the runs.
    for c in ROCKS_CLASSES:
        pooled = sorted(v for r in sv["alone"]["rocksdb"] for v in r["samples"][c])
        slo[f"rocksdb_{c}"] = pooled[int((len(pooled) - 1) * 0.9)]
    for r in sv["alone"]["redis"][:1]:
        for k in r:
            if isinstance(r[k], dict) and "points" in r[k]:
                slo[f"redis_{k}"] = med(redis_quantile(x[k]["points"], x[k]["count"], 0.9)
                                        for x in sv["alone"]["redis"])
    summary["slo"] = {k: (round(v / 1000, 1) if k.startswith("rocksdb") else v)
                      for k, v in slo.items()}
    summary["slo_units"] = "rocksdb: us, redis: ms"
    for level, lv in sv["levels"].items():
        # RocksDB: per class p99 and the violations of each class's SLO.
        rk = lv["rocksdb"]
        reds = []
        for c in ROCKS_CLASSES:
            for name in rk:
                summary[f"rocksdb_{c}_p99_us_{name}_{level}"] = round(
                    med(r[c]["p99_ns"] for r in rk[name]) / 1000, 1)
            reds.append(1 - med(r[c]["p99_ns"] for r in rk["hermes"])
                        / med(r[c]["p99_ns"] for r in rk["glibc"]))
            summary[f"rocksdb_{c}_p99_reduction_{level}"] = round(reds[-1], 4)
        summary[f"rocksdb_p99_reduction_{level}"] = round(sum(reds) / len(reds), 4)
        for name in rk:
            for r in rk[name]:
                r["slo_violations"] = sum(sum(1 for v in r["samples"][c] if v > slo[f"rocksdb_{c}"])
                                          for c in ROCKS_CLASSES)
                r["ops"] = sum(len(r["samples"][c]) for c in ROCKS_CLASSES)
            summary[f"rocksdb_slo_violations_{name}_{level}"] = med(r["slo_violations"] for r in rk[name])
        g = summary[f"rocksdb_slo_violations_glibc_{level}"]
        summary[f"rocksdb_slo_violation_reduction_{level}"] = (
            round(1 - summary[f"rocksdb_slo_violations_hermes_{level}"] / g, 4) if g else None)
        for name in ["hermes", "hermes_adaptive"]:
            summary[f"rocksdb_batch_throughput_ratio_{name}_{level}"] = round(
                med(r["batch_mib_s"] for r in rk[name]) / med(r["batch_mib_s"] for r in rk["glibc"]), 3)
        # redis: p99 per operation and size, violations, the batch job's throughput.
        rd = lv["redis"]
        if rd:
            for mode in rd:
                for r in rd[mode]:
                    r["slo_violations"] = sum(redis_over(r[k]["points"], r[k]["count"], slo[f"redis_{k}"])
                                              for k in r if isinstance(r[k], dict) and "points" in r[k])
                summary[f"redis_slo_violations_{mode}_{level}"] = med(r["slo_violations"] for r in rd[mode])
                for k in ["set_1k", "get_1k", "set_200k", "get_200k"]:
                    summary[f"redis_{k}_p99_ms_{mode}_{level}"] = med(r[k]["p99_ms"] for r in rd[mode])
            for mode in ["reserve", "hermes", "hermes_adaptive"]:
                b = summary[f"redis_set_1k_p99_ms_default_{level}"]
                summary[f"redis_p99_reduction_{mode}_{level}"] = round(
                    1 - summary[f"redis_set_1k_p99_ms_{mode}_{level}"] / b, 4)
                reds = [1 - summary[f"redis_{k}_p99_ms_{mode}_{level}"]
                        / summary[f"redis_{k}_p99_ms_default_{level}"]
                        for k in ["set_1k", "get_1k", "set_200k", "get_200k"]]
                summary[f"redis_p99_reduction_all_ops_{mode}_{level}"] = round(sum(reds) / 4, 4)
            g = summary[f"redis_slo_violations_default_{level}"]
            summary[f"redis_slo_violation_reduction_{level}"] = (
                round(1 - summary[f"redis_slo_violations_hermes_{level}"] / g, 4) if g else None)
            for name in ["hermes", "hermes_adaptive"]:
                summary[f"redis_batch_throughput_ratio_{name}_{level}"] = round(
                    med(r["batch_mib_s"] for r in rd[name]) / med(r["batch_mib_s"] for r in rd["default"]), 3)
    # Headlines (100% pressure).
    head = "100" if "100" in sv["levels"] else next(iter(sv["levels"]))
    summary["rocksdb_p99_reduction"] = summary[f"rocksdb_p99_reduction_{head}"]
    if f"redis_p99_reduction_hermes_{head}" in summary:
        summary["redis_p99_reduction"] = summary[f"redis_p99_reduction_hermes_{head}"]
    ratios = [v for k, v in summary.items() if k.startswith(("rocksdb_batch_throughput_ratio_hermes_",
                                                             "redis_batch_throughput_ratio_hermes_"))
              and "adaptive" not in k]
    summary["batch_throughput_ratio_min"] = min(ratios)
    # Overheads: the worst run.
    daemons, threads = {"hermes": [], "hermes_adaptive": []}, []
    for lv in sv["levels"].values():
        for svc in ("redis", "rocksdb"):
            for name, runs in lv[svc].items():
                for r in runs:
                    if r.get("thread_cpu_share") is not None:
                        threads.append((r["thread_cpu_share"], r.get("thread_overhead_share")))
                    if r.get("daemon"):
                        daemons[name].append(r["daemon"]["cpu_share"])
    for name, shares in daemons.items():
        suffix = "" if name == "hermes" else "_adaptive"
        summary[f"daemon_cpu_share_max{suffix}"] = max(shares) if shares else None
        summary[f"daemon_cpu_share_median{suffix}"] = statistics.median(shares) if shares else None
    # Raw samples (40600 per RocksDB run) and redis's distribution points are not kept in the
    # results file; their summaries and the violation counts are.
    for lv in [sv["alone"]] + list(sv["levels"].values()):
        for svc in ("rocksdb", "redis"):
            for runs in ([lv[svc]] if isinstance(lv[svc], list) else lv[svc].values()):
                for r in runs:
                    r.pop("samples", None)
                    for v in r.values():
                        if isinstance(v, dict):
                            v.pop("points", None)
    return summary, threads


def big_file(tmp, mib):
    """A file of `mib` MiB of random bytes in `tmp` (what the batch job reads into the page
    cache); its path."""
    path = os.path.join(tmp, "big.dat")
    with open(path, "wb") as f:
        chunk = os.urandom(1 << 20)
        for _ in range(mib):
            f.write(chunk)
    return path


def write_result(result, out):
    """Writes `result` to `out` (when given) and prints its summary, the last line of output."""
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps(result["summary"]))


def rocksdb_binary(tmp):
    """bench/hermes/rocksdb_latency.c built against librocksdb (installed with apt-get if its
    header is missing; without it the benchmark stops, saying so)."""
    if not os.path.exists("/usr/include/rocksdb/c.h"):
        log("librocksdb-dev missing: installing it with apt-get")
        subprocess.run(["apt-get", "install", "-y", "-qq", "librocksdb-dev"],
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    out = os.path.join(tmp, "rocksdb_latency")
    cc = subprocess.run(["cc", "-O2", "-o", out, os.path.join(ROOT, "bench/hermes/rocksdb_latency.c"),
                         "-lrocksdb"], capture_output=True, text=True)
    if cc.returncode != 0:
        raise SystemExit(f"!!! the RocksDB program does not build (librocksdb-dev): {cc.stderr}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="3 runs per micro-benchmark cell, 5 per service configuration (the only mode)")
    ap.add_argument("--out", help="write the results JSON here too")
    args = ap.parse_args()
    reps = 3
    tmp = tempfile.mkdtemp(prefix="gleaner-hermes-bench-")
    binary = os.path.join(tmp, "alloc_latency")
    subprocess.run(["cc", "-O2", "-o", binary, os.path.join(ROOT, "bench/hermes/alloc_latency.c")], check=True)
    rocks_bin = rocksdb_binary(tmp)
    bigfile = big_file(tmp, 2048)
    cg = Cgroup(LIMIT)
    started = time.time()
    allocs = allocators()
    try:
        cells, micro_shares = micro(binary, allocs, reps, cg, bigfile, tmp)
        sv = services(rocks_bin, allocs, SERVICE_REPS, cg, bigfile, tmp)
    finally:
        cg.remove()
        shutil.rmtree(tmp, ignore_errors=True)

    def red(key, metric, base="glibc"):
        b, h = cells[f"{key}_{base}"][metric], cells[f"{key}_hermes"][metric]
        return round(1 - h / b, 4)

    summary = {}
    for key in ["1k_alone", "1k_anon", "1k_file", "256k_alone", "256k_anon", "256k_file"]:
        summary[f"p99_reduction_{key}"] = red(key, "p99_ns")
        summary[f"mean_reduction_{key}"] = red(key, "mean_ns")
        for other in ["jemalloc", "tcmalloc"]:
            if f"{key}_{other}" in cells:
                summary[f"p99_reduction_{key}_vs_{other}"] = red(key, "p99_ns", other)
    svc_summary, svc_shares = summarize_services(sv)
    summary.update(svc_summary)
    # The reserve thread's CPU share: in the micro-benchmark (which does little but allocate, so
    # the thread pre-faults nearly all its memory) and in the services; all of it, and its
    # overhead (all but the pre-faulting, which moves the program's own faults to the thread).
    for where, pairs in (("micro", micro_shares), ("services", svc_shares)):
        for i, what in enumerate(("cpu", "overhead")):
            xs = [p[i] for p in pairs if p[i] is not None]
            summary[f"reserve_thread_{what}_share_{where}_max"] = max(xs) if xs else None
            summary[f"reserve_thread_{what}_share_{where}_median"] = (
                statistics.median(xs) if xs else None)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    result = {"quick": True, "date": time.strftime("%Y-%m-%d", time.gmtime()), "git_commit": commit,
              "command": "python3 bench/hermes.py --quick" + (f" --out {args.out}" if args.out else ""),
              "seconds": round(time.time() - started, 1), "cells": cells, "services": sv,
              "summary": summary}
    write_result(result, args.out)


if __name__ == "__main__":
    main()
