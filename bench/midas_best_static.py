#!/usr/bin/env python3
"""The best any fixed partition can do on `bench/midas.py`'s workload, measured (issue 46).

    python3 bench/midas_best_static.py            # about 8 minutes; last line: one JSON object
    python3 bench/midas_best_static.py --out FILE

`bench/midas.py` scores a policy by its efficiency: the mean over its three programs of their
throughput (per CPU second) over their all-cached throughput. Its workload is stationary, so no
policy, however it moves memory, can do better over a phase than the best fixed partition of the
same budget (a policy that probes pays for its probes on top). This script measures that bound
instead of assuming it, in one run, on the same programs and the same machine:

1. ideal: the three with everything cached (as `midas.py`'s first phase);
2. curves: the three at once, each with the same fixed pool size S (no daemon), for each S on a
   grid from one segment (2 MiB) to the working set plus its headers (34 MiB); each program's
   normalised throughput at S, over the phase's last third, is one point of its curve;
3. the best partition of the budget (48 MiB, in 2 MiB segments) for the measured curves (exact,
   by dynamic programming, linear between grid points), and its predicted efficiency;
4. that partition run for a policy phase's length (fixed pools, no daemon): the measured best
   static efficiency; then `midas` and `static` under `gleaner node` exactly as `midas.py` runs
   them, so the three figures come from one run.

Writes bench/results/midas/best-static.json; prints, as the last line, one JSON object with
`efficiency_best_static`, `efficiency_best_static_predicted`, `best_partition_mib`,
`efficiency_midas`, `efficiency_static` and `midas_of_best_static`. Exit status 1 if a program
read a wrong value.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import midas  # noqa: E402  (the workload, its programs and its phases)

MB = midas.MB
SEG = 2 * MB
# Pool sizes of the curves, MiB: dense where the curves bend (small pools), up to the working
# set plus the objects' 16-byte headers (2,048 x 16 KiB needs a little over 32 MiB).
GRID_MIB = (2, 4, 6, 8, 10, 12, 16, 20, 24, 28, 32, 34)


def interpolate(curve, mib):
    """The curve's value at `mib`: linear between its points, its last value beyond them, and
    its first below them. `curve` is a list of (MiB, value) sorted by MiB."""
    if mib <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if mib <= x1:
            return y0 + (y1 - y0) * (mib - x0) / (x1 - x0)
    return curve[-1][1]


def best_partition(curves, budget_mib, unit_mib=2, least_mib=2):
    """The split of `budget_mib` among the programs (whole `unit_mib` units, each at least
    `least_mib`) that maximises the sum of their curves, and that sum.

    `curves`: {name: [(MiB, value), ...]}. Exact (dynamic programming over units); returns
    ({name: MiB}, total value). Ties go to the split found first (programs in name order)."""
    names = sorted(curves)
    units = budget_mib // unit_mib
    least = max(1, -(-least_mib // unit_mib))
    # best[u] = (value, split) over the programs seen so far using at most u units.
    best = {u: (0.0, ()) for u in range(units + 1)}
    for name in names:
        nxt = {}
        for u in range(units + 1):
            cand = None
            for k in range(least, u + 1):
                prev_value, prev_split = best[u - k]
                if prev_split is None:
                    continue
                v = prev_value + interpolate(curves[name], k * unit_mib)
                if cand is None or v > cand[0] + 1e-12:
                    cand = (v, prev_split + (k * unit_mib,))
            nxt[u] = cand if cand is not None else (float("-inf"), None)
        best = nxt
    value, split = best[units]
    if split is None:
        raise ValueError(f"{budget_mib} MiB cannot give each of {len(names)} programs {least_mib} MiB")
    return dict(zip(names, split)), value


def phase_fixed(specs, secs, ideal, limits):
    """The three at once with fixed pool sizes (bytes), no daemon: per program, throughput per
    CPU second over the phase's last third, normalised to its ideal."""
    apps = [midas.App(n, a, secs, limit=limits[n]) for n, a in specs]
    rcs = [a.wait(secs + 60) for a in apps]
    t0, t1 = secs * 2 / 3, secs
    per = {}
    for a, rc in zip(apps, rcs):
        r = a.cpu_rate(t0, t1)
        last = a.reports[-1] if a.reports else {}
        per[a.name] = {"limit_mib": limits[a.name] / MB, "ops_per_cpu_s": r,
                       "normalized": r / ideal[a.name]["ops_per_cpu_s"], "rc": rc, "bad": a.bad(),
                       "resident_mib": (last.get("resident") or 0) / MB,
                       "hits": last.get("hits"), "misses": last.get("misses")}
    return {"apps": per, "efficiency": sum(p["normalized"] for p in per.values()) / len(per)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="results file (default bench/results/midas/best-static.json)")
    ap.add_argument("--curve-secs", type=int, default=20, help="seconds per point of the curves (default 20)")
    ap.add_argument("--secs", type=int, default=45,
                    help="seconds of the best partition's phase and of each policy phase (default 45, "
                         "as midas.py --quick)")
    args = ap.parse_args()
    for b in ("gleaner", "soft-workload"):
        if not os.path.exists(os.path.join(midas.BIN, b)):
            raise SystemExit(f"{midas.BIN}/{b} is missing: run `cargo build --release` first")
    objects, size = 2048, 16384
    ws = objects * size
    budget = 3 * ws // 2
    tmp = tempfile.mkdtemp(prefix="gleaner-midas-best-")
    blocks = os.path.join(tmp, "blocks")
    midas.make_file(blocks, ws)
    specs = midas.app_specs(objects, size, blocks)
    names = [n for n, _ in specs]
    t_begin = time.time()
    steps = 2 + len(GRID_MIB) + 2

    def progress(i, what):
        print(f"[{i}/{steps}, {time.time() - t_begin:.0f} s] {what}", file=sys.stderr, flush=True)

    progress(1, f"ideal (all cached), {args.curve_secs} s")
    ideal = midas.phase_ideal(specs, args.curve_secs, ws)
    points = {}
    for i, mib in enumerate(GRID_MIB):
        progress(2 + i, f"curves: every pool fixed at {mib} MiB, {args.curve_secs} s")
        points[mib] = phase_fixed(specs, args.curve_secs, ideal, {n: mib * MB for n in names})
    curves = {n: [(mib, points[mib]["apps"][n]["normalized"]) for mib in GRID_MIB] for n in names}
    split, value = best_partition(curves, budget // MB)
    predicted = value / len(names)
    progress(2 + len(GRID_MIB), f"best partition {split} MiB (predicted efficiency {predicted:.3f}), {args.secs} s")
    best = phase_fixed(specs, args.secs, ideal, {n: split[n] * MB for n in names})
    runs = {}
    for j, p in enumerate(("midas", "static")):
        progress(3 + len(GRID_MIB) + j, f"policy {p} under gleaner node, {args.secs} s")
        runs[p] = midas.phase_policy(p, specs, args.secs, budget, ideal, True)
    os.unlink(blocks)
    os.rmdir(tmp)
    phases = [best] + list(points.values())
    bad = sum((a.get("bad") or 0) for ph in phases for a in ph["apps"].values())
    bad += sum((a.get("bad") or 0) for r in runs.values() for a in r["apps"].values())
    bad += sum((a.get("bad") or 0) for a in ideal.values())
    git = subprocess.run(["git", "-C", midas.ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    res = {
        "script": "bench/midas_best_static.py",
        "command": " ".join(["python3", "bench/midas_best_static.py"] + sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "git_commit": git.stdout.strip(),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
        "params": {"objects": objects, "size": size, "working_set_each": ws, "budget": budget,
                   "grid_mib": GRID_MIB, "curve_secs": args.curve_secs, "secs": args.secs,
                   "zipf": 0.9, "base_us": 20,
                   "rebuild_us": {"storage": "pread + 10", "memo-100us": 100, "memo-1ms": 1000}},
        "ideal": ideal, "curves": curves, "curve_phases": points,
        "best_partition_mib": split, "efficiency_best_static_predicted": predicted,
        "best_static": best, "runs": runs, "bad_reads": bad, "wall_s": time.time() - t_begin,
    }
    out = args.out or os.path.join(midas.ROOT, "bench", "results", "midas", "best-static.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    summary = {
        "efficiency_best_static": best["efficiency"],
        "efficiency_best_static_predicted": predicted,
        "best_partition_mib": split,
        "efficiency_midas": runs["midas"]["efficiency"],
        "efficiency_static": runs["static"]["efficiency"],
        "midas_of_best_static": runs["midas"]["efficiency"] / best["efficiency"],
        "best_static_vs_static": best["efficiency"] / runs["static"]["efficiency"],
        "bad_reads": bad,
        "results": os.path.relpath(out, midas.ROOT),
    }
    print(json.dumps(summary))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
