#!/usr/bin/env python3
"""CPython's own regression tests, under `gleaner run` and all-local, compared.

Runs the modules of `modules.txt` (CPython's `python3 -m test`, from the interpreter's own
standard library) under `gleaner run --local-mem LOCAL` twice: with `-j JOBS` (each module in a
worker process of its own, with a `$TMPDIR` of its own that regrtest checks is left clean), and
sequentially over the modules of `sequential.txt` (every module in one interpreter: a long-lived
process that loads extension modules, starts threads and forks, its heap far). Each run's outcome
per module (passed, failed, skipped, "env changed", ...) is read from regrtest's summary, and what
is still running afterwards that the run started is looked for.

The yardstick is the interpreter alone: all-local, a module's outcome is "passed" here (nearly
always), so only the modules that did not pass under gleaner are run all-local (`--baseline
lazy`, the default), with `-j JOBS`; `--baseline full` runs every module all-local first, as the
other runs. A module passing under gleaner needs no yardstick: whatever it does all-local, gleaner
broke nothing.

It passes (exit 0) when both gleaner runs give every module the outcome the interpreter gives it
alone, no run hit the time limit, and no process of a gleaner run (nor a memnode it started) is
left behind beyond what the all-local run leaves. A module whose outcome differs is run again
alone, all-local and under gleaner: the difference stands if it repeats, unless the module passed
under gleaner both times and failed both times all-local (a timing-sensitive module, such as
test_signal, on a loaded machine: nothing gleaner broke), which is reported apart
(`passed_only_under_gleaner`). The last line of its output is one JSON object: the outcomes, the
wall times, and the verdict.

    python3 tests/cpython/suite.py --gleaner target/release/gleaner [--local-mem 32M] [--jobs 2]
"""

import argparse
import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
# Held while a run prints more than one line (the two gleaner runs go side by side).
PRINTING = threading.Lock()

# regrtest's summary headings (Lib/test/libregrtest/results.py, 3.11) and the outcome each
# names; a module in none of them passed ("All N tests OK.").
SECTIONS = [
    (re.compile(r"^\d+ tests? failed"), "failed"),
    (re.compile(r"^\d+ tests? skipped \(resource denied\):"), "resource_denied"),
    (re.compile(r"^\d+ tests? skipped:"), "skipped"),
    (re.compile(r"^\d+ tests? altered the execution environment"), "env_changed"),
    (re.compile(r"^\d+ tests? omitted:"), "omitted"),
    (re.compile(r"^\d+ tests? run no tests:"), "no_tests"),
    (re.compile(r"^\d+ re-run tests?:"), "rerun"),
]


def read_modules(path):
    with open(path) as f:
        return [line.split("#", 1)[0].strip() for line in f if line.split("#", 1)[0].strip()]


def outcomes(output, modules):
    """Each module's outcome from regrtest's closing summary: `passed` unless a section names
    it; `missing` for all of them when no summary was printed (a crash or a hang)."""
    if "== Tests result:" not in output:
        return {m: "missing" for m in modules}
    tail = output[output.rindex("== Tests result:"):]
    found = {}
    section = None
    for line in tail.splitlines():
        stripped = line.strip()
        heading = next((name for rx, name in SECTIONS if rx.match(stripped)), None)
        if heading is not None:
            section = heading
            continue
        if not line.startswith("    "):
            section = None
            continue
        if section is not None:
            for name in stripped.split():
                # A module named in two sections (failed, then passed when re-run) keeps the
                # first: regrtest lists failures first.
                found.setdefault(name, section)
    return {m: found.get(m, "passed") for m in modules}


def processes_with(marker):
    """The pids of processes whose environment holds `marker` (`NAME=VALUE`), or whose command
    line does (the memnode a run started: its private directory's name)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        for name in ("environ", "cmdline"):
            try:
                with open(f"/proc/{entry}/{name}", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            if marker.encode() in data:
                pids.append(int(entry))
                break
    return sorted(set(pids))


def describe(pids):
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        out.append({"pid": pid, "command": cmd[:200]})
    return out


def run(label, argv, env, limit):
    """Runs `argv` in a process group of its own under `limit` seconds; returns its output,
    status, wall time and whether it ran out of time. Prints progress as it goes."""
    print(f"== {label}: {' '.join(argv[:8])} ...", flush=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gleaner-cpython-") as cwd:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=limit)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            timed_out = True
    wall = time.monotonic() - started
    tail = output.splitlines()[-6:]
    with PRINTING:
        print("\n".join("   " + line for line in tail), flush=True)
        print(f"   ({label}: status {proc.returncode}, {wall:.1f} s"
              f"{', TIMED OUT' if timed_out else ''})", flush=True)
    return output, proc.returncode, wall, timed_out


def leftovers(marker, grace):
    """Processes holding `marker` still alive after `grace` seconds (zombies excepted)."""
    deadline = time.monotonic() + grace
    while True:
        alive = [p for p in processes_with(marker) if not is_zombie(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def is_zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gleaner", required=True, help="the gleaner executable")
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter whose test suite runs (default: this one)")
    ap.add_argument("--local-mem", default="32M", help="gleaner run's --local-mem")
    ap.add_argument("--jobs", type=int, default=2, help="regrtest -j for the parallel run")
    ap.add_argument("--modules", default=os.path.join(HERE, "modules.txt"))
    ap.add_argument("--sequential-modules", default=os.path.join(HERE, "sequential.txt"),
                    help="the modules of the sequential gleaner run (a subset of --modules), "
                         "or `all`")
    ap.add_argument("--baseline", choices=["lazy", "full"], default="lazy",
                    help="lazy: run all-local only the modules that did not pass under gleaner; "
                         "full: every module all-local, first")
    ap.add_argument("--module-timeout", type=int, default=300,
                    help="regrtest --timeout: a module taking longer is stopped, and fails")
    ap.add_argument("--limit", type=int, default=900, help="seconds each whole run may take")
    ap.add_argument("--sequential-baseline", action="store_true",
                    help="also run all-local sequentially, for the wall time beside gleaner's "
                         "sequential run (a benchmark; the comparison uses the -j run)")
    ap.add_argument("--one-at-a-time", action="store_true",
                    help="run the two gleaner runs one after the other (their wall times then "
                         "mean something alone: a benchmark) rather than side by side")
    ap.add_argument("--out", help="also write the closing JSON object to this file")
    args = ap.parse_args()

    modules = read_modules(args.modules)
    sequential = modules if args.sequential_modules == "all" else \
        read_modules(args.sequential_modules)
    unknown = sorted(set(sequential) - set(modules))
    if unknown:
        raise SystemExit(f"{args.sequential_modules} names modules {args.modules} does not: "
                         f"{' '.join(unknown)}")
    gleaner = os.path.abspath(args.gleaner)
    gleaner_prefix = [gleaner, "run", "--local-mem", args.local_mem, "--"]
    test_cmd = [args.python, "-m", "test", "--timeout", str(args.module_timeout)]
    jobs = ["-j", str(args.jobs)]
    runs = {}
    left = {}

    def run_labelled(label, prefix, extra, mods):
        marker = f"GLEANER_CPYTHON_SUITE={uuid.uuid4().hex}"
        env = dict(os.environ)
        env[marker.split("=")[0]] = marker.split("=")[1]
        output, status, wall, timed_out = run(label, prefix + test_cmd + extra + mods, env,
                                              args.limit)
        runs[label] = {
            "status": status,
            "wall_seconds": round(wall, 1),
            "timed_out": timed_out,
            "modules": len(mods),
            "outcomes": outcomes(output, mods),
        }
        if "missing" in runs[label]["outcomes"].values() or timed_out:
            with PRINTING:
                print(output[-4000:], flush=True)
                # What stopped it may lie before the tail (a panic's message comes before its
                # backtrace): every line naming one, with the line after it.
                lines = output.splitlines()
                for i, line in enumerate(lines):
                    if any(k in line for k in ("panicked at", "gleaner: FATAL", "Fatal Python")):
                        print("   >> " + "\n   >> ".join(lines[i:i + 2]), flush=True)
        # A memnode the run started is named after the launcher's pid in its private
        # directory; the launcher is gone by now, so look by the marker in the environment.
        left[label] = describe(leftovers(marker, grace=3.0))
        for p in left[label]:
            try:
                os.kill(p["pid"], signal.SIGKILL)
            except OSError:
                pass

    if args.baseline == "full":
        run_labelled("all-local", [], jobs, modules)
    if args.sequential_baseline:
        run_labelled("all-local sequential", [], [], sequential)
    gleaner_runs = [(f"gleaner -j{args.jobs}", gleaner_prefix, jobs, modules),
                    ("gleaner", gleaner_prefix, [], sequential)]
    if args.one_at_a_time:
        for r in gleaner_runs:
            run_labelled(*r)
    else:
        # Side by side: the sequential run is one interpreter (about one CPU at most, less
        # while its tests sleep or wait on children), so beside the -j run the two take about
        # the longer one's time rather than their sum. Each run has its own marker, temporary
        # directory and memnode, and each is judged alone.
        with concurrent.futures.ThreadPoolExecutor(len(gleaner_runs)) as pool:
            for f in [pool.submit(run_labelled, *r) for r in gleaner_runs]:
                f.result()
    if args.baseline == "lazy":
        # The yardstick for the modules that did not pass under gleaner; every other module
        # is taken as passing all-local (what the interpreter's own suite does here).
        not_passed = sorted({m for label, r in runs.items() if not label.startswith("all-local")
                             for m, o in r["outcomes"].items() if o != "passed"},
                            key=modules.index)
        if not_passed:
            run_labelled("all-local", [], jobs, not_passed)
        else:
            runs["all-local"] = {"status": None, "wall_seconds": 0.0, "timed_out": False,
                                 "modules": 0, "outcomes": {}}
            left["all-local"] = []
        runs["all-local"]["outcomes"] = {m: runs["all-local"]["outcomes"].get(m, "passed")
                                         for m in modules}
        runs["all-local"]["lazy"] = True

    base = runs["all-local"]["outcomes"]
    differences = {}
    retried = {}
    better = {}
    local_again = {}  # a module's all-local retry serves both gleaner runs
    for label in runs:
        if label.startswith("all-local"):
            continue
        diff = {m: {"all-local": base[m], label: o}
                for m, o in runs[label]["outcomes"].items() if o != base[m]}
        # A timing-sensitive module (signals, sleeps) may fail once on a loaded machine: each
        # difference is tried again, the module alone, all-local and under gleaner; it stands
        # only if it repeats. Retries are reported.
        for m in list(diff):
            again = {}
            for again_label, prefix in (("all-local", []), (label, gleaner_prefix)):
                if again_label == "all-local" and m in local_again:
                    again[again_label] = local_again[m]
                    continue
                out, _, _, _ = run(f"{again_label} again: {m}", prefix + test_cmd + [m],
                                   dict(os.environ), args.limit)
                again[again_label] = outcomes(out, [m])[m]
            local_again[m] = again["all-local"]
            retried.setdefault(label, {})[m] = {"first": diff[m], "again": again}
            if again["all-local"] == again[label]:
                del diff[m]
            elif diff[m][label] == "passed" and again[label] == "passed":
                # Passed under gleaner both times where the interpreter alone did not (a
                # timing-sensitive module on a loaded machine): nothing gleaner broke. Reported.
                better.setdefault(label, {})[m] = diff.pop(m)
        if diff:
            differences[label] = diff
    # What a gleaner run leaves beyond what the all-local run left (by command: pids differ).
    local_left = {p["command"] for p in left["all-local"]}
    extra_left = {label: [p for p in procs if p["command"] not in local_left]
                  for label, procs in left.items() if not label.startswith("all-local")}
    extra_left = {k: v for k, v in extra_left.items() if v}
    timed_out = [label for label, r in runs.items() if r["timed_out"]]
    ok = not differences and not extra_left and not timed_out
    for label, diff in differences.items():
        for m, d in diff.items():
            print(f"DIFFERENT under {label}: {m}: all-local {d['all-local']}, {label} {d[label]}")
    for label, diff in better.items():
        for m, d in diff.items():
            print(f"PASSED ONLY under {label} (twice; the interpreter alone: {d['all-local']}, "
                  f"twice): {m}: not counted against gleaner")
    for label, procs in extra_left.items():
        for p in procs:
            print(f"LEFT RUNNING after {label}: pid {p['pid']}: {p['command']}")
    for label in timed_out:
        print(f"TIMED OUT: {label} ran past {args.limit} s")
    summary = {
        "modules": len(modules),
        "sequential_modules": len(sequential),
        "baseline": args.baseline,
        "local_mem": args.local_mem,
        "wall_seconds": {label: r["wall_seconds"] for label, r in runs.items()},
        "counts": {label: {o: list(r["outcomes"].values()).count(o)
                           for o in sorted(set(r["outcomes"].values()))}
                   for label, r in runs.items()},
        "differences": differences,
        "passed_only_under_gleaner": better,
        "retried": retried,
        "left_running": left,
        "extra_left_running": extra_left,
        "timed_out": timed_out,
        "same_outcomes": not differences,
        "ok": ok,
    }
    line = json.dumps(summary)
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(summary, indent=1) + "\n")
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
