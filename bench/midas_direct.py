#!/usr/bin/env python3
"""Direct reclaim at scale: how fast the node daemon takes soft memory back from a program that
does not cooperate.

    sudo python3 bench/midas_direct.py [--soft 1G] [--reps 3] [--out FILE]

One `soft-workload` (memo kind, uniform reads, 64 KiB objects) fills `--soft` of soft memory in
a memory cgroup (cgroup v1 or v2) twice that size plus the reserve, registered with a
`gleaner node --cgroup` daemon (tick 10 ms). Once its pool holds what it asked for, the program
is stopped (SIGSTOP: its runtime cannot shrink by itself), and an antagonist in the same cgroup
allocates touched memory in 16 MiB chunks as fast as it can up to 90% of the limit: the daemon
must take the soft memory back directly (`fallocate(PUNCH_HOLE)` on the pool's segments,
coldest first). Reported per run: the bytes the daemon punched and the seconds its punching
took (measured inside the daemon: the punch calls with their `SEEK_DATA` and `fstat`, so the
rate is the mechanism's, not the scheduler's), the wall time from the antagonist's start until
the pool was down to (within 16 MiB of) the least it was taken to, OOM kills, and, after SIGCONT, the program's wrong
reads (every value it reads is checked; a punched object must be a miss that is rebuilt).

Writes the JSON results to --out (default bench/results/midas/direct.json) and prints one JSON
summary line: `direct_gib_per_s` (median), `oom_kills`, `bad_reads`. Needs root (cgroups).
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from bench.midas import (BIN, MB, App, cgroup_v1_root, cgroup_v2_root, node_status,  # noqa: E402
                         antagonist_code, oom_kills, remove_cgroup, start_daemon, stop)

OBJECT = 64 * 1024
RESERVE = 64 * MB


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper()
    return int(float(s[:-1]) * units[s[-1]]) if s[-1] in units else int(s)


def pool_resident(sock):
    st = node_status(sock) or {}
    return sum(p.get("resident", 0) for p in st.get("pools", [])), st


def one_run(soft, rep):
    v2 = cgroup_v2_root()
    v1 = None if v2 else cgroup_v1_root()
    if not (v1 or v2):
        raise SystemExit("midas_direct.py: no writable memory cgroup (v1 or v2): needs root")
    limit = 2 * soft + RESERVE
    cg = os.path.join(v2 or v1, f"gleaner-direct-{os.getpid()}-{rep}")
    os.mkdir(cg)
    sock = f"/tmp/gleaner-direct-{os.getpid()}-{rep}.sock"
    d = app = ant = None
    try:
        with open(os.path.join(cg, "memory.max" if v2 else "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit))
        procs = os.path.join(cg, "cgroup.procs")
        wrap = ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh"]
        d = start_daemon(sock, ["--policy", "static", "--cgroup", cg, "--tick-ms", "10",
                                "--grace-ms", "100", "--reserve", str(RESERVE),
                                "--initial", str(soft + 8 * MB), "--soft-budget", str(soft + 8 * MB)])
        objects = soft // OBJECT
        app = App("direct", ["--objects", str(objects), "--size", str(OBJECT), "--kind", "memo",
                             "--cost-us", "0", "--base-us", "0", "--zipf", "0"],
                  600, node=sock, wrap=wrap)
        # Filled: the pool holds 95% of what it asked for (or 60 s passed).
        t0 = time.time()
        held = 0
        while time.time() - t0 < 60:
            held, _ = pool_resident(sock)
            if held >= 0.95 * soft:
                break
            time.sleep(0.2)
        fill_s = time.time() - t0
        os.kill(app.proc.pid, signal.SIGSTOP)
        target = int(limit * 0.9)
        ant_code = antagonist_code(target, 2)
        t_ant = time.time()
        ant = subprocess.Popen(wrap + [sys.executable, "-c", ant_code], stdout=subprocess.PIPE,
                               text=True)
        # The pool's residency as the antagonist comes, every 50 ms (each reading is a
        # `gleaner node status` process: more often and the readings compete with the daemon
        # for the CPUs).
        series = []
        while ant.poll() is None:
            r, _ = pool_resident(sock)
            series.append((round(time.time() - t_ant, 3), r))
            time.sleep(0.05)
        # Given back: the first sample within 16 MiB of the lowest the pool was taken to.
        low = min(r for _, r in series) if series else held
        given_back_at = next((t for t, r in series if r <= low + 16 * MB), None)
        ant_out = ant.stdout.read()
        ant_rc = ant.returncode
        _, st = pool_resident(sock)
        # Let it read on for 2 s: its punched objects must be misses that are rebuilt.
        os.kill(app.proc.pid, signal.SIGCONT)
        time.sleep(2)
        app.proc.send_signal(signal.SIGTERM)
        app_rc = app.wait(30)
        parts = (ant_out or "").split()
        punched = st.get("direct_punched_bytes") or 0
        secs = st.get("direct_punch_secs") or 0.0
        return {
            "rep": rep, "soft_bytes": soft, "cgroup_limit": limit,
            "cgroup_version": 2 if v2 else 1, "fill_s": round(fill_s, 2), "held_before": held,
            "antagonist_mib": int(parts[0]) if len(parts) == 2 else None,
            "antagonist_s": float(parts[1]) if len(parts) == 2 else None,
            "antagonist_rc": ant_rc,
            "direct_punched_bytes": punched, "direct_punch_secs": secs,
            "direct_gib_per_s": punched / 2**30 / secs if punched and secs else None,
            "given_back_after_s": given_back_at, "lowest_held": low,
            "resident_series": series,
            "oom_kills": oom_kills(cg, v2),
            "app_rc": app_rc, "bad_reads": app.bad(),
        }
    finally:
        for p in (app.proc if app else None, ant):
            if p and p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                except OSError:
                    pass
                p.kill()
                p.wait()
        stop(d)
        remove_cgroup(cg)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--soft", default="1G", help="soft memory the program fills (default 1G)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "midas", "direct.json"))
    args = ap.parse_args()
    for b in ("gleaner", "soft-workload"):
        if not os.path.exists(os.path.join(BIN, b)):
            raise SystemExit(f"{BIN}/{b} is missing: run `cargo build --release` first")
    soft = parse_size(args.soft)
    runs = []
    for rep in range(args.reps):
        r = one_run(soft, rep)
        print(f"rep {rep}: punched {r['direct_punched_bytes'] / MB:.0f} MiB in "
              f"{r['direct_punch_secs']:.3f} s ({r['direct_gib_per_s'] or 0:.2f} GiB/s), down to "
              f"{r['lowest_held'] / MB:.0f} MiB {r['given_back_after_s']} s after the antagonist "
              f"started (it took {r['antagonist_s'] or 0:.2f} s), OOM kills {r['oom_kills']}, "
              f"bad reads {r['bad_reads']}", file=sys.stderr)
        runs.append(r)
    git = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True)
    rates = [r["direct_gib_per_s"] for r in runs if r["direct_gib_per_s"]]
    res = {"script": "bench/midas_direct.py", "command": " ".join(["python3"] + sys.argv),
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "git_commit": git.stdout.strip(),
           "machine": {"cpus": os.cpu_count(), "kernel": os.uname().release,
                       "loadavg_at_start": os.getloadavg()[0]},
           "runs": runs}
    summary = {"direct_gib_per_s": statistics.median(rates) if rates else None,
               "punched_mib": [round(r["direct_punched_bytes"] / MB) for r in runs],
               "given_back_after_s": [r["given_back_after_s"] for r in runs],
               "antagonist_s": [r["antagonist_s"] for r in runs],
               "oom_kills": sum(r["oom_kills"] for r in runs),
               "bad_reads": sum(r["bad_reads"] or 0 for r in runs),
               "app_rcs": [r["app_rc"] for r in runs]}
    res["summary"] = summary
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(summary))
    return 1 if summary["bad_reads"] or summary["oom_kills"] else 0


if __name__ == "__main__":
    sys.exit(main())
