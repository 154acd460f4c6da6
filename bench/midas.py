#!/usr/bin/env python3
"""Soft memory and the node coordinator (issue 46, Midas): coordination efficiency of the
allocation policies, harvested idle memory, and a memory antagonist, in one run.

    python3 bench/midas.py --quick          # about 5 minutes; last line: one JSON object
    python3 bench/midas.py                  # longer phases, midas-victim too
    python3 bench/midas.py --out FILE       # where the results go

Needs a release build (`cargo build --release`: target/release/gleaner and soft-workload).

Three real applications (target/release/soft-workload) share one machine's idle memory, equal
to half their combined working sets; their rebuild costs span 100x:

* storage:    a storage server's block cache over a real file (rebuild = a pread of the block
              plus 10 us of checksum work),
* memo-100us: a memoising service whose entries cost 100 us of CPU to compute,
* memo-1ms:   the same at 1 ms.

Each serves Zipf(0.9) requests for 16 KiB items, 20 us of work per request, and checks every
value it reads in full. Phases, all in this run and on this machine:

1. ideal: the three with every item cached (no daemon, grants above their working sets): the
   all-cached throughput each later phase is normalised to.
2. one phase per policy (`gleaner node --policy P --soft-budget M`): midas (the dissertation's
   rebuild-cost estimator), static (equal partition), cliffhanger (hit-ratio gradient), and in
   the full run midas-victim (the released code's estimator). Efficiency = the mean over the
   three of (throughput over the phase's last third / ideal throughput), throughput taken per
   CPU second of each process (operations / its user+system CPU time): the apps are CPU-bound
   closed loops on a machine whose CPUs others share, so operations per wall second measure
   the neighbours as much as the policy (`efficiency_wall` keeps that figure too). Harvested fraction =
   what the pools hold (measured from their memfds by the daemon) over M, averaged over the
   same window. Settle time: when the efficiency's 5-s moving average first reached 90% of its
   final value.
3. pressure (needs a memory cgroup): the three in a cgroup with a limit, the daemon watching the
   cgroup; an antagonist allocating as fast as it can up to 90% of the limit, holding, leaving.
   Counts OOM kills (the cgroup's oom_kill), programs that did not finish cleanly, the daemon's
   direct-punch throughput, and throughput 5 s and `--recovery-s` (default 30, the issue's
   target) seconds after the antagonist left against the 5 s before it came.

Writes bench/results/midas/midas[-quick].json; prints a summary and, as the last line, one JSON
object with efficiency_midas, efficiency_static, efficiency_cliffhanger, harvested_fraction,
oom_kills and stopped_programs (and more). Exit status 0, or 1 if a program read a wrong value.
"""
import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release")
MB = 1 << 20


def app_specs(objects, size, file_path):
    common = ["--objects", str(objects), "--size", str(size), "--zipf", "0.9", "--base-us", "20"]
    return [
        ("storage", common + ["--kind", "file", "--file", file_path, "--cost-us", "10"]),
        ("memo-100us", common + ["--kind", "memo", "--cost-us", "100"]),
        ("memo-1ms", common + ["--kind", "memo", "--cost-us", "1000"]),
    ]


class App:
    """A soft-workload process and its JSON reports."""

    def __init__(self, name, args, secs, node=None, limit=None, wrap=None):
        cmd = [os.path.join(BIN, "soft-workload"), "--name", name, "--secs", str(secs),
               "--report-ms", "500"] + args
        if node:
            cmd += ["--node", node]
        if limit:
            cmd += ["--limit", str(limit)]
        self.name = name
        self.reports = []
        self.proc = subprocess.Popen((wrap or []) + cmd, stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                self.reports.append(json.loads(line))
            except ValueError:
                pass

    def wait(self, timeout):
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.thread.join(timeout=5)
        return rc

    def rate(self, t0, t1):
        """Operations per second between its reports at t0 and t1 (seconds since its start)."""
        pts = [(r["t"], r["ops"]) for r in self.reports]
        a = min(pts, key=lambda p: abs(p[0] - t0))
        b = min(pts, key=lambda p: abs(p[0] - t1))
        return (b[1] - a[1]) / max(b[0] - a[0], 1e-9)

    def cpu_rate(self, t0, t1):
        """Operations per CPU second of the process between its reports at t0 and t1."""
        pts = [(r["t"], r["ops"], r.get("cpu_s", 0.0)) for r in self.reports]
        a = min(pts, key=lambda p: abs(p[0] - t0))
        b = min(pts, key=lambda p: abs(p[0] - t1))
        return (b[1] - a[1]) / max(b[2] - a[2], 1e-9)

    def series(self):
        """(t, ops per CPU second) between consecutive reports."""
        out = []
        for a, b in zip(self.reports, self.reports[1:]):
            dc = b.get("cpu_s", 0.0) - a.get("cpu_s", 0.0)
            if dc > 0:
                out.append((b["t"], (b["ops"] - a["ops"]) / dc))
        return out

    def bad(self):
        return self.reports[-1]["bad"] if self.reports else None


def start_daemon(sock, args, wrap=None):
    p = subprocess.Popen((wrap or []) + [os.path.join(BIN, "gleaner"), "node", "--socket", sock] + args,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    if not line.startswith("listening on"):
        raise SystemExit(f"gleaner node did not start: {line!r}")
    return p


def node_status(sock):
    out = subprocess.run([os.path.join(BIN, "gleaner"), "node", "status", "--socket", sock],
                         capture_output=True, text=True, timeout=10)
    return json.loads(out.stdout) if out.returncode == 0 else None


def stop(p):
    if p and p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def make_file(path, nbytes):
    with open(path, "wb") as f:
        left = nbytes
        while left:
            n = min(left, 4 * MB)
            f.write(os.urandom(n))
            left -= n


def phase_ideal(specs, secs, ws):
    apps = [App(n, a, secs, limit=ws + 8 * MB) for n, a in specs]
    rcs = [a.wait(secs + 30) for a in apps]
    t1 = secs
    t0 = secs * 2 / 3
    return {a.name: {"ops_per_s": a.rate(t0, t1), "ops_per_cpu_s": a.cpu_rate(t0, t1), "rc": rc, "bad": a.bad(),
                     "misses": a.reports[-1]["misses"] if a.reports else None}
            for a, rc in zip(apps, rcs)}


def phase_policy(policy, specs, secs, budget, ideal, quick):
    sock = os.path.join(tempfile.gettempdir(), f"gleaner-midas-bench-{os.getpid()}.sock")
    interval = "2"
    d = start_daemon(sock, ["--policy", policy, "--soft-budget", str(budget), "--interval", interval,
                            "--probe", "2M", "--move-max", "8M", "--step", "4M", "--initial", "8M",
                            "--tick-ms", "50", "--grace-ms", "300"])
    apps = [App(n, a, secs, node=sock) for n, a in specs]
    samples = []
    decisions = {}
    t_start = time.time()
    while any(a.proc.poll() is None for a in apps):
        st = node_status(sock)
        if st:
            samples.append((time.time() - t_start, sum(p["resident"] for p in st["pools"]),
                            {p["name"]: (p["limit"], p["resident"], p.get("utility")) for p in st["pools"]}))
            # The daemon keeps its last 32 rounds' changes and why: all of them, by time.
            for rec in st.get("decisions") or []:
                decisions.setdefault(rec.get("at_ms"), rec)
        time.sleep(0.5)
    rcs = [a.wait(30) for a in apps]
    final_status = samples[-1][2] if samples else {}
    stop(d)
    t0, t1 = secs * 2 / 3, secs
    per = {}
    for a, rc in zip(apps, rcs):
        r = a.rate(t0, t1)
        rc_ = a.cpu_rate(t0, t1)
        per[a.name] = {"ops_per_s": r, "normalized_wall": r / ideal[a.name]["ops_per_s"],
                       "ops_per_cpu_s": rc_, "normalized": rc_ / ideal[a.name]["ops_per_cpu_s"], "rc": rc,
                       "bad": a.bad(), "last": a.reports[-1] if a.reports else None,
                       "grant_and_resident_end": (final_status.get(a.name) or (None, None))[:2]}
    eff = sum(p["normalized"] for p in per.values()) / len(per)
    eff_wall = sum(p["normalized_wall"] for p in per.values()) / len(per)
    window = [s for s in samples if t0 <= s[0] <= t1]
    harvested = (sum(s[1] for s in window) / len(window) / budget) if window else None
    # Settle time: efficiency per report interval, 3-s moving average vs the final value.
    series = {a.name: a.series() for a in apps}
    times = sorted({round(t) for s in series.values() for t, _ in s})
    effs = []
    for t in times:
        vals = []
        for a in apps:
            pts = [v for (tt, v) in series[a.name] if t - 1.5 <= tt <= t + 1.5]
            if pts:
                vals.append(sum(pts) / len(pts) / ideal[a.name]["ops_per_cpu_s"])
        if len(vals) == len(apps):
            effs.append((t, sum(vals) / len(vals)))
    # Settled: the first time the efficiency's 5-s moving average reaches 90% of its final value.
    settle = None
    for t, _ in effs:
        win = [e for (tt, e) in effs if t - 2.5 <= tt <= t + 2.5]
        if len(win) >= 3 and sum(win) / len(win) >= 0.9 * eff:
            settle = t
            break
    return {"policy": policy, "efficiency": eff, "efficiency_wall": eff_wall,
            "harvested_fraction": harvested,
            "settle_s": settle, "apps": per, "efficiency_series": effs,
            "resident_series": [(round(t, 1), r) for t, r, _ in samples],
            # Per pool, every 0.5 s: [grant, what it holds] in MiB (the daemon's status).
            "pool_series": pool_series(samples),
            # Every change of a grant the daemon made, with its reason, seconds from the start.
            "decisions": [[round(at / 1000 - t_start, 1),
                           [(c.get("name"), round(c["from"] / MB, 1), round(c["to"] / MB, 1), c.get("why"))
                            for c in rec.get("changes", [])]]
                          for at, rec in sorted(decisions.items()) if at is not None]}


def pool_series(samples):
    """{pool: [(t, grant MiB, held MiB, the policy's utility estimate), ...]} from the
    daemon-status samples of a phase."""
    out = {}
    for t, _, pools in samples:
        for name, (limit, resident, utility) in pools.items():
            out.setdefault(name, []).append((round(t, 1), round(limit / MB, 2), round(resident / MB, 2),
                                             float(f"{utility:.3g}") if utility is not None else None))
    return out


def cgroup_v1_root():
    root = "/sys/fs/cgroup/memory"
    if os.path.exists(os.path.join(root, "memory.limit_in_bytes")) and os.access(root, os.W_OK):
        return root
    return None


def cgroup_v2_root():
    root = "/sys/fs/cgroup"
    try:
        with open(os.path.join(root, "cgroup.controllers")) as f:
            if "memory" in f.read().split() and os.access(root, os.W_OK):
                return root
    except OSError:
        pass
    return None


def antagonist_code(target, hold_s):
    """Python code for the antagonist: 16 MiB chunks of touched memory as fast as it can up to
    `target` bytes, prints the MiB it took and the seconds that took, holds them `hold_s`
    seconds, leaves."""
    return ("import time\n"
            f"target={target}\n"
            "chunks=[]; t0=time.time()\n"
            "while len(chunks) * (16<<20) < target:\n"
            "    chunks.append(b'\\x01' * (16<<20))\n"
            f"t1=time.time(); print(len(chunks)*16, t1-t0, flush=True); time.sleep({hold_s})\n")


def oom_kills(cg, v2):
    """The OOM kills in memory cgroup `cg` so far (v2's memory.events, v1's oom_control)."""
    with open(os.path.join(cg, "memory.events" if v2 else "memory.oom_control")) as f:
        for line in f:
            k, v = line.split()
            if k == "oom_kill":
                return int(v)
    return 0


def remove_cgroup(cg):
    """Removes cgroup `cg` once its last process has gone (tries for 5 s)."""
    for _ in range(50):
        try:
            os.rmdir(cg)
            return
        except OSError:
            time.sleep(0.1)


def phase_pressure(specs, warm, recovery, ws, limit):
    """The three apps in a memory cgroup of `limit` bytes; after `warm` seconds an antagonist
    fills 90% of it, holds 3 s and leaves; the apps run on `recovery` seconds and 5 more."""
    v2 = cgroup_v2_root()
    v1 = None if v2 else cgroup_v1_root()
    if not (v1 or v2):
        return {"skipped": "no writable memory cgroup (v1 or v2): the pressure phase was NOT run"}
    cg = os.path.join(v2 or v1, f"gleaner-midas-{os.getpid()}")
    os.mkdir(cg)
    # The apps' length: warm-up, the antagonist (about 1 s to allocate, 3 s held; 4 s of
    # margin), the recovery time, its 5-s window and 2 s of margin.
    secs = warm + 8 + recovery + 5 + 2
    try:
        if v2:
            with open(os.path.join(cg, "memory.max"), "w") as f:
                f.write(str(limit))
        else:
            with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
                f.write(str(limit))
        procs = os.path.join(cg, "cgroup.procs")
        wrap = ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh"]
        sock = os.path.join(tempfile.gettempdir(), f"gleaner-midas-press-{os.getpid()}.sock")
        d = start_daemon(sock, ["--policy", "midas", "--cgroup", cg, "--interval", "1", "--probe", "4M",
                                "--move-max", "8M", "--step", "4M", "--initial", "8M", "--tick-ms", "10",
                                "--grace-ms", "100", "--reserve", str(48 * MB)])
        apps = [App(n, a, secs, node=sock, wrap=wrap) for n, a in specs]
        t_start = time.time()
        samples = []
        sampling = threading.Event()

        def sample():
            while not sampling.is_set():
                st = node_status(sock)
                if st:
                    samples.append((time.time() - t_start, sum(p["resident"] for p in st["pools"]),
                                    {p["name"]: (p["limit"], p["resident"], p.get("utility")) for p in st["pools"]}))
                time.sleep(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        time.sleep(max(0.0, warm - (time.time() - t_start)))
        before_soft = sum(p["resident"] for p in (node_status(sock) or {"pools": []})["pools"])
        target = int(limit * 0.9)
        ant_code = antagonist_code(target, 3)
        t_arr = time.time() - t_start
        ant = subprocess.Popen(wrap + [sys.executable, "-c", ant_code], stdout=subprocess.PIPE, text=True)
        ant_out, _ = ant.communicate(timeout=120)
        t_left = time.time() - t_start
        rcs = [a.wait(secs + 60) for a in apps]
        sampling.set()
        sampler.join(timeout=15)
        st_final = node_status(sock)
        stop(d)
        oom = oom_kills(cg, v2)
        parts = (ant_out or "").split()
        ant_mib, ant_secs = (int(parts[0]), float(parts[1])) if len(parts) == 2 else (None, None)
        # Throughput in the 5 s before the antagonist came against 5-s windows 5 s and
        # `recovery` s after it left; per wall second (the measure) and per CPU second
        # of each program (the neighbours on a shared machine moved the wall figure).
        # (Times are seconds since the apps started, which is what their reports count.)
        def windows(a, after):
            t0 = t_left + after
            t1 = min(t0 + 5, secs)
            wall = a.rate(t0, t1) / max(a.rate(t_arr - 5, t_arr), 1e-9)
            cpu = a.cpu_rate(t0, t1) / max(a.cpu_rate(t_arr - 5, t_arr), 1e-9)
            return wall, cpu
        rel, rel_cpu, rec, rec_cpu = [], [], [], []
        for a in apps:
            w, c = windows(a, 5)
            rel.append(w)
            rel_cpu.append(c)
            w, c = windows(a, recovery)
            rec.append(w)
            rec_cpu.append(c)
        # When the pools held 90% of what they held before the antagonist came, again.
        back = next((round(t - t_left, 1) for t, r, _ in samples
                     if t > t_left and r >= 0.9 * before_soft), None)
        stopped = sum(1 for rc in rcs if rc != 0) + (0 if ant.returncode == 0 else 1)
        direct = (st_final or {}).get("direct_punched_bytes")
        direct_s = (st_final or {}).get("direct_punch_secs")
        return {"cgroup": cg, "cgroup_version": 2 if v2 else 1, "limit": limit,
                "soft_before_bytes": before_soft,
                "antagonist_mib": ant_mib, "antagonist_secs": ant_secs,
                "antagonist_gib_per_s": (ant_mib / 1024 / ant_secs) if ant_mib and ant_secs else None,
                "antagonist_rc": ant.returncode, "oom_kills": oom,
                "stopped_programs": stopped, "app_rcs": rcs,
                "bad_reads": sum(a.bad() or 0 for a in apps),
                "direct_punched_bytes": direct, "direct_punch_secs": direct_s,
                "direct_gib_per_s": (direct / 2**30 / direct_s) if direct and direct_s else None,
                "throughput_after_vs_before": rel,
                "throughput_after_vs_before_cpu": rel_cpu,
                "recovery_s": recovery,
                "throughput_recovered_vs_before": rec,
                "throughput_recovered_vs_before_cpu": rec_cpu,
                "arrived_s": t_arr, "left_s": t_left, "app_secs": secs,
                "soft_back_to_90pct_s_after_leaving": back,
                "pool_series": pool_series(samples)}
    finally:
        remove_cgroup(cg)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short phases (under 10 minutes)")
    ap.add_argument("--out", help="results file (default bench/results/midas/midas[-quick].json)")
    ap.add_argument("--no-pressure", action="store_true", help="skip the antagonist phase")
    ap.add_argument("--policies", help="comma-separated policies to run (default: midas, static and "
                    "cliffhanger, and midas-victim in the full run); the summary then names only those")
    ap.add_argument("--recovery-s", type=float, default=30,
                    help="measure the apps' throughput this many seconds after the antagonist "
                         "leaves, against before it came (default 30, the issue's target)")
    args = ap.parse_args()
    for b in ("gleaner", "soft-workload"):
        if not os.path.exists(os.path.join(BIN, b)):
            raise SystemExit(f"{BIN}/{b} is missing: run `cargo build --release` first")
    objects, size = 2048, 16384
    ws = objects * size
    budget = 3 * ws // 2
    secs_ideal, secs_policy = (20, 45) if args.quick else (40, 120)
    policies = ["midas", "static", "cliffhanger"] + ([] if args.quick else ["midas-victim"])
    if args.policies:
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        unknown = set(policies) - {"midas", "static", "cliffhanger", "midas-victim"}
        if unknown:
            raise SystemExit(f"--policies: unknown {sorted(unknown)}: give midas, static, cliffhanger or midas-victim")
    tmp = tempfile.mkdtemp(prefix="gleaner-midas-")
    blocks = os.path.join(tmp, "blocks")
    make_file(blocks, ws)
    specs = app_specs(objects, size, blocks)
    t_begin = time.time()
    print(f"ideal (all cached): 3 apps x {ws // MB} MiB, {secs_ideal} s", file=sys.stderr)
    ideal = phase_ideal(specs, secs_ideal, ws)
    runs = {}
    for p in policies:
        print(f"policy {p}: budget {budget // MB} MiB, {secs_policy} s", file=sys.stderr)
        runs[p] = phase_policy(p, specs, secs_policy, budget, ideal, args.quick)
        print(f"  efficiency {runs[p]['efficiency']:.3f} harvested {runs[p]['harvested_fraction']}",
              file=sys.stderr)
    pressure = None
    if not args.no_pressure:
        print("pressure: antagonist in a memory cgroup", file=sys.stderr)
        pressure = phase_pressure(specs, 15 if args.quick else 20, args.recovery_s, ws, 512 * MB)
    os.unlink(blocks)
    os.rmdir(tmp)
    bad = sum((a.get("bad") or 0) for r in runs.values() for a in r["apps"].values())
    bad += sum((a.get("bad") or 0) for a in ideal.values())
    if pressure and "bad_reads" in pressure:
        bad += pressure["bad_reads"]
    git = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    res = {
        "script": "bench/midas.py" + (" --quick" if args.quick else ""),
        "command": " ".join(["python3", "bench/midas.py"] + sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "git_commit": git.stdout.strip(),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
        "params": {"objects": objects, "size": size, "working_set_each": ws, "budget": budget,
                   "secs_ideal": secs_ideal, "secs_policy": secs_policy, "zipf": 0.9, "base_us": 20,
                   "rebuild_us": {"storage": "pread + 10", "memo-100us": 100, "memo-1ms": 1000}},
        "ideal": ideal, "runs": runs, "pressure": pressure, "bad_reads": bad,
        "wall_s": time.time() - t_begin,
    }
    out = args.out or os.path.join(ROOT, "bench", "results", "midas",
                                   "midas-quick.json" if args.quick else "midas.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    eff = {p: runs[p]["efficiency"] for p in runs}

    def ratio(a, b):
        return eff[a] / eff[b] if a in eff and b in eff else None

    summary = {
        "efficiency_midas": eff.get("midas"),
        "efficiency_static": eff.get("static"),
        "efficiency_cliffhanger": eff.get("cliffhanger"),
        "efficiency_wall": {p: runs[p]["efficiency_wall"] for p in runs},
        "midas_vs_static": ratio("midas", "static"),
        "midas_vs_cliffhanger": ratio("midas", "cliffhanger"),
        "harvested_fraction": (runs.get("midas") or {}).get("harvested_fraction"),
        "settle_s_midas": (runs.get("midas") or {}).get("settle_s"),
        "oom_kills": (pressure or {}).get("oom_kills"),
        "stopped_programs": (pressure or {}).get("stopped_programs"),
        "direct_reclaim_gib_per_s": (pressure or {}).get("direct_gib_per_s"),
        "recovered_min_vs_before": min((pressure or {}).get("throughput_recovered_vs_before") or [None],
                                       key=lambda v: v if v is not None else 0),
        "recovered_min_vs_before_cpu": min((pressure or {}).get("throughput_recovered_vs_before_cpu") or [None],
                                           key=lambda v: v if v is not None else 0),
        "recovery_s": args.recovery_s,
        "pressure": "not run" if pressure is None else pressure.get("skipped", "run"),
        "bad_reads": bad,
        "results": os.path.relpath(out, ROOT),
    }
    if "midas-victim" in eff:
        summary["efficiency_midas_victim"] = eff["midas-victim"]
    print(json.dumps(summary))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
