#!/usr/bin/env python3
"""What a userfaultfd fault costs with no pager at all, by where the handler runs, how it waits
and at what priority: `gleaner bench wakeup --json`, run in 3 separate processes.

    python3 bench/wakeup.py                # 3 runs of 20000 pages, rendered into DETAILS.md
    python3 bench/wakeup.py --quick        # 1 run of 5000 pages (smoke run; prints the section)
    python3 bench/wakeup.py --render-only  # re-render DETAILS.md from bench/results/wakeup.json

Each process runs every configuration in turn on a fresh region (see `gleaner bench wakeup
--help`); the table shows the median of the runs and, in parentheses, the range. Every run's
JSON is kept in bench/results/wakeup.json with the command, the machine and the commit.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from bench.doc_section import DOC, publish, spread  # noqa: E402
from bench.harness.common import GLEANER, git_commit, machine, now_iso  # noqa: E402

BEGIN, END = "<!-- wakeup:begin -->", "<!-- wakeup:end -->"
OUT = os.path.join(ROOT, "bench", "results", "wakeup.json")
QUICK_OUT = os.path.join(ROOT, "bench", "results", "wakeup-quick.json")
RUNS, PAGES = 3, 20000
QUICK_RUNS, QUICK_PAGES = 1, 5000


def log(msg):
    print(f"[wakeup] {msg}", file=sys.stderr, flush=True)


def bench_command(pages, configs=None, app_cpu=None):
    cmd = [GLEANER, "bench", "wakeup", "--json", "--pages", str(pages)]
    if configs:
        cmd += ["--configs", configs]
    if app_cpu is not None:
        cmd += ["--app-cpu", str(app_cpu)]
    return cmd


def one_run(cmd):
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    rec = {"command": " ".join(cmd), "rc": p.returncode, "wall_s": round(time.monotonic() - t0, 3),
           "stderr": p.stderr[-4000:]}
    if p.returncode != 0:
        rec["ok"] = False
        rec["error"] = p.stderr[-2000:] or f"exit status {p.returncode}"
        return rec
    try:
        rec["result"] = json.loads(p.stdout)
        rec["ok"] = True
    except ValueError as e:
        rec["ok"] = False
        rec["error"] = f"output is not JSON ({e}): {p.stdout[:500]}"
    return rec


def run(args, runs, pages):
    if not os.path.exists(GLEANER):
        sys.exit(f"{GLEANER} is missing: cargo build --release first")
    cmd = bench_command(pages, args.configs, args.app_cpu)
    res = {"schema": 1, "date": now_iso(), "git_commit": git_commit(), "machine": machine(),
           "command": "python3 bench/wakeup.py " + " ".join(sys.argv[1:]),
           "bench_command": " ".join(cmd), "results_file": os.path.relpath(args.out, ROOT),
           "pages": pages, "runs_requested": runs,
           "quick": args.quick, "runs": []}
    for i in range(runs):
        rec = one_run(cmd)
        res["runs"].append(rec)
        if rec["ok"]:
            summary = ", ".join(
                f"{c['name']} {c['fault_latency']['mean_us']:.1f}/{c['fault_latency']['p50_us']:.1f}"
                if not c.get("skipped") else f"{c['name']} SKIPPED"
                for c in rec["result"]["configs"])
            log(f"run {i + 1}/{runs} ({rec['wall_s']:.1f} s), mean/p50 us: {summary}")
        else:
            log(f"run {i + 1}/{runs} FAILED: {rec['error'][-300:]}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    log(f"wrote {args.out}")
    return res


def collect(res):
    """Per configuration (in the order the runs list them): its description, the measured
    entries of every run that measured it, and the reasons it was skipped."""
    configs = {}
    for rec in res["runs"]:
        if not rec.get("ok"):
            continue
        for c in rec["result"]["configs"]:
            e = configs.setdefault(c["name"], {"description": "", "measured": [], "skipped": []})
            if c.get("skipped"):
                e["skipped"].append(c["skipped"])
            else:
                e["measured"].append(c)
            if c.get("description") and (not e["description"] or not c.get("skipped")):
                e["description"] = c["description"]
    return configs


def per_handler(measured, key):
    """`CPU n: median` for each handler (by position), over the runs that measured it."""
    n = max(len(c["handlers"]) for c in measured)
    parts = []
    for i in range(n):
        hs = [c["handlers"][i] for c in measured if len(c["handlers"]) > i]
        cpu = hs[0].get("cpu")
        label = f"CPU {cpu}" if cpu is not None else "unpinned"
        parts.append(f"{label}: {statistics.median(h[key] for h in hs):.0f}")
    return ", ".join(parts)


def medians(configs, metric):
    return {n: statistics.median(c["fault_latency"][metric] for c in e["measured"])
            for n, e in configs.items() if e["measured"]}


def in_thread_lines(configs, by_mean):
    """What serving a fault in the faulting thread saves against handler threads, and what the
    kernel's own accesses to a missing page got under it (every run's probe)."""
    e = configs.get("in-thread-sigbus")
    if not e or not e["measured"] or "in-thread-sigbus" not in by_mean:
        return []
    own = by_mean["in-thread-sigbus"]
    saved = [f"{by_mean[n] - own:.1f} µs against {n} ({own / by_mean[n]:.2f}×)"
             for n in ("block-same", "read-same", "per-cpu", "read-per-cpu") if n in by_mean]
    probes = {}
    for c in e["measured"]:
        k = c.get("kernel_accesses") or {}
        for key, label in (("read_into_missing_page", "`read(2)` into the page"),
                           ("futex_wait_on_missing_page", "`futex(FUTEX_WAIT)` on its first word")):
            probes.setdefault(label, set()).add(k.get(key, "not probed"))
    out = ["", f"In-thread service saves {', '.join(saved) or 'nothing measurable'} by mean "
               "(medians of the runs). Its price: under `UFFD_FEATURE_SIGBUS` the kernel's own "
               "accesses to a missing page do not wait for anyone, they fail. After each "
               "in-thread-sigbus run, two system calls touched a page of the region that no "
               "thread had touched: " + "; ".join(f"{label}: {' / '.join(sorted(v))}"
                                                  for label, v in probes.items()) + "."]
    return out


def render_text(res):
    configs = collect(res)
    ok_runs = [r for r in res["runs"] if r.get("ok")]
    m = res["machine"]
    first = ok_runs[0]["result"] if ok_runs else {}
    results_file = res.get("results_file", "bench/results/wakeup.json")
    bench_args = res["bench_command"].split(" ", 1)[1]
    lines = [BEGIN, "",
             "## What a userfaultfd fault costs: handler placement, spin and priority", "",
             f"Generated by `{res['command'].strip()}` → `{results_file}` "
             f"({res['date']}, gleaner at `{res['git_commit']}`): {len(ok_runs)} of "
             f"{res['runs_requested']} runs of `gleaner {bench_args}` "
             "succeeded, each a separate process running every configuration in turn on a fresh "
             "region. Medians of the runs; the range in parentheses.", "",
             "No pager and no network: a registered anonymous region (MISSING mode, no huge "
             "pages); the app thread (two in two-apps-per-cpu), pinned to CPU "
             f"{first.get('app_cpu', 0)}, reads every page once in a pseudo-random order and "
             "times each access; bare handler threads install each faulting page with "
             "`UFFDIO_COPY` from a local 4 KiB buffer (in in-thread-sigbus there is no handler "
             "thread: the app thread installs its page itself, in its SIGBUS handler). A fault "
             "is an access slower than 1 µs; "
             "its time is as the app saw it. *Served* is how many faults each handler installed; "
             "*empty wake-ups* is how often a handler woke from poll and found no message left "
             "(every fault wakes every handler waiting on the shared userfaultfd; a handler "
             "blocked in read that finds nothing sleeps again inside the kernel, uncounted: the "
             "read configurations count none). The read configurations stop their handlers "
             "with one more fault each, on a page after the measured ones.", "",
             f"Machine: {m.get('cpus')} vCPUs ({m.get('cpu_model')}), {m.get('mem_gib')} GiB RAM, "
             f"Linux {m.get('kernel')}, {m.get('virtualization')}; load average "
             f"{m.get('loadavg_at_start', 0):.2f} at start.", "",
             "| configuration | what it is | faults / accesses | mean µs | p50 µs | p99 µs | "
             "p99.9 µs | faults/s | served per handler | empty wake-ups per handler |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, e in configs.items():
        ms = e["measured"]
        if not ms:
            reason = e["skipped"][0] if e["skipped"] else "not measured"
            lines.append(f"| {name} | {e['description']} | skipped: {reason} | - | - | - | - | - "
                         "| - | - |")
            continue
        lat = [c["fault_latency"] for c in ms]
        faults = statistics.median(c["faults"] for c in ms)
        accesses = statistics.median(c["accesses"] for c in ms)
        note = f" Skipped in {len(e['skipped'])} run(s): {e['skipped'][0]}" if e["skipped"] else ""
        lines.append("| " + " | ".join([
            name, e["description"] + note, f"{faults:.0f} / {accesses:.0f}",
            spread([x["mean_us"] for x in lat]), spread([x["p50_us"] for x in lat]),
            spread([x["p99_us"] for x in lat]), spread([x["p999_us"] for x in lat]),
            spread([c["faults_per_s"] for c in ms], 0),
            per_handler(ms, "served"), per_handler(ms, "empty_wakeups")]) + " |")
    lines.append("")
    by_mean, by_p50 = medians(configs, "mean_us"), medians(configs, "p50_us")
    if by_mean:
        fm = min(by_mean, key=by_mean.get)
        fp = min(by_p50, key=by_p50.get)
        sm = max(by_mean, key=by_mean.get)
        lines.append(f"Fastest by mean: **{fm}** ({by_mean[fm]:.1f} µs); by p50: **{fp}** "
                     f"({by_p50[fp]:.1f} µs). Slowest by mean: {sm} ({by_mean[sm]:.1f} µs, "
                     f"{by_mean[sm] / by_mean[fm]:.1f}× the fastest).")
    else:
        lines.append("No configuration was measured.")
    lines += in_thread_lines(configs, by_mean)
    skipped = [f"{n} ({e['skipped'][0]})" for n, e in configs.items() if e["skipped"]]
    fails = [f"run {i + 1}: {r.get('error', '')[-200:].strip()}"
             for i, r in enumerate(res["runs"]) if not r.get("ok")]
    lines += ["", "Skipped: " + ("; ".join(skipped) if skipped else "none") + ". Failed runs: "
              + ("; ".join(fails) if fails else "none") + ".", "", END]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK_RUNS} run of {QUICK_PAGES} pages, written to {QUICK_OUT}; the "
                         "section is printed, not written into the doc (unless --doc is given)")
    ap.add_argument("--runs", type=int, help=f"processes to run (default {RUNS})")
    ap.add_argument("--pages", type=int, help=f"pages per configuration (default {PAGES})")
    ap.add_argument("--configs", help="comma-separated subset (see `gleaner bench wakeup --help`)")
    ap.add_argument("--app-cpu", type=int, help="the app thread's CPU (default: the command's, 0)")
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
        runs = args.runs or (QUICK_RUNS if args.quick else RUNS)
        pages = args.pages or (QUICK_PAGES if args.quick else PAGES)
        res = run(args, runs, pages)
    if args.no_render:
        return
    publish(render_text(res), BEGIN, END, args.quick, args.doc, log)


if __name__ == "__main__":
    main()
