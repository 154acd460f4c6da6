#!/usr/bin/env python3
"""What starting a process costs under `gleaner run`: shell loops that fork, fork and exec, or
start an interpreter, each run plain and under `gleaner run` in the same session, interleaved.

    python3 bench/spawn.py                          # 5 reps, then render into DETAILS.md
    python3 bench/spawn.py --quick                  # 1 rep of short loops (prints the section)
    python3 bench/spawn.py --compare OLD/gleaner    # also another build (e.g. the commit before)
    python3 bench/spawn.py --render-only            # re-render from bench/results/spawn.json

Every process a program starts under `gleaner run` gets a pager of its own: an exec'd program
at its start, a fork child in the fork (`docs/architecture.md`, "Fork with far memory"). A shell
script pays that for every command it runs. Each loop runs `--iterations` times inside one
`bash -c`; the cost per iteration is the loop's wall time over the iterations, and gleaner's
overhead is its cost per iteration less plain bash's from the same rep. Reps run every system in
turn, the order rotated per rep. Every command, the machine and the commit are kept in
bench/results/spawn.json.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from bench.doc_section import DOC, publish, spread  # noqa: E402
from bench.harness.common import GLEANER, git_commit, machine, now_iso  # noqa: E402

BEGIN, END = "<!-- spawn:begin -->", "<!-- spawn:end -->"
OUT = os.path.join(ROOT, "bench", "results", "spawn.json")
QUICK_OUT = os.path.join(ROOT, "bench", "results", "spawn-quick.json")
REPS, ITERATIONS = 5, 200
QUICK_REPS, QUICK_ITERATIONS = 1, 20
LOCAL_MEM = "256M"


def real_python():
    """The interpreter itself, not a shim in front of it (pyenv's is a bash script that execs
    about 20 processes: it would measure the shim)."""
    return os.path.realpath(sys.executable)


def loops(iterations):
    """(name, what it is, the bash loop, its iterations): the slower loops run a tenth as many."""
    py = real_python()
    tenth = max(iterations // 10, 1)
    return [
        ("none", "`:` once: the run's own start and end (its private memnode), which the loops "
                 "below include once, spread over their iterations", ":", 1),
        ("fork+exec", f"`/bin/true` {iterations} times: a fork and an exec each",
         f"for i in $(seq {iterations}); do /bin/true; done", iterations),
        ("fork", f"`( : )` {iterations} times: a subshell, a fork child that exits",
         f"for i in $(seq {iterations}); do ( : ); done", iterations),
        ("nested", f"`( /bin/true; /bin/true )` {tenth} times: a subshell that forks and execs, "
                   "then execs: a fork child's own fork",
         f"for i in $(seq {tenth}); do ( /bin/true; /bin/true ); done", tenth),
        ("python", f"`python3 -c pass` {tenth} times (the interpreter, no shim): a fork, an exec "
                   "and an interpreter's start",
         f"for i in $(seq {tenth}); do {py} -c pass; done", tenth),
    ]


def command(system, script):
    """The command line of `system` (`plain`, or a gleaner binary) running `script`."""
    if system == "plain":
        return ["bash", "-c", script]
    return [system, "run", "-q", "--local-mem", LOCAL_MEM, "--", "bash", "-c", script]


def timed(cmd):
    """Wall time and the CPU (user + system) the command and its children used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rec = {"command": " ".join(cmd), "rc": p.returncode, "wall_s": round(wall, 4),
           "cpu_s": round(cpu, 4)}
    if p.returncode != 0:
        rec["error"] = p.stderr[-2000:] or f"exit status {p.returncode}"
    return rec


def log(msg):
    print(f"[spawn] {msg}", file=sys.stderr, flush=True)


def run(args, reps, iterations):
    systems = {"plain": "plain", "gleaner": GLEANER}
    if args.compare:
        systems["compared"] = os.path.abspath(args.compare)
    for name, path in systems.items():
        if path != "plain" and not os.path.exists(path):
            sys.exit(f"{path} is missing: cargo build --release first")
    res = {"schema": 1, "date": now_iso(), "git_commit": git_commit(), "machine": machine(),
           "command": "python3 bench/spawn.py " + " ".join(sys.argv[1:]),
           "results_file": os.path.relpath(args.out, ROOT), "local_mem": LOCAL_MEM,
           "iterations": iterations, "reps": reps, "systems": systems,
           "compare_label": args.compare_label, "loops": [], "runs": []}
    names = list(systems)
    for loop, what, script, n in loops(iterations):
        res["loops"].append({"name": loop, "what": what, "script": script, "iterations": n})
        for rep in range(reps):
            order = names[rep % len(names):] + names[:rep % len(names)]
            for system in order:
                rec = timed(command(systems[system], script))
                rec.update({"loop": loop, "system": system, "rep": rep})
                res["runs"].append(rec)
                state = "FAILED: " + rec["error"][-200:] if "error" in rec else "ok"
                log(f"{loop} rep {rep + 1}/{reps} {system}: {rec['wall_s']:.3f} s "
                    f"({rec['cpu_s']:.2f} s CPU) {state}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    log(f"wrote {args.out}")
    return res


def summarize(res):
    """Per loop and system: the cost per iteration (ms, per rep), gleaner's overhead over plain
    bash in the same rep (ms) and the ratio to plain, over the reps where both succeeded."""
    out = {}
    for loop in res["loops"]:
        n = loop["iterations"]
        by_rep = {}
        for r in res["runs"]:
            if r["loop"] == loop["name"] and r["rc"] == 0:
                by_rep.setdefault(r["rep"], {})[r["system"]] = r
        per = {}
        for rep, systems in sorted(by_rep.items()):
            plain = systems.get("plain")
            for system, r in systems.items():
                e = per.setdefault(system, {"ms": [], "cpu_ms": [], "over_ms": [], "ratio": []})
                e["ms"].append(r["wall_s"] * 1e3 / n)
                e["cpu_ms"].append(r["cpu_s"] * 1e3 / n)
                if plain and system != "plain":
                    e["over_ms"].append((r["wall_s"] - plain["wall_s"]) * 1e3 / n)
                    e["ratio"].append(r["wall_s"] / plain["wall_s"])
        failed = sum(1 for r in res["runs"] if r["loop"] == loop["name"] and r["rc"] != 0)
        out[loop["name"]] = {"systems": per, "failed": failed}
    return out


def label(res, system):
    if system == "plain":
        return "plain bash"
    if system == "compared":
        return f"gleaner run, {res.get('compare_label') or res['systems']['compared']}"
    return f"gleaner run at `{res['git_commit'][:7]}`"


def render_text(res):
    s = summarize(res)
    m = res["machine"]
    lines = [BEGIN, "", "## Starting processes under `gleaner run` (shell loops, same run)", "",
             f"Generated by `{res['command'].strip()}` → `{res['results_file']}` ({res['date']}, "
             f"gleaner at `{res['git_commit']}`). Each loop runs in one `bash -c`, plain and "
             f"under `gleaner run -q --local-mem {res['local_mem']}`, {res['reps']} reps, every "
             "system in turn in each rep (order rotated). *Per iteration* is the loop's wall time "
             "over its iterations; *overhead* is gleaner's per-iteration time less plain bash's "
             "in the same rep; medians over the reps, the range in parentheses.", "",
             f"Machine: {m.get('cpus')} vCPUs ({m.get('cpu_model')}), {m.get('mem_gib')} GiB RAM, "
             f"Linux {m.get('kernel')}, {m.get('virtualization')}.", "",
             "| loop | what it does | system | per iteration, ms | CPU per iteration, ms | "
             "overhead, ms | × plain |", "|---|---|---|---|---|---|---|"]
    for loop in res["loops"]:
        e = s[loop["name"]]
        for system in res["systems"]:
            v = e["systems"].get(system)
            if not v:
                lines.append(f"| {loop['name']} | {loop['what']} | {label(res, system)} | "
                             "failed | - | - | - |")
                continue
            lines.append("| " + " | ".join([
                loop["name"], loop["what"], label(res, system), spread(v["ms"], 2),
                spread(v["cpu_ms"], 2), spread(v["over_ms"], 2) if v["over_ms"] else "-",
                spread(v["ratio"], 2) if v["ratio"] else "1"]) + " |")
    failed = sum(e["failed"] for e in s.values())
    lines += ["", f"Failed runs: {failed}" + (" (their errors are in the results file)."
                                               if failed else "."), "", END]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK_REPS} rep of {QUICK_ITERATIONS} iterations, written to "
                         f"{QUICK_OUT}; the section is printed, not written into the doc")
    ap.add_argument("--reps", type=int, help=f"reps (default {REPS})")
    ap.add_argument("--iterations", type=int, help=f"iterations per loop (default {ITERATIONS}; "
                                                   "python runs a tenth as many)")
    ap.add_argument("--compare", help="another gleaner binary to run beside (its preload "
                                      "library beside it), e.g. a build of the commit before")
    ap.add_argument("--compare-label", help="how the table names --compare (default its path)")
    ap.add_argument("--out", help=f"results file (default {OUT})")
    ap.add_argument("--doc", help=f"document to render into (default {DOC})")
    ap.add_argument("--render-only", action="store_true", help="re-render from the results file")
    ap.add_argument("--no-render", action="store_true")
    args = ap.parse_args()
    args.out = args.out or (QUICK_OUT if args.quick else OUT)
    if args.render_only:
        with open(args.out) as f:
            res = json.load(f)
    else:
        res = run(args, args.reps or (QUICK_REPS if args.quick else REPS),
                  args.iterations or (QUICK_ITERATIONS if args.quick else ITERATIONS))
    if args.no_render:
        return
    publish(render_text(res), BEGIN, END, args.quick, args.doc, log, at_end=True)


if __name__ == "__main__":
    main()
