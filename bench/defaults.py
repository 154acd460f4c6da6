#!/usr/bin/env python3
"""Which configuration `gleaner run` uses when given no flags, and the measurements behind it.

    python3 bench/defaults.py              # 3 interleaved reps of every configuration, then render
    python3 bench/defaults.py --quick      # 1 rep, 64M micro runs (a smoke run)
    python3 bench/defaults.py --render-only

Every configuration is the defaults with one knob changed (plus `previous`, the defaults before
the shared-memory data path: two unpinned handlers, synchronous tracking, the socket, no
prefetch, batches of 32), run on the same workloads in the same session, repetitions
interleaved in a rotated order:

* `gleaner bench micro --pattern P --size S --local 50% --pin-cpu 0` for seq, stride:10, random
  (the program's thread pinned to CPU 0; every word checked);
* the quick-start demo job, `gleaner run --local-mem 64M -- python3 scripts/demo_job.py 50000`
  (wall time, and the far memory at its peak from its stats, `total.store.peak_resident_bytes`;
  its checksum must match the all-local run's).

Writes bench/results/defaults.json and the defaults section of bench/results/DETAILS.md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from bench.doc_section import DOC, write_section  # noqa: E402
from bench.harness.common import GLEANER, git_commit, machine, now_iso, python_exe  # noqa: E402

BEGIN, END = "<!-- defaults:begin -->", "<!-- defaults:end -->"
OUT = os.path.join(ROOT, "bench", "results", "defaults.json")
DEMO = os.path.join(ROOT, "scripts", "demo_job.py")
PATTERNS = ["seq", "stride:10", "random"]

# name -> (what it changes, bench micro flags, gleaner run flags, gleaner run environment)
CONFIGS = {
    "defaults": ("the defaults", [], [], {}),
    "previous": ("before this work: 2 unpinned handlers, sync tracking, socket, no prefetch, "
                 "batches of 32, FIFO eviction",
                 ["--handlers", "2", "--unpinned-handlers", "--dirty-tracking", "sync",
                  "--data-path", "socket", "--prefetch", "none", "--evict-batch", "32",
                  "--evict", "fifo"],
                 ["--handlers", "2", "--dirty-tracking", "sync", "--data-path", "socket",
                  "--prefetch", "none", "--evict", "fifo"],
                 {"GLEANER_PIN_HANDLERS": "0", "GLEANER_EVICT_BATCH": "32"}),
    "unpinned": ("handlers not pinned (one per CPU)", ["--unpinned-handlers"], [],
                 {"GLEANER_PIN_HANDLERS": "0"}),
    "one-handler": ("one handler, not pinned", ["--handlers", "1", "--unpinned-handlers"],
                    ["--handlers", "1"], {"GLEANER_PIN_HANDLERS": "0"}),
    "spin-20us": ("handlers poll 20 µs before blocking", ["--handler-spin-us", "20"], [],
                  {"GLEANER_HANDLER_SPIN_US": "20"}),
    "spin-100us": ("handlers poll 100 µs before blocking", ["--handler-spin-us", "100"], [],
                   {"GLEANER_HANDLER_SPIN_US": "100"}),
    "sync": ("synchronous dirty tracking", ["--dirty-tracking", "sync"],
             ["--dirty-tracking", "sync"], {}),
    "socket": ("the socket data path (sync tracking, as auto picks there)",
               ["--data-path", "socket"], ["--data-path", "socket"], {}),
    "no-prefetch": ("no prefetching", ["--prefetch", "none"], ["--prefetch", "none"], {}),
    "fifo": ("FIFO eviction (the default until 2026-11-26)", ["--evict", "fifo"],
             ["--evict", "fifo"], {}),
    "clock": ("CLOCK eviction", ["--evict", "clock"], ["--evict", "clock"], {}),
    "refault": ("refault eviction (pages back soon after leaving are protected)",
                ["--evict", "refault"], ["--evict", "refault"], {}),
    "batch-32": ("eviction batches of 32 pages", ["--evict-batch", "32"], [],
                 {"GLEANER_EVICT_BATCH": "32"}),
    "batch-64": ("eviction batches of 64 pages", ["--evict-batch", "64"], [],
                 {"GLEANER_EVICT_BATCH": "64"}),
}


def log(msg):
    print(f"[defaults] {msg}", file=sys.stderr, flush=True)


def micro(pattern, size, flags):
    cmd = [GLEANER, "bench", "micro", "--pattern", pattern, "--size", size, "--local", "50%",
           "--json", "--floor-samples", "0", "--pin-cpu", "0"] + flags
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    rec = {"command": " ".join(cmd), "rc": p.returncode}
    if p.returncode != 0:
        rec["error"] = p.stderr[-2000:]
        return rec
    r = json.loads(p.stdout)
    a = r["remote_fault_app_visible"]
    rec.update(ok=r["checksum_ok"], ns_per_op=r["ns_per_op"], faults=a["count"],
               mean_us=a["mean_us"], p50_us=a["p50_us"], p99_us=a["p99_us"],
               stats={k: r["region"][k] for k in ("faults", "fault_breakdown", "evictions",
                                                  "store", "dirty_tracking")})
    return rec


def demo(flags, env, want):
    py = python_exe()
    with tempfile.TemporaryDirectory(prefix="gleaner-defaults-") as tmp:
        stats = os.path.join(tmp, "stats.json")
        cmd = ([GLEANER, "run", "-q", "--local-mem", "64M", "--stats", stats] + flags
               + ["--", py, DEMO, "50000"])
        e = dict(os.environ, **env)
        t0 = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=900)
        wall = time.monotonic() - t0
        try:
            with open(stats) as f:
                far_peak = json.load(f)["total"]["store"]["peak_resident_bytes"]
        except (OSError, ValueError, KeyError):
            far_peak = None
        cmd[cmd.index("--stats") + 1] = "STATS.json"
    out = p.stdout.strip().splitlines()
    got = out[-1].split()[1] if out and out[-1].startswith("checksum") else None
    rec = {"command": " ".join(f"{k}={v}" for k, v in env.items()).strip() + " " + " ".join(cmd),
           "rc": p.returncode, "wall_s": wall, "far_peak_bytes": far_peak, "checksum": got,
           "ok": p.returncode == 0 and got == want}
    if not rec["ok"]:
        rec["error"] = p.stderr[-2000:] or f"checksum {got}, all-local {want}"
    return rec


def all_local_checksum():
    p = subprocess.run([python_exe(), DEMO, "50000"], capture_output=True, text=True, check=True)
    line = p.stdout.strip().splitlines()[-1]
    return line.split()[1]


def run(args):
    if not os.path.exists(GLEANER):
        sys.exit(f"{GLEANER} is missing: cargo build --release first")
    size = "64M" if args.quick else args.size
    reps = 1 if args.quick else args.reps
    names = [c for c in CONFIGS if not args.configs or c in args.configs.split(",")]
    want = all_local_checksum()
    res = {"date": now_iso(), "git_commit": git_commit(), "machine": machine(),
           "command": "python3 bench/defaults.py " + " ".join(sys.argv[1:]), "size": size,
           "reps": reps, "demo_checksum": want,
           "configs": {n: {"what": CONFIGS[n][0], "micro": {p: [] for p in PATTERNS},
                           "demo": []} for n in names}}
    for rep in range(reps):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for n in order:
            what, mflags, rflags, env = CONFIGS[n]
            for pat in PATTERNS:
                r = micro(pat, size, mflags)
                res["configs"][n]["micro"][pat].append(r)
                log(f"rep {rep + 1}/{reps} {n:12s} {pat:10s} "
                    + (f"{r['ns_per_op']:.0f} ns/op, fault mean {r['mean_us']:.1f} p50 "
                       f"{r['p50_us']:.1f} p99 {r['p99_us']:.1f} us" if "ns_per_op" in r
                       else f"FAILED: {r.get('error', '')[-200:]}"))
            if not args.skip_demo:
                d = demo(rflags, env, want)
                res["configs"][n]["demo"].append(d)
                log(f"rep {rep + 1}/{reps} {n:12s} demo       {d['wall_s']:.2f} s"
                    + ("" if d["ok"] else f" FAILED: {d.get('error', '')[-200:]}"))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    return res


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def render_text(res):
    lines = [BEGIN, "", "## Defaults, and the measurements behind them", "",
             "Generated by `python3 bench/defaults.py` → `bench/results/defaults.json` "
             f"({res['date']}, gleaner at `{res['git_commit']}`, {res['reps']} interleaved "
             f"repetitions, medians). Each row is the defaults with one knob changed, except "
             "`previous` (the defaults before the shared-memory data path). Micro runs: "
             f"`gleaner bench micro --pattern P --size {res['size']} --local 50% --pin-cpu 0` "
             "(the program's thread pinned to CPU 0, every word checked); demo: `gleaner run "
             "--local-mem 64M -- python3 scripts/demo_job.py 50000`, wall time and far memory at "
             "its peak (`total.store.peak_resident_bytes` of its stats), checksum checked. "
             "Fault times are as the program saw them (accesses slower than 1 µs).", "",
             "| configuration | what changes | seq ns/op | stride:10 ns/op | random ns/op | "
             "random fault mean µs | p50 µs | p99 µs | demo wall s | demo far memory MiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for n, c in res["configs"].items():
        m = c["micro"]
        row = [f"**{n}**" if n == "defaults" else n, c["what"]]
        for pat in PATTERNS:
            row.append(f"{med([r.get('ns_per_op') for r in m[pat]]):.0f}"
                       if med([r.get('ns_per_op') for r in m[pat]]) else "-")
        for k in ("mean_us", "p50_us", "p99_us"):
            v = med([r.get(k) for r in m["random"]])
            row.append(f"{v:.1f}" if v else "-")
        d = med([r["wall_s"] for r in c["demo"] if r["ok"]])
        row.append(f"{d:.2f}" if d else "-")
        far = med([r.get("far_peak_bytes") for r in c["demo"] if r["ok"]])
        row.append(f"{far / (1 << 20):.1f}" if far else "-")
        lines.append("| " + " | ".join(row) + " |")
    fails = [(n, k) for n, c in res["configs"].items() for k, runs in
             list(c["micro"].items()) + [("demo", c["demo"])] for r in runs if not r.get("ok")]
    lines += ["", "Failed runs: " + (", ".join(f"{n} {k}" for n, k in fails) if fails else "none") + ".",
              "", END]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--size", default="256M")
    ap.add_argument("--configs", help="comma-separated subset of: " + ", ".join(CONFIGS))
    ap.add_argument("--skip-demo", action="store_true")
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--no-render", action="store_true")
    args = ap.parse_args()
    if args.render_only:
        with open(args.out) as f:
            res = json.load(f)
    else:
        res = run(args)
    if not args.no_render:
        write_section(render_text(res), BEGIN, END, DOC)
        log(f"rendered into {DOC}")


if __name__ == "__main__":
    main()
