"""python3 -m bench.harness {setup,quick,full,run,render,cleanup,status}

  setup     install the workloads' packages (apt, pip) and build the load generator
  quick     the smoke sweep (small sizes, a few minutes) -> bench/results/harness-quick.json
  full      the full sweep (footprints of 256 MiB-1 GiB, ~30-40 min) -> bench/results/harness-full.json
  run       a chosen sweep: --workloads, --systems, --ratios, --out
  render    plots + the harness section of bench/results/DETAILS.md from the results
  cleanup   undo whatever a killed harness left (zram swap, cgroups); idempotent
  status    what the harness would find to clean up now
"""
import argparse
import os
import shlex
import subprocess
import sys

from . import report, swapenv
from .common import BUILD, HARNESS, RESULTS, log


def ensure_built():
    src = os.path.join(HARNESS, "mcload.c")
    exe = os.path.join(BUILD, "mcload")
    if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(src):
        os.makedirs(BUILD, exist_ok=True)
        subprocess.run(["gcc", "-O2", "-Wall", "-o", exe, src, "-lm"], check=True)


def cmd_line():
    return "python3 -m bench.harness " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def selftest_hold():
    """For the tests: sets up zram swap and a cgroup holding a child, says READY, then waits to be
    interrupted (SIGINT/SIGTERM: cleans up, exits 130) or killed (SIGKILL: `cleanup` must undo)."""
    import signal
    import time
    from .runner import Interrupted, _on_signal
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _on_signal)
    st = swapenv.State()
    try:
        with swapenv.swap_environment(256 << 20, state=st) as (_, info):
            cg = swapenv.Cgroup(st, f"{os.getpid()}-selftest", 32 << 20)
            child = subprocess.Popen(["sleep", "600"], preexec_fn=cg.preexec())
            print(f"READY {info['device']} {cg.path} {child.pid}", flush=True)
            time.sleep(600)
    except Interrupted:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        return 130
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m bench.harness", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("setup", help="install packages, build the load generator")
    for name in ("quick", "full", "run"):
        p = sub.add_parser(name)
        p.add_argument("--workloads", help="comma-separated: memcached,redis,xgboost,pagerank,micro")
        p.add_argument("--systems", help="comma-separated: gleaner,gleaner-memnode,linux-swap")
        p.add_argument("--ratios", help="comma-separated percentages, e.g. 100,75,50,25")
        p.add_argument("--out", help="results JSON (default bench/results/harness-<mode>.json)")
        p.add_argument("--no-render", action="store_true", help="do not regenerate plots and the doc section")
        p.add_argument("--no-progress", action="store_true")
        p.add_argument("--pin", action="store_true",
                       help="servers (memcached, redis) on CPU 0 and their clients on CPU 1, under "
                            "every system alike (recorded in the results' params)")
        if name == "run":
            p.add_argument("--size", choices=["quick", "full"], default="quick")
    r = sub.add_parser("render")
    r.add_argument("--results", help="results JSON (default harness-full.json, else harness-quick.json)")
    r.add_argument("--no-plots", action="store_true")
    c = sub.add_parser("cleanup")
    c.add_argument("--force", action="store_true", help="also undo the state of a harness still running")
    sub.add_parser("status")
    sub.add_parser("selftest-hold", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.cmd == "selftest-hold":
        return selftest_hold()

    if args.cmd == "setup":
        return subprocess.run(["bash", os.path.join(HARNESS, "setup.sh")]).returncode
    if args.cmd == "cleanup":
        done, errors = swapenv.cleanup_all(force=args.force)
        snap = swapenv.snapshot()
        print(f"cleanup: undid {len(done)} harness state file(s); now: zram {snap['zram']}, "
              f"swaps {snap['swaps']}, harness cgroups {snap['cgroups']}")
        for e in errors:
            print("cleanup: " + e, file=sys.stderr)
        return 1 if errors else 0
    if args.cmd == "status":
        snap = swapenv.snapshot()
        states = os.listdir(swapenv.STATE_DIR) if os.path.isdir(swapenv.STATE_DIR) else []
        print({"state_files": states, **snap, "cgroup": swapenv.cgroup_mode(),
               "linux_swap_unavailable": swapenv.unavailable_reason()})
        return 0
    if args.cmd == "render":
        report.render(args.results, make_plots=not args.no_plots)
        return 0

    from .runner import Suite, default_out
    from .workloads import all_workloads
    ensure_built()
    size = args.size if args.cmd == "run" else args.cmd
    mode = args.cmd if args.cmd != "run" else f"run-{size}"
    quick = size == "quick"
    only = args.workloads.split(",") if args.workloads else None
    ws = all_workloads(quick, only, pin=args.pin)
    if args.pin and not any(w.pin for w in ws):
        log("--pin: not pinning (needs 2 CPUs, taskset and a server workload); the results say so")
    systems = args.systems.split(",") if args.systems else None
    ratios = [int(x) for x in args.ratios.split(",")] if args.ratios else None
    out = args.out or default_out(mode)
    suite = Suite(mode, ws, out, cmd_line(), systems=systems, ratios=ratios, progress=not args.no_progress)
    suite.run()
    if not args.no_render and out.startswith(RESULTS) and mode in ("quick", "full"):
        try:
            report.render(make_plots=True)
        except Exception as e:   # noqa: BLE001
            log(f"render failed: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
