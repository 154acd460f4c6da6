#!/usr/bin/env python3
"""gleaner beside Linux swap on zram, measured in the same run, pinned alike, reported as ratios.

    sudo python3 bench/vs_swap.py                # 3 interleaved reps at 512M, then render
    sudo python3 bench/vs_swap.py --quick        # a smoke run: 64M, 1 rep
    python3 bench/vs_swap.py --render-only       # re-render bench/results/DETAILS.md from the JSON

Each repetition runs every cell once, in a rotated order:

* micro, gleaner:    gleaner bench micro --pattern P --size S --local 50% --json --pin-cpu 0
                     (embedded memnode);
* micro, Linux swap: gleaner bench micro --system plain --pattern P --size S --json --pin-cpu 0
                     in a memory cgroup limited to 50% of S plus the plain process's own
                     baseline RSS (measured by a probe run first), swap on a fresh zram device;
* demo job (scripts/demo_job.py 50000, pinned with taskset -c 0): all-local; under
  `gleaner run --local-mem 64M`; in a 64 MiB memory cgroup with zram swap.

Writes bench/results/vs-swap.json (every run's command, raw JSON, counters; the machine, the git
commit, the date) and the vs-swap section of bench/results/DETAILS.md. Needs root (zram, cgroups).
Progress goes to stderr. Exit status: 0, 1 if any cell failed (a checksum mismatch included),
130 if interrupted; the zram devices and cgroups it made are removed in every case (after a
SIGKILL: `python3 -m bench.harness cleanup`).
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from bench.doc_section import DOC, med, span, write_section  # noqa: E402
from bench.harness import swapenv  # noqa: E402
from bench.harness.common import (GLEANER, LIVE, Child, fmt_cmd, git_commit, machine,  # noqa: E402
                                  now_iso, parse_size, python_exe, vmstat)

BEGIN, END = "<!-- vs-swap:begin -->", "<!-- vs-swap:end -->"
RESULTS = os.path.join(ROOT, "bench", "results")
DEFAULT_OUT = os.path.join(RESULTS, "vs-swap.json")
PATTERNS = ["seq", "stride:10", "random"]
LOCAL_PCT = 50
PIN_CPU = 0
DEMO_N = 50000
DEMO_LOCAL = "64M"
DEMO_JOB = os.path.join(ROOT, "scripts", "demo_job.py")
PROBE_SIZE = "4M"
SCHEMA = 1

# The targets, as the issue states them: (key, what, op, bound, patterns it applies to). The
# fault-time bounds are set for random access; for seq and stride:10 (where prefetching changes
# which accesses fault at all) the target is speed, and their fault ratios are shown as
# information ("no target").
TARGETS = [
    ("mean", "fault mean: gleaner / Linux", "<=", 1.0, ("random",)),
    ("p50", "fault p50: gleaner / Linux", "<=", 2.0, ("random",)),
    ("p99", "fault p99: gleaner / Linux", "<=", 0.25, ("random",)),
    ("speed", "speed: Linux ns/op / gleaner ns/op", ">=", 2.0, ("seq", "stride:10")),
]
# Ratios shown beside the targets for the patterns no bound applies to.
INFO = ("mean", "p50", "p99")
NO_TARGET = "no target"
DEMO_TARGET = ("wall", "wall time: gleaner / Linux", "<=", 1.0)


def log(msg):
    print(f"[vs-swap] {msg}", file=sys.stderr, flush=True)


class Interrupted(BaseException):
    pass


def _on_signal(signum, frame):
    raise Interrupted(f"signal {signal.Signals(signum).name}")


# ---- running one cell ------------------------------------------------------------------------


def _tail(path, n=2000):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def _run(cmd, tmp, timeout, preexec=None):
    """Runs cmd (its own session, reaped with wait4), stdout and stderr to files.
    Returns (rc, stdout, stderr tail, wall seconds, rusage dict, timed_out)."""
    out_path = os.path.join(tmp, "stdout")
    err_path = os.path.join(tmp, "stderr")
    with open(out_path, "w") as out, open(err_path, "w") as err:
        t0 = time.monotonic()
        child = Child(cmd, preexec=preexec, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                      timeout=timeout)
        rc = child.wait()
        wall = time.monotonic() - t0
    with open(out_path, errors="replace") as f:
        stdout = f.read()
    return rc, stdout, _tail(err_path), wall, child.usage(), child.timed_out


# The sampler lives in the harness's swapenv (its linux-swap runs sample zram too); kept here by
# name for the scripts that import it from vs_swap.
ZramSampler = swapenv.ZramSampler


def _remove_cgroup(state, cg):
    err = swapenv._remove_cgroup(cg.path)
    if err:
        log(err)
    else:
        state.remove("cgroups", cg.path)


def under_linux_swap(state, name, limit, zram_bytes, cmd, tmp, timeout):
    """Runs cmd in a fresh memory cgroup limited to `limit` bytes, swap on a fresh zram device.
    Returns (rc, stdout, stderr tail, wall s, rusage, timed_out, swap record)."""
    with swapenv.swap_environment(zram_bytes, state=state) as (_, zinfo):
        cg = swapenv.Cgroup(state, name, limit)
        try:
            vm0 = vmstat()
            with ZramSampler(zinfo["device"], cgroup=cg) as zs:
                rc, stdout, err, wall, usage, timed_out = _run(cmd, tmp, timeout, preexec=cg.preexec())
            vm1 = vmstat()
            cgs = cg.stats()
            swap = {
                "cgroup_mode": cg.mode,
                "cgroup_limit_bytes": limit,
                "cgroup": cgs,
                # cgroup v2 may count the cgroup's own swap-ins; v1 does not: then the
                # machine's /proc/vmstat during the run.
                "swap_ins": cgs.get("stat", {}).get("pswpin", vm1.get("pswpin", 0) - vm0.get("pswpin", 0)),
                "swap_ins_source": "cgroup memory.stat pswpin" if "pswpin" in cgs.get("stat", {})
                                   else "/proc/vmstat pswpin delta (no per-cgroup count on this cgroup version)",
                "major_faults_cgroup": cgs.get("pgmajfault"),
                "vmstat_delta": {k: vm1.get(k, 0) - vm0.get(k, 0)
                                 for k in ("pswpin", "pswpout", "pgmajfault", "pgsteal_direct", "pgsteal_kswapd")},
                "zram": {**zinfo, "after": swapenv.zram_stats(zinfo["device"]),
                         "peak_sampled": zs.peak, "at_peak_sampled": zs.at_peak, "samples": zs.samples},
            }
        finally:
            _remove_cgroup(state, cg)
    return rc, stdout, err, wall, usage, timed_out, swap


def _parse_json(stdout):
    try:
        return json.loads(stdout)
    except ValueError:
        return None


def micro_cmd(system, pattern, size, extra_args=()):
    """`extra_args` (other scripts: e.g. `--memnode embedded-tcp`) go at the end."""
    cmd = [GLEANER, "bench", "micro"]
    if system == "linux-swap":
        cmd += ["--system", "plain"]
    cmd += ["--pattern", pattern, "--size", size]
    if system == "gleaner":
        cmd += ["--local", f"{LOCAL_PCT}%"]
    return cmd + ["--json", "--pin-cpu", str(PIN_CPU)] + list(extra_args)


def micro_cell(ctx, system, pattern, rep, tmp, extra_args=(), label=None):
    """One micro run. `extra_args` go to micro_cmd; `label` (default `system`) is the record's
    system name (other scripts run several gleaner configurations)."""
    cmd = micro_cmd(system, pattern, ctx["size"], extra_args)
    rec = {"kind": "micro", "system": label or system, "pattern": pattern, "rep": rep,
           "command": fmt_cmd(["gleaner"] + cmd[1:]), "started": now_iso()}
    if system == "gleaner":
        rc, stdout, err, wall, usage, timed_out = _run(cmd, tmp, ctx["timeout"])
    else:
        rec["cgroup_limit_bytes"] = ctx["linux_limit"]
        rc, stdout, err, wall, usage, timed_out, swap = under_linux_swap(
            ctx["state"], f"{os.getpid()}-{pattern.replace(':', '')}-{rep}", ctx["linux_limit"],
            ctx["zram_bytes"], cmd, tmp, ctx["timeout"])
        rec["swap"] = swap
    result = _parse_json(stdout)
    rec.update({"rc": rc, "wall_s": round(wall, 3), "usage": usage, "result": result})
    errors = []
    if timed_out:
        errors.append(f"timed out after {ctx['timeout']} s")
    if rc != 0:
        errors.append(f"exit status {rc}")
    if result is None:
        errors.append("no JSON on stdout")
    elif not result.get("checksum_ok"):
        errors.append("CHECKSUM MISMATCH: the pattern read wrong data")
    ooms = (rec.get("swap") or {}).get("cgroup", {}).get("oom_kills")
    if ooms:
        errors.append(f"OOM-killed in the memory cgroup ({ooms} kill(s))")
    rec["ok"] = not errors
    if errors:
        rec["error"] = "; ".join(errors)
        rec["stderr_tail"] = err
    return rec


DEMO_RE = re.compile(r"checksum ([0-9a-f]+) over (\d+) objects in ([0-9.]+) s")


STATS_NAME = "gleaner-stats.json"   # a gleaner demo cell's stats file, in its tmp directory


def demo_cmd(system, stats_file=None, extra_args=(), job=None, local_mem=DEMO_LOCAL):
    """The demo job's command under `system`. Other scripts run another job the same way: `job`
    (default: the demo job pinned with taskset), `local_mem` (gleaner's --local-mem) and
    `extra_args` (more `gleaner run` flags, after --stats)."""
    if job is None:
        job = ["taskset", "-c", str(PIN_CPU), python_exe(), DEMO_JOB, str(DEMO_N)]
    if system == "gleaner":
        pre = [GLEANER, "run", "--local-mem", local_mem]
        if stats_file:
            pre += ["--stats", stats_file]
        return pre + list(extra_args) + ["--"] + list(job)
    return list(job)


def demo_cell(ctx, system, rep, tmp, extra_args=(), job=None, local_mem=DEMO_LOCAL,
              cgroup_limit=None, label=None, kind="demo"):
    """One run of the demo job (or, with `job`, of another program that prints the same
    `checksum HEX over N objects in S s` line) all-local, under gleaner or in a memory cgroup
    limited to `cgroup_limit` (default: `local_mem`) with zram swap. `label` (default `system`)
    is the record's system name, `kind` its kind."""
    stats_file = os.path.join(tmp, STATS_NAME) if system == "gleaner" else None
    cmd = demo_cmd(system, stats_file, extra_args, job, local_mem)
    shown = ["gleaner"] + cmd[1:] if system == "gleaner" else cmd
    rec = {"kind": kind, "system": label or system, "rep": rep,
           "command": fmt_cmd([c if c != stats_file else "STATS.json" for c in shown]),
           "started": now_iso()}
    if system == "linux-swap":
        limit = cgroup_limit or parse_size(local_mem)
        rec["cgroup_limit_bytes"] = limit
        rc, stdout, err, wall, usage, timed_out, swap = under_linux_swap(
            ctx["state"], f"{os.getpid()}-{kind}-{rep}", limit, max(1 << 30, 4 * limit), cmd, tmp,
            ctx["timeout"])
        rec["swap"] = swap
    else:
        rc, stdout, err, wall, usage, timed_out = _run(cmd, tmp, ctx["timeout"])
    rec.update({"rc": rc, "wall_s": round(wall, 3), "usage": usage, "stdout": stdout.strip()[-500:]})
    m = DEMO_RE.search(stdout)
    if m:
        rec.update({"checksum": m.group(1), "objects": int(m.group(2)), "job_s": float(m.group(3))})
    if stats_file:
        from bench.harness.systems import read_gleaner_stats
        rec["gleaner"] = read_gleaner_stats(stats_file)
    errors = []
    if timed_out:
        errors.append(f"timed out after {ctx['timeout']} s")
    if rc != 0:
        errors.append(f"exit status {rc}")
    if not m:
        errors.append("no checksum line on stdout")
    ooms = (rec.get("swap") or {}).get("cgroup", {}).get("oom_kills")
    if ooms:
        errors.append(f"OOM-killed in the memory cgroup ({ooms} kill(s))")
    # The run itself; `ok` also needs the checksum to match all-local (check_demo_checksums).
    rec["run_ok"] = rec["ok"] = not errors
    rec["run_error"] = "; ".join(errors) if errors else None
    if errors:
        rec["error"] = rec["run_error"]
        rec["stderr_tail"] = err
    return rec


def check_demo_checksums(res, final=False, key="demo"):
    """Every demo run's checksum must equal the all-local runs' (which must agree): a mismatch
    fails the cell, loudly. Re-run after each demo cell (an all-local run may come later in a
    rep's order) and at the end (`final`: a run with nothing to compare against fails). `key`:
    the results' entry holding the runs by system (other scripts check other jobs the same way);
    the reference goes to `<key>_reference_checksum`."""
    demo = res.get(key) or {}
    ref = {r.get("checksum") for r in demo.get("all-local", []) if r.get("run_ok", r.get("ok"))}
    reference = next(iter(ref)) if len(ref) == 1 else None
    res[f"{key}_reference_checksum"] = reference
    for system in demo:
        for r in demo.get(system, []):
            run_ok = r.get("run_ok", r.get("ok"))
            r["ok"], r["checksum_matches"] = run_ok, None
            if "run_ok" in r:   # a run of this script: its error is the run's own, if any
                r.pop("error", None)
                if r.get("run_error"):
                    r["error"] = r["run_error"]
            if not run_ok:
                continue
            if len(ref) > 1:
                r["ok"], r["error"] = False, f"the all-local runs' checksums disagree: {sorted(ref)}"
            elif reference is None:
                if final and system != "all-local":
                    r["ok"], r["error"] = False, "no all-local checksum to compare with"
            elif r.get("checksum") != reference:
                r["ok"], r["checksum_matches"] = False, False
                r["error"] = f"CHECKSUM MISMATCH: {r.get('checksum')} != all-local {reference}"
                if not r.get("mismatch_reported"):
                    r["mismatch_reported"] = True
                    log(f"!!! {key} {system} rep {r['rep'] + 1}: CHECKSUM MISMATCH: {r.get('checksum')} "
                        f"!= all-local {reference} -- a FAILED cell")
            else:
                r["checksum_matches"] = True


# ---- the run ---------------------------------------------------------------------------------


def cell_order(patterns, demo, rep):
    """Rep `rep`'s order of cells. Blocks: one per pattern (its gleaner and Linux runs) and the
    demo's three runs. The list of blocks starts one block further on each rep; within a pattern
    the two systems swap places every rep, and the demo's three runs rotate; so no system always
    runs first, or always right after the same neighbour."""
    blocks = [[("micro", p, "gleaner"), ("micro", p, "linux-swap")] for p in patterns]
    if demo:
        blocks.append([("demo", None, s) for s in ("all-local", "gleaner", "linux-swap")])
    k = rep % len(blocks)
    out = []
    for b in blocks[k:] + blocks[:k]:
        if b[0][0] == "demo":
            j = rep % len(b)
            b = b[j:] + b[:j]
        elif rep % 2:
            b = b[::-1]
        out += b
    return out


def _write(res, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=1)
    os.replace(tmp, path)


def _end_live_children():
    for c in list(LIVE):
        c.signal_group(signal.SIGKILL)   # our own children's groups
        try:
            c.wait()
        except Exception:   # noqa: BLE001 - best effort on the way out
            pass


def _summary_line(rec):
    if not rec.get("ok"):
        return f"FAILED: {rec.get('error')}"
    if rec["kind"] == "demo":
        return f"wall {rec['wall_s']:.2f} s (job {rec.get('job_s')} s), checksum {rec.get('checksum')}"
    r = rec["result"]
    a = r["remote_fault_app_visible"]
    s = (f"{r['ns_per_op']:.0f} ns/op, faults > 1 us n={a['count']} mean {a['mean_us']:.1f} "
         f"p50 {a['p50_us']:.1f} p99 {a['p99_us']:.1f} us, checksum ok")
    if rec["system"] == "linux-swap":
        z = rec["swap"]["zram"]
        s += (f"; major faults {r['fault_counts']['major']}, pswpin {rec['swap']['vmstat_delta']['pswpin']}, "
              f"zram peak {z['peak_sampled']['mem_used_total'] >> 20} MiB")
    return s


def run_all(args):
    if os.geteuid() != 0:
        sys.exit("vs_swap.py: needs root: it creates a zram swap device and memory cgroups for the "
                 "Linux-swap runs (run it with sudo; --render-only re-renders without root)")
    reason = swapenv.unavailable_reason()
    if reason:
        sys.exit(f"vs_swap.py: the Linux-swap baseline is unavailable here: {reason}")
    if not os.access(GLEANER, os.X_OK):
        sys.exit(f"vs_swap.py: {GLEANER} is missing: cargo build --release -p gleaner-cli first")
    from bench.harness.runner import _become_subreaper, _leftovers
    _become_subreaper()

    size = args.size or ("64M" if args.quick else "512M")
    reps = args.reps or (1 if args.quick else 3)
    patterns = args.patterns.split(",") if args.patterns else list(PATTERNS)
    size_bytes = parse_size(size)
    local_bytes = size_bytes * LOCAL_PCT // 100
    state = swapenv.State()
    res = {
        "schema": SCHEMA,
        "date": now_iso(),
        "command": "python3 bench/vs_swap.py " + " ".join(sys.argv[1:]),
        "git_commit": git_commit(),
        "machine": machine(),
        "params": {"quick": args.quick, "reps": reps, "patterns": patterns, "size": size,
                   "size_bytes": size_bytes, "local_pct": LOCAL_PCT, "local_bytes": local_bytes,
                   "pin_cpu": PIN_CPU, "demo": not args.skip_demo, "demo_n": DEMO_N,
                   "demo_local": DEMO_LOCAL, "python": python_exe()},
        "linux_swap": swapenv.linux_swap_settings(),
        "complete": False,
        "order": [],
        "micro": {p: {"gleaner": [], "linux-swap": []} for p in patterns},
        "demo": {"all-local": [], "gleaner": [], "linux-swap": []} if not args.skip_demo else None,
    }
    ctx = {"state": state, "size": size, "timeout": 300 if args.quick else 900,
           "zram_bytes": max(256 << 20, 2 * size_bytes)}
    tmp_root = tempfile.mkdtemp(prefix="gleaner-vs-swap-")
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    t_start = time.monotonic()
    rc = 0
    try:
        # The plain process's own memory before it touches its mapping: the Linux cgroup gets
        # the same local memory as gleaner plus this.
        probe_cmd = [GLEANER, "bench", "micro", "--system", "plain", "--pattern", "seq", "--size",
                     PROBE_SIZE, "--passes", "1", "--json", "--pin-cpu", str(PIN_CPU)]
        log(f"probe: {fmt_cmd(['gleaner'] + probe_cmd[1:])}")
        prc, pout, perr, _, _, _ = _run(probe_cmd, tmp_root, 120)
        probe = _parse_json(pout)
        if prc != 0 or not probe or not probe.get("baseline_rss_bytes"):
            raise RuntimeError(f"the baseline-RSS probe failed (exit {prc}): {perr[-500:]}")
        baseline = probe["baseline_rss_bytes"]
        limit = (local_bytes + baseline + 4095) // 4096 * 4096
        ctx["linux_limit"] = limit
        res["linux_swap"].update({
            "cgroup_limit_bytes": limit,
            "limit_rule": (f"{LOCAL_PCT}% of --size ({local_bytes} B, gleaner's --local) + the plain "
                           f"process's baseline VmRSS ({baseline} B: binary, libraries, stack, "
                           "histograms; read just before the mapping is touched) measured by a "
                           f"{PROBE_SIZE} probe run of the same binary before the reps; each run's "
                           "own baseline_rss_bytes is in its result"),
            "baseline_probe": {"command": fmt_cmd(["gleaner"] + probe_cmd[1:]), "result": probe},
            "zram_disksize_bytes": ctx["zram_bytes"],
        })
        log(f"{size} x {patterns}, {reps} rep(s); Linux cgroup limit {limit >> 20} MiB "
            f"({LOCAL_PCT}% = {local_bytes >> 20} MiB + baseline RSS {baseline / (1 << 20):.1f} MiB), "
            f"cgroup {swapenv.cgroup_mode()}, zram swap; results: {args.out}")

        n_cells = 2 * len(patterns) + (0 if args.skip_demo else 3)
        n = 0
        for rep in range(reps):
            order = cell_order(patterns, not args.skip_demo, rep)
            res["order"].append([f"{k}:{p}:{s}" if p else f"{k}:{s}" for k, p, s in order])
            for kind, pattern, system in order:
                n += 1
                what = f"{kind} {pattern + ' ' if pattern else ''}{system}"
                log(f"rep {rep + 1}/{reps} [{n}/{reps * n_cells}] {what} ...")
                tmp = tempfile.mkdtemp(dir=tmp_root)
                t0 = time.monotonic()
                try:
                    if kind == "micro":
                        rec = micro_cell(ctx, system, pattern, rep, tmp)
                    else:
                        rec = demo_cell(ctx, system, rep, tmp)
                except Interrupted:
                    raise
                except Exception as e:   # noqa: BLE001 - a harness error is a failed cell, recorded
                    rec = {"kind": kind, "system": system, "pattern": pattern, "rep": rep, "ok": False,
                           "error": f"harness error: {type(e).__name__}: {e}"}
                rec["cell_s"] = round(time.monotonic() - t0, 3)
                left = _leftovers(set())
                if left:
                    rec["leftover_processes"] = left
                    log(f"  processes left behind (ended): {left}")
                if kind == "micro":
                    res["micro"][pattern][system].append(rec)
                else:
                    res["demo"][system].append(rec)
                    check_demo_checksums(res)
                log(f"  {what}: {_summary_line(rec)} ({rec['cell_s']:.1f} s)")
                if not rec.get("ok"):
                    log(f"  !!! FAILED CELL: {what} rep {rep + 1}: {rec.get('error')}")
                _write(res, args.out)
        if res["demo"] is not None:
            check_demo_checksums(res, final=True)
        res["complete"] = True
    except Interrupted as e:
        res["interrupted"] = str(e)
        log(f"interrupted ({e}): cleaning up")
        rc = 130
    finally:
        for s in old:
            signal.signal(s, signal.SIG_IGN)   # a second Ctrl-C must not stop the cleanup
        _end_live_children()
        errors = swapenv.teardown(state)
        if errors:
            log("cleanup errors: " + "; ".join(errors) + " -- run `python3 -m bench.harness cleanup`")
            res["cleanup_errors"] = errors
        res["duration_s"] = round(time.monotonic() - t_start, 1)
        _write(res, args.out)
        import shutil
        shutil.rmtree(tmp_root, ignore_errors=True)
        for s, h in old.items():
            signal.signal(s, h)
    failed = failed_cells(res)
    log(f"wrote {args.out} ({res['duration_s']} s)")
    if failed:
        log(f"!!! {len(failed)} FAILED cell(s): " + "; ".join(failed))
    return rc or (1 if failed or not res["complete"] else 0), res


def failed_cells(res):
    out = []
    for p, by in (res.get("micro") or {}).items():
        for system, runs in by.items():
            out += [f"micro {p} {system} rep {r['rep'] + 1}: {r.get('error')}" for r in runs if not r.get("ok")]
    for system, runs in (res.get("demo") or {}).items():
        out += [f"demo {system} rep {r['rep'] + 1}: {r.get('error')}" for r in runs if not r.get("ok")]
    return out


# ---- the report ------------------------------------------------------------------------------


_med = med


def _span(values, fmt="{:.1f}"):
    return span(values, fmt)


def _fault(run, key):
    return run["result"]["remote_fault_app_visible"][key]


def _metric(run, key):
    """A micro run's value for a target's metric: mean/p50/p99 (µs, faults > 1 µs) or ns/op."""
    if key == "speed":
        return run["result"]["ns_per_op"]
    return _fault(run, {"mean": "mean_us", "p50": "p50_us", "p99": "p99_us"}[key])


def _ratio(key, g, lx):
    """The stated ratio: gleaner / Linux, or Linux / gleaner for speed. None if undefined."""
    if g is None or lx is None:
        return None
    num, den = (lx, g) if key == "speed" else (g, lx)
    return num / den if den > 0 else None


def _meets(op, value, bound):
    return value <= bound if op == "<=" else value >= bound


def verdicts(res):
    """Every target, decided from the numbers: ratio of the per-system medians (over the runs that
    passed), verdict 'met' / 'not met'; 'FAILED' if any run of the cell failed; 'n/a' if the ratio
    is undefined (e.g. Linux saw no access slower than 1 µs)."""
    out = []
    for p, by in (res.get("micro") or {}).items():
        g_runs, l_runs = by.get("gleaner", []), by.get("linux-swap", [])
        failed = [r for r in g_runs + l_runs if not r.get("ok")]
        g_ok = [r for r in g_runs if r.get("ok")]
        l_ok = [r for r in l_runs if r.get("ok")]
        for key, what, op, bound, only in TARGETS:
            targeted = only is None or p in only
            if not targeted and key not in INFO:
                continue
            g = _med([_metric(r, key) for r in g_ok])
            lx = _med([_metric(r, key) for r in l_ok])
            ratio = _ratio(key, g, lx)
            per_rep = []
            for rg in g_ok:
                rl = [r for r in l_ok if r["rep"] == rg["rep"]]
                if rl:
                    per_rep.append(_ratio(key, _metric(rg, key), _metric(rl[0], key)))
            per_rep = [x for x in per_rep if x is not None]
            if failed or not g_ok or not l_ok:
                verdict = "FAILED"
            elif ratio is None:
                verdict = "n/a"
            elif not targeted:
                verdict = NO_TARGET
            else:
                verdict = "met" if _meets(op, ratio, bound) else "not met"
            out.append({"scope": p, "target": key, "what": what, "op": op, "bound": bound,
                        "gleaner": g, "linux": lx, "ratio": ratio, "per_rep": per_rep,
                        "verdict": verdict, "failed_runs": len(failed)})
    demo = res.get("demo")
    if demo:
        key, what, op, bound = DEMO_TARGET
        g_runs, l_runs = demo.get("gleaner", []), demo.get("linux-swap", [])
        failed = [r for r in g_runs + l_runs + demo.get("all-local", []) if not r.get("ok")]
        g = _med([r["wall_s"] for r in g_runs if r.get("ok")])
        lx = _med([r["wall_s"] for r in l_runs if r.get("ok")])
        ratio = _ratio(key, g, lx)
        verdict = ("FAILED" if failed or g is None or lx is None else "n/a" if ratio is None
                   else "met" if _meets(op, ratio, bound) else "not met")
        out.append({"scope": "demo", "target": key, "what": what, "op": op, "bound": bound,
                    "gleaner": g, "linux": lx, "ratio": ratio, "per_rep": [], "verdict": verdict,
                    "failed_runs": len(failed)})
    return out


def _fmt(v, fmt):
    return "-" if v is None else fmt.format(v)


def render_text(res, results_name="bench/results/vs-swap.json"):
    prm = res.get("params", {})
    m = res.get("machine", {})
    ls = res.get("linux_swap", {})
    reps = prm.get("reps")
    L = [BEGIN, "", "## gleaner beside Linux swap on zram (same run)", ""]
    L.append(f"Generated by `python3 bench/vs_swap.py --render-only` from `{results_name}`; every "
             "number is in that file with each run's exact command and raw JSON. Only this section, "
             "between the `vs-swap:begin`/`vs-swap:end` markers, is generated; the verdicts are "
             "computed from the numbers.")
    L.append("")
    if prm.get("quick"):
        L.append("**A `--quick` smoke run (small size, one repetition): these are not the benchmark's "
                 "numbers.**")
        L.append("")
    if not res.get("complete", False):
        L.append(f"**Incomplete run** ({res.get('interrupted', 'stopped early')}).")
        L.append("")
    L.append(f"Machine: {m.get('cpus')} vCPUs ({m.get('cpu_model')}), {m.get('mem_gib')} GiB RAM, "
             f"Linux {m.get('kernel')} ({m.get('virtualization', '?')}). Run {res.get('date')}, "
             f"commit `{res.get('git_commit')}`, {reps} interleaved repetition(s) in rotated order; "
             "tables show the median and, in parentheses, the range over repetitions.")
    L.append("")
    lim = ls.get("cgroup_limit_bytes")
    probe = ((ls.get("baseline_probe") or {}).get("result") or {})
    L.append(f"Both systems run the same program, `gleaner bench micro`, with its access pattern "
             f"(and init pass) pinned to CPU {prm.get('pin_cpu')}: a {prm.get('size')} region "
             "written once, then two read passes, every word checked. **gleaner**: `--local "
             f"{prm.get('local_pct')}%` with its embedded memnode and its defaults (far pages "
             "compressed with LZ4 and sealed with AES-256-GCM since 2026-11-25: `bench/codec.py` "
             "measures what that costs; pages whose LZ4 form decodes slower than 1.5 µs, as this "
             "program's 8-byte counters do, are stored raw unless faster pages leave the mean "
             "decode per page room for them, and none do here, so here gleaner holds its far pages "
             "uncompressed where zram compresses them: both systems' far memory is listed below "
             "the table). **Linux**: `--system plain` (an "
             "anonymous private mapping, `MADV_NOHUGEPAGE`, so the kernel swaps 4 KiB pages) in a "
             f"memory cgroup ({ls.get('cgroup')}) limited to {_fmt(lim and lim / (1 << 20), '{:.1f}')} "
             f"MiB = {prm.get('local_pct')}% of the size + the plain process's own baseline RSS "
             f"({_fmt(probe.get('baseline_rss_bytes') and probe['baseline_rss_bytes'] / (1 << 20), '{:.1f}')} "
             "MiB, VmRSS just before the mapping is touched, measured by a probe run first), swap "
             f"on a fresh zram device per run (swappiness {ls.get('swappiness')}, page-cluster "
             f"{ls.get('page_cluster')}). Fault times are as the program saw them: accesses slower "
             "than 1 µs in the measured passes.")
    L.append("")
    micro = res.get("micro") or {}
    if micro:
        L.append("| pattern | system | ns/op | accesses > 1 µs | mean µs | p50 µs | p99 µs | p99.9 µs | pages brought back | checksum |")
        L.append("|---|---|---|---|---|---|---|---|---|---|")
        for p, by in micro.items():
            for system, label in (("gleaner", "gleaner"), ("linux-swap", "Linux swap (zram)")):
                runs = by.get(system, [])
                ok = [r for r in runs if r.get("ok")]
                if system == "gleaner":
                    back = [r["result"].get("region", {}).get("faults", {}).get("remote") for r in ok]
                    back_s = _span(back, "{:.0f}") + " remote faults"
                else:
                    back = [r["result"].get("fault_counts", {}).get("major") for r in ok]
                    back_s = _span(back, "{:.0f}") + " major faults"
                failed = len(runs) - len(ok)
                chk = ("ok" if runs and not failed and all(r["result"]["checksum_ok"] for r in runs)
                       else f"**FAILED ({failed} of {len(runs)})**")
                L.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
                    p, label,
                    _span([r["result"]["ns_per_op"] for r in ok], "{:.0f}"),
                    _span([_fault(r, "count") for r in ok], "{:.0f}"),
                    _span([_fault(r, "mean_us") for r in ok]),
                    _span([_fault(r, "p50_us") for r in ok]),
                    _span([_fault(r, "p99_us") for r in ok]),
                    _span([_fault(r, "p999_us") for r in ok]),
                    back_s, chk))
        L.append("")
        parts, sources = [], set()
        for p, by in micro.items():
            sw = [r["swap"] for r in by.get("linux-swap", []) if r.get("ok") and r.get("swap")]
            sources |= {x.get("swap_ins_source") or "/proc/vmstat pswpin delta" for x in sw}
            parts.append("{}: {} swap-ins, {} swap-outs, cgroup major faults {}, zram peak {} MiB "
                         "used for {} MiB of pages".format(
                             p,
                             _fmt(_med([x["vmstat_delta"]["pswpin"] if x.get("swap_ins") is None
                                        else x["swap_ins"] for x in sw]), "{:.0f}"),
                             _fmt(_med([x["vmstat_delta"]["pswpout"] for x in sw]), "{:.0f}"),
                             _fmt(_med([x.get("major_faults_cgroup") for x in sw]), "{:.0f}"),
                             _fmt(_med([x["zram"]["peak_sampled"]["mem_used_total"] / (1 << 20) for x in sw]), "{:.1f}"),
                             _fmt(_med([x["zram"]["peak_sampled"]["orig_data_size"] / (1 << 20) for x in sw]), "{:.1f}")))
        gparts = []
        for p, by in micro.items():
            st = [r["result"].get("region", {}).get("store", {}) for r in by.get("gleaner", [])
                  if r.get("ok")]
            cod = [x.get("codec", {}) for x in st]
            gparts.append("{}: peak {} MiB, {} of {} pages written stored raw for decode speed, "
                          "compression {}x".format(
                p,
                _fmt(_med([x.get("peak_resident_bytes", 0) / (1 << 20) for x in st]), "{:.1f}"),
                # (read while eviction ran, the raw count can be a page or two ahead)
                _fmt(_med([min(c.get("raw_for_speed", 0), c.get("pages_encoded", 0)) for c in cod]),
                     "{:.0f}"),
                _fmt(_med([c.get("pages_encoded") for c in cod]), "{:.0f}"),
                _fmt(_med([c.get("compression_ratio") for c in cod]), "{:.2f}")))
        L.append("gleaner's far memory (median over repetitions; stats `region.store`): "
                 + "; ".join(gparts) + ".")
        L.append("")
        L.append("Linux swap's counters (median over repetitions): " + "; ".join(parts) + ". Swap-ins: "
                 + (", ".join(sorted(sources)) or "-") + "; swap-outs: /proc/vmstat pswpout delta; "
                 "zram: its mm_stat sampled every 50 ms during the run.")
        L.append("")
    vs = verdicts(res)
    L.append("### Against the targets")
    L.append("")
    L.append("Ratio of the medians (per-repetition ratios in parentheses where there are several).")
    L.append("")
    L.append("| scope | target | gleaner | Linux | ratio | bound | verdict |")
    L.append("|---|---|---|---|---|---|---|")
    for v in vs:
        unit = " s" if v["scope"] == "demo" else " ns/op" if v["target"] == "speed" else " µs"
        ratio = _fmt(v["ratio"], "{:.2f}")
        if len(v["per_rep"]) > 1:
            ratio += " ({})".format(", ".join(f"{x:.2f}" for x in v["per_rep"]))
        verdict = v["verdict"]
        verdict = {"met": "**met**", "not met": "**not met**", "FAILED": "**FAILED**"}.get(verdict, verdict)
        num = "{:.0f}" if v["target"] == "speed" else "{:.2f}" if v["scope"] == "demo" else "{:.1f}"
        bound = ("-" if v["verdict"] == NO_TARGET
                 else f"{v['op'].replace('<=', '≤').replace('>=', '≥')} {v['bound']:g}")
        L.append(f"| {v['scope']} | {v['what']} | {_fmt(v['gleaner'], num)}{unit} | "
                 f"{_fmt(v['linux'], num)}{unit} | {ratio} | {bound} | {verdict} |")
    L.append("")
    met = sum(v["verdict"] == "met" for v in vs)
    L.append(f"{met} of {sum(v['verdict'] != NO_TARGET for v in vs)} targets met" + (
        "; not met: " + ", ".join(f"{v['scope']} {v['target']}" for v in vs if v["verdict"] == "not met")
        if any(v["verdict"] == "not met" for v in vs) else "") + (
        "; failed cells: " + ", ".join(f"{v['scope']} {v['target']}" for v in vs if v["verdict"] == "FAILED")
        if any(v["verdict"] == "FAILED" for v in vs) else "") + ".")
    L.append("")
    demo = res.get("demo")
    if demo:
        L.append(f"### The quick-start demo job (`scripts/demo_job.py {prm.get('demo_n')}`)")
        L.append("")
        L.append(f"Pinned to CPU {prm.get('pin_cpu')} with `taskset` in all three. gleaner: `gleaner "
                 f"run --local-mem {prm.get('demo_local')}`; Linux: a {prm.get('demo_local')} memory "
                 "cgroup with zram swap. The same number for both, but not the same memory: "
                 "gleaner's limit covers only the managed heap (malloc and private anonymous "
                 "mappings of the job), while the cgroup's covers everything the job charges "
                 "(interpreter and library pages it faults in, stack, page tables, page cache). "
                 "Wall time is the harness's, from start to exit (for gleaner including the "
                 "embedded memnode's start); every checksum must equal the all-local one.")
        L.append("")
        L.append("| system | wall s | job's own s | checksum | pages brought back |")
        L.append("|---|---|---|---|---|")
        ref = res.get("demo_reference_checksum")
        for system, label in (("all-local", "all-local"), ("gleaner", f"gleaner run --local-mem {prm.get('demo_local')}"),
                              ("linux-swap", f"Linux swap, {prm.get('demo_local')} cgroup")):
            runs = demo.get(system, [])
            ok = [r for r in runs if r.get("ok")]
            if system == "gleaner":
                back = _span([(r.get("gleaner") or {}).get("remote_faults") for r in ok], "{:.0f}") + " remote faults"
            elif system == "linux-swap":
                back = _span([r["swap"]["vmstat_delta"]["pswpin"] for r in ok if r.get("swap")], "{:.0f}") + " swap-ins"
            else:
                back = "-"
            failed = len(runs) - len(ok)
            chk = (f"`{ref}` (all match)" if runs and not failed and ref
                   else f"**FAILED ({failed} of {len(runs)}): " + "; ".join(
                       str(r.get("error")) for r in runs if not r.get("ok"))[:300] + "**")
            L.append(f"| {label} | {_span([r['wall_s'] for r in ok], '{:.2f}')} | "
                     f"{_span([r.get('job_s') for r in ok], '{:.2f}')} | {chk} | {back} |")
        L.append("")
    L.append("Commands (to reproduce: `cargo build --release && sudo python3 bench/vs_swap.py`):")
    L.append("")
    for p, by in micro.items():
        for system in ("gleaner", "linux-swap"):
            if by.get(system):
                where = (f" in the {_fmt(lim and lim / (1 << 20), '{:.1f}')} MiB cgroup"
                         if system == "linux-swap" else "")
                L.append(f"* `{by[system][0]['command']}`{where}")
    if demo:
        for system in ("all-local", "gleaner", "linux-swap"):
            if demo.get(system):
                where = f" in the {prm.get('demo_local')} cgroup" if system == "linux-swap" else ""
                L.append(f"* `{demo[system][0]['command']}`{where}")
    L.append("")
    L.append(END)
    return "\n".join(L)


def render(res, doc=DOC, results_name="bench/results/vs-swap.json"):
    write_section(render_text(res, results_name), BEGIN, END, doc_path=doc)
    log(f"wrote the vs-swap section of {doc}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: --size 64M, --reps 1 (unless given)")
    ap.add_argument("--patterns", help=f"comma-separated micro patterns (default {','.join(PATTERNS)})")
    ap.add_argument("--reps", type=int, help="interleaved repetitions (default 3; 1 with --quick)")
    ap.add_argument("--size", help="micro region size (default 512M; 64M with --quick)")
    ap.add_argument("--skip-demo", action="store_true", help="leave out the demo job")
    ap.add_argument("--out", default=DEFAULT_OUT, help="results JSON (default bench/results/vs-swap.json)")
    ap.add_argument("--doc", default=DOC,
                    help="the document to render into (default bench/results/DETAILS.md)")
    ap.add_argument("--no-render", action="store_true", help="write the JSON only")
    ap.add_argument("--render-only", action="store_true", help="re-render the doc section from --out")
    return run_or_render(ap, argv, "vs_swap.py", run_all, render, log)


def run_or_render(ap, argv, script, run_all, render, log):
    """The end of a same-run script's main (this one's and bench/codec.py's): parse `ap`, then
    re-render the doc from --out (--render-only), or run everything and render a complete run
    (unless --no-render). Returns the exit status."""
    args = ap.parse_args(argv)
    args.out = os.path.abspath(args.out)
    name = os.path.relpath(args.out, ROOT) if args.out.startswith(ROOT + os.sep) else args.out
    if args.render_only:
        if not os.path.exists(args.out):
            sys.exit(f"{script}: {args.out} missing: run without --render-only first")
        with open(args.out) as f:
            render(json.load(f), args.doc, name)
        return 0
    if args.reps is not None and args.reps < 1:
        ap.error("--reps must be at least 1")
    rc, res = run_all(args)
    if args.no_render:
        pass
    elif res["complete"]:
        render(res, args.doc, name)
    else:
        log(f"the run is incomplete: {args.doc} left as it was (--render-only renders it anyway)")
    return rc


if __name__ == "__main__":
    sys.exit(main())
