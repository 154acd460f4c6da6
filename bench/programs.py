#!/usr/bin/env python3
"""Slowdown of real, unmodified programs under `gleaner run` at 50% and 25% local memory,
relative to the same program all-local, every configuration measured in the same run.

For each program the all-local run comes first and gives the footprint (peak RSS: VmHWM of the
server, or ru_maxrss of a batch job); the budgets are then 50% and 25% of that footprint.
Each configuration is repeated (--reps, the median is reported) and its data is verified
(the same checksum as all-local, or every value read back and compared).

    python3 bench/programs.py [--reps 3] [--out bench/results/programs.json]

Programs: python3 (scripts/demo_job.py), the C test program (tests/c/preload_program.c
`mixed`), memcached (load 256 MiB of 64 KiB values, read all back), redis-server (SET then GET
of ~160 MB). Needs a release build (cargo build --release) and scripts/setup.sh's packages.
"""

import argparse
import json
import os
import platform
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLEANER = os.path.join(ROOT, "target", "release", "gleaner")
RATIOS = [50, 25]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher(budget, stats):
    """The command prefix: nothing for all-local, `gleaner run` otherwise."""
    if budget is None:
        return []
    return [GLEANER, "run", "-q", "--local-mem", str(budget), "--stats", stats, "--"]


def read_stats(path):
    try:
        with open(path) as f:
            t = json.load(f)["total"]
    except (OSError, ValueError, KeyError):
        return {}
    return {
        "remote_faults": t.get("faults", {}).get("remote", 0),
        "zero_fill_faults": t.get("faults", {}).get("zero_fill", 0),
        "evicted_dirty": t.get("evictions", {}).get("dirty", 0),
        "evicted_clean": t.get("evictions", {}).get("clean", 0),
        "bytes_in": t.get("bytes_in", 0),
        "bytes_out": t.get("bytes_out", 0),
        "remote_fault_p50_us": t.get("remote_fault_latency", {}).get("p50_us", 0),
    }


# ---- batch programs ------------------------------------------------------------------------


def batch(cmd, budget, tmp):
    """Runs a batch command; returns (seconds, stdout, peak RSS in bytes of the children)."""
    stats = os.path.join(tmp, "stats.json")
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.monotonic()
    p = subprocess.run(launcher(budget, stats) + cmd, capture_output=True, text=True, timeout=900)
    elapsed = time.monotonic() - start
    if p.returncode != 0:
        raise RuntimeError(f"{cmd} failed ({p.returncode}): {p.stderr[-2000:]}")
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return elapsed, p.stdout, max(rss, before * 1024), read_stats(stats)


def python_job(python):
    script = os.path.join(ROOT, "scripts", "demo_job.py")

    def run(budget, tmp):
        t, out, rss, st = batch([python, script, "50000"], budget, tmp)
        return t, out.split(" in ")[0], rss, st

    return run


def c_program(tmp_root):
    exe = os.path.join(tmp_root, "preload_program")
    subprocess.run(
        ["cc", "-O1", "-pthread", os.path.join(ROOT, "tests/c/preload_program.c"), "-o", exe],
        check=True,
    )

    def run(budget, tmp):
        t, out, rss, st = batch([exe, "mixed", "96"], budget, tmp)
        return t, out.strip(), rss, st

    return run


# ---- servers -------------------------------------------------------------------------------


def value(i, n):
    seed = (i * 2654435761) & 0xFFFFFFFF
    return (seed.to_bytes(4, "little") * (n // 4 + 1))[:n]


def start_server(cmd, budget, tmp, port):
    stats = os.path.join(tmp, "stats.json")
    p = subprocess.Popen(
        launcher(budget, stats) + cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            return p, socket.create_connection(("127.0.0.1", port)), stats
        except OSError:
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{cmd[0]} did not start: {p.stderr.read().decode()[-2000:]}")
            time.sleep(0.05)


def server_pid(launcher_proc, budget, name):
    """The server's own pid (the launcher's child under gleaner)."""
    if budget is None:
        return launcher_proc.pid
    out = subprocess.run(["pgrep", "-P", str(launcher_proc.pid), name], capture_output=True, text=True)
    return int(out.stdout.split()[0])


def vm_hwm(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def stop(proc, sock):
    sock.close()
    proc.terminate()
    proc.wait(timeout=60)


def memcached_job(binary):
    n, size = 4096, 64 * 1024

    def run(budget, tmp):
        port = free_port()
        cmd = [binary, "-p", str(port), "-U", "0", "-l", "127.0.0.1", "-m", "600", "-t", "2", "-u", "root"]
        proc, sock, stats = start_server(cmd, budget, tmp, port)
        f = sock.makefile("rb")
        start = time.monotonic()
        for b in range(0, n, 32):
            sock.sendall(b"".join(b"set k%d 0 0 %d\r\n%s\r\n" % (i, size, value(i, size)) for i in range(b, b + 32)))
            for _ in range(32):
                assert f.readline() == b"STORED\r\n"
        bad = 0
        for i in range(n):
            sock.sendall(b"get k%d\r\n" % i)
            f.readline()
            data = f.read(size + 2)[:-2]
            f.readline()
            bad += data != value(i, size)
        elapsed = time.monotonic() - start
        rss = vm_hwm(server_pid(proc, budget, "memcached"))
        stop(proc, sock)
        if bad:
            raise RuntimeError(f"memcached returned {bad} wrong values")
        return elapsed, f"{n} values verified", rss, read_stats(stats)

    return run


def resp(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def redis_job(binary):
    n = 20000

    def run(budget, tmp):
        port = free_port()
        cmd = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp]
        proc, sock, stats = start_server(cmd, budget, tmp, port)
        f = sock.makefile("rb")
        start = time.monotonic()
        for b in range(0, n, 64):
            sock.sendall(b"".join(resp("SET", f"k{i}", value(i, 6000 + i % 4000)) for i in range(b, b + 64)))
            for _ in range(64):
                assert f.readline() == b"+OK\r\n"
        bad = 0
        for b in range(0, n, 64):
            sock.sendall(b"".join(resp("GET", f"k{i}") for i in range(b, b + 64)))
            for i in range(b, b + 64):
                ln = int(f.readline()[1:])
                bad += f.read(ln + 2)[:-2] != value(i, 6000 + i % 4000)
        elapsed = time.monotonic() - start
        rss = vm_hwm(server_pid(proc, budget, "redis-server"))
        stop(proc, sock)
        if bad:
            raise RuntimeError(f"redis returned {bad} wrong values")
        return elapsed, f"{n} values verified", rss, read_stats(stats)

    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "programs.json"))
    ap.add_argument("--only", help="comma-separated subset: python,c,memcached,redis")
    args = ap.parse_args()
    if not os.access(GLEANER, os.X_OK):
        sys.exit(f"{GLEANER} is missing: cargo build --release first")
    tmp_root = tempfile.mkdtemp(prefix="gleaner-programs-")
    python = subprocess.run(["python3", "-c", "import sys; print(sys.executable)"], capture_output=True, text=True).stdout.strip()
    programs = {
        "python": python_job(python),
        "c": c_program(tmp_root),
        "memcached": memcached_job(shutil.which("memcached")),
        "redis": redis_job(shutil.which("redis-server")),
    }
    if args.only:
        programs = {k: v for k, v in programs.items() if k in args.only.split(",")}
    results = {
        "command": "python3 bench/programs.py " + " ".join(sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": python},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "reps": args.reps,
        "programs": {},
    }
    try:
        for name, job in programs.items():
            runs = {}
            base = [job(None, tmp_root) for _ in range(args.reps)]
            footprint = max(r[2] for r in base)
            expect = base[0][1]
            runs["all-local"] = {"seconds": [r[0] for r in base], "peak_rss": footprint}
            for ratio in RATIOS:
                budget = footprint * ratio // 100
                reps = []
                for _ in range(args.reps):
                    d = tempfile.mkdtemp(dir=tmp_root)
                    t, out, rss, st = job(budget, d)
                    if out != expect:
                        raise RuntimeError(f"{name} at {ratio}%: output {out!r} differs from all-local {expect!r}")
                    reps.append((t, rss, st))
                runs[f"{ratio}%"] = {
                    "budget_bytes": budget,
                    "seconds": [r[0] for r in reps],
                    "peak_rss": max(r[1] for r in reps),
                    "stats": reps[len(reps) // 2][2],
                }
            local = statistics.median(runs["all-local"]["seconds"])
            for ratio in RATIOS:
                r = runs[f"{ratio}%"]
                r["slowdown"] = statistics.median(r["seconds"]) / local
            results["programs"][name] = runs
            print(
                f"{name:10s} all-local {local:7.2f} s, footprint {footprint / 2**20:6.0f} MiB | "
                + " | ".join(f"{ratio}%: {statistics.median(runs[f'{ratio}%']['seconds']):7.2f} s ({runs[f'{ratio}%']['slowdown']:.1f}x)" for ratio in RATIOS),
                flush=True,
            )
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
