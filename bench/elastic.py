#!/usr/bin/env python3
"""Elastic budgets (issue 46, "one arbiter for local memory"): two `gleaner run` programs whose
working sets trade sizes halfway through, under the node daemon against fixed equal budgets, in
one run.

    python3 bench/elastic.py --quick        # about 2 minutes; last line: one JSON object
    python3 bench/elastic.py                # more repetitions
    python3 bench/elastic.py --out FILE     # where the results go

Needs a release build (`cargo build --workspace --release`: target/release/gleaner and the
preload library).

The programs are `bench/elastic_workload.py` on the real Python interpreter: each holds one
buffer, sweeps a working set of BIG MiB, then one of SMALL MiB (the other the other way round),
each phase sweeping the same number of pages, so they trade sizes halfway through; every page
read is checked (a stamp and a per-page count of the sweeps that wrote it), and a run with a
wrong read fails the benchmark.

* fixed:  `gleaner run --local-mem TOTAL/2` each (the static equal partition);
* daemon: `gleaner run --local-mem FLOOR..CEILING` each under one `gleaner node
  --elastic-budget TOTAL` (a daemon of this run's own, on a socket of its own), which moves
  local memory to the program losing more time to far faults.

The two modes alternate, `--reps` times each. Reported: each run's makespan (both programs
finished), each program's wall time and phases, and for the daemon runs the grants sampled every
250 ms from the daemon's status (with the most the pagers applied together, which the daemon
keeps within the total: a giver's budget falls before the gainer's rises). The figure: the median fixed makespan over the median daemon
makespan (target: >= 1.3).

Writes bench/results/elastic/elastic[-quick].json; prints a summary and, as the last line, one
JSON object with speedup, the medians and bad_runs. Exit status 0, or 1 if a program failed.
"""
import argparse
import json
import os
import platform
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLEANER = os.path.join(ROOT, "target", "release", "gleaner")
WORKLOAD = os.path.join(ROOT, "bench", "elastic_workload.py")
MIB = 1 << 20


def python_exe():
    """The interpreter itself (not a version manager's shim, which would start more processes
    under the preload library)."""
    return subprocess.run(["python3", "-c", "import sys; print(sys.executable)"],
                          capture_output=True, text=True, check=True).stdout.strip()


def node_status(sock):
    """The daemon's state (the protocol of `gleaner node status`), or None."""
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2)
        s.connect(sock)
        body = json.dumps({"op": "status"}).encode()
        s.sendall(struct.pack("<I", len(body)) + body)
        hdr = b""
        while len(hdr) < 4:
            hdr += s.recv(4 - len(hdr))
        (n,) = struct.unpack("<I", hdr)
        data = b""
        while len(data) < n:
            data += s.recv(n - len(data))
        s.close()
        return json.loads(data)["state"]
    except (OSError, ValueError, KeyError):
        return None


def workload_args(p, first_big):
    big, small = p["big_mib"], p["small_mib"]
    big_passes = p["big_passes"]
    # The same pages swept in either phase: the small phase makes up in passes.
    small_passes = big_passes * big // small
    if first_big:
        return ["--first-mib", str(big), "--second-mib", str(small),
                "--passes", str(big_passes), "--second-passes", str(small_passes)]
    return ["--first-mib", str(small), "--second-mib", str(big),
            "--passes", str(small_passes), "--second-passes", str(big_passes)]


def run_mode(mode, p, py, tmp):
    """One run of both programs; returns its record."""
    env = dict(os.environ)
    node = None
    sock = os.path.join(tmp, f"node-{mode}.sock")
    if mode == "daemon":
        local = f"{p['floor_mib']}M..{p['ceiling_mib']}M"
        env["GLEANER_NODE_SOCKET"] = sock
        node = subprocess.Popen(
            [GLEANER, "node", "--socket", sock, "--interval", str(p["interval_s"]),
             "--tick-ms", "50", "--elastic-budget", f"{p['total_mib']}M",
             "--elastic-step", f"{p['step_mib']}M"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 5
        while node_status(sock) is None:
            if time.time() > deadline:
                node.kill()
                raise SystemExit("gleaner node did not answer")
            time.sleep(0.05)
    else:
        local = f"{p['total_mib'] // 2}M"
    progs = []
    t0 = time.monotonic()
    for name, first_big in (("a", True), ("b", False)):
        e = dict(env, GLEANER_ELASTIC_NAME=name)
        cmd = [GLEANER, "run", "-q", "--local-mem", local,
               "--stats", os.path.join(tmp, f"{mode}-{name}.json"), "--", py, WORKLOAD]
        cmd += workload_args(p, first_big)
        progs.append((name, subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, text=True), cmd))
    samples = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            st = node_status(sock)
            if st:
                samples.append({"t": round(time.monotonic() - t0, 2), "programs": {
                    q["name"].split(" ")[0]: {"limit_mib": q["limit"] >> 20,
                                              "applied_mib": q["budget_applied"] >> 20,
                                              "loss_ms_per_s": round(q["loss_ns_per_s"] / 1e6, 2)}
                    for q in st["programs"]}})
            stop.wait(0.25)

    sampler = threading.Thread(target=sample) if node else None
    if sampler:
        sampler.start()
    out = {}
    ok = True
    for name, proc, cmd in progs:
        stdout, stderr = proc.communicate(timeout=900)
        done = time.monotonic() - t0
        rec = {"exit": proc.returncode, "finished_s": round(done, 3), "command": cmd}
        try:
            rec["result"] = json.loads(stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            rec["result"] = None
        if proc.returncode != 0 or rec["result"] is None:
            ok = False
            rec["stderr_tail"] = stderr[-2000:]
        out[name] = rec
    makespan = time.monotonic() - t0
    if sampler:
        stop.set()
        sampler.join()
    if node:
        node.terminate()
        node.wait(timeout=10)
    return {"mode": mode, "local_mem": local, "makespan_s": round(makespan, 3), "ok": ok,
            "programs": out, "grants": samples}


def within_range(run, p):
    """Whether every sampled grant and applied budget stayed within the floor..ceiling."""
    lo, hi = p["floor_mib"], p["ceiling_mib"]
    for s in run["grants"]:
        for q in s["programs"].values():
            if not lo <= q["limit_mib"] <= hi:
                return False
            if q["applied_mib"] and not lo <= q["applied_mib"] <= hi:
                return False
    return True


def peak_applied(run):
    """The most the programs' pagers applied together at one sample, MiB."""
    return max((sum(q["applied_mib"] for q in s["programs"].values()) for s in run["grants"]),
               default=0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 repetitions per mode (~2 min)")
    ap.add_argument("--reps", type=int, help="repetitions per mode (default 3 quick, 7 full)")
    ap.add_argument("--out", help="results file")
    a = ap.parse_args()
    p = {"total_mib": 256, "floor_mib": 48, "ceiling_mib": 208, "big_mib": 160,
         "small_mib": 24, "big_passes": 60, "interval_s": 0.5, "step_mib": 64,
         "reps": a.reps or (3 if a.quick else 7)}
    if not os.path.exists(GLEANER):
        raise SystemExit(f"{GLEANER} is missing: cargo build --workspace --release")
    py = python_exe()
    runs = []
    with tempfile.TemporaryDirectory(prefix="gleaner-elastic-") as tmp:
        for i in range(p["reps"]):
            order = ("fixed", "daemon") if i % 2 == 0 else ("daemon", "fixed")
            for mode in order:
                r = run_mode(mode, p, py, tmp)
                runs.append(r)
                print(f"rep {i} {mode:6}: makespan {r['makespan_s']:.1f} s "
                      f"(a {r['programs']['a']['finished_s']:.1f} s, "
                      f"b {r['programs']['b']['finished_s']:.1f} s){'' if r['ok'] else ' FAILED'}",
                      flush=True)
    fixed = [r["makespan_s"] for r in runs if r["mode"] == "fixed"]
    daemon = [r["makespan_s"] for r in runs if r["mode"] == "daemon"]
    bad = [r for r in runs if not r["ok"]]
    git = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    summary = {
        "speedup": round(statistics.median(fixed) / statistics.median(daemon), 3),
        "fixed_makespan_s": round(statistics.median(fixed), 2),
        "daemon_makespan_s": round(statistics.median(daemon), 2),
        "target_speedup": 1.3,
        "grants_within_range": all(within_range(r, p) for r in runs if r["mode"] == "daemon"),
        # The daemon never lets the budgets the pagers apply exceed the total together.
        "peak_applied_sum_mib": max(peak_applied(r) for r in runs if r["mode"] == "daemon"),
        "total_mib": p["total_mib"],
        "bad_runs": len(bad),
    }
    res = {
        "benchmark": "elastic",
        "command": "python3 bench/elastic.py" + (" --quick" if a.quick else "")
                   + (f" --reps {a.reps}" if a.reps else ""),
        "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "git_commit": git.stdout.strip(),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "cpu": next((ln.split(":", 1)[1].strip() for ln in
                                 open("/proc/cpuinfo") if ln.startswith("model name")), "?")},
        "params": p,
        "summary": summary,
        "runs": runs,
    }
    out = a.out or os.path.join(ROOT, "bench", "results", "elastic",
                                "elastic-quick.json" if a.quick else "elastic.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"fixed {summary['fixed_makespan_s']} s, daemon {summary['daemon_makespan_s']} s: "
          f"{summary['speedup']}x sooner under the daemon (target 1.3x); results in {out}")
    print(json.dumps(summary))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
