"""Runs the sweep: for each workload an all-local run (its footprint), then at each local-memory
ratio every system, then all-local again; writes bench/results/harness-<mode>.json after every
workload (a crash keeps what was measured) and leaves the machine as it found it."""

import ctypes
import json
import os
import signal
import statistics
import sys
import tempfile
import time

from . import swapenv
from .common import (GLEANER, LIVE, PAGE, RESULTS, children_of, cmdline, git_commit, log, machine, now_iso)
from .systems import SWEPT, Launch, Memnode, gleaner_run_available

PR_SET_CHILD_SUBREAPER = 36
SCHEMA = 1


def _become_subreaper():
    """Orphans of our launchers (an embedded memnode that outlives `gleaner run`) become our
    children, so that they can be found, reported and ended by pid."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except OSError:
        return False


def _leftovers(keep):
    """Our children that should not be there any more (reaps zombies). Returns descriptions."""
    found = []
    for pid in children_of(os.getpid()):
        if pid in keep:
            continue
        try:
            wpid, _ = os.waitpid(pid, os.WNOHANG)
            if wpid == pid:
                continue   # a zombie orphan, now reaped
        except ChildProcessError:
            continue
        if any(c.pid == pid for c in LIVE):
            continue
        desc = cmdline(pid)
        found.append(f"pid {pid}: {desc[:200]}")
        try:
            os.kill(pid, signal.SIGKILL)   # ours (our child by reparenting), by pid
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    return found


def _kill_live():
    for c in list(LIVE):
        c.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + 5
    for c in list(LIVE):
        while c.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        c.signal_group(signal.SIGKILL)
        try:
            c.wait()
        except Exception:   # noqa: BLE001 - best effort on the way out
            pass



def _oom_killed(rec):
    """Whether a linux-swap cell failed because the kernel OOM-killed the program in its cgroup."""
    return not rec.get("ok") and "OOM-killed by the kernel" in (rec.get("error") or "")

class Interrupted(BaseException):
    pass


def _on_signal(signum, frame):
    raise Interrupted(f"signal {signal.Signals(signum).name}")


def _budget(footprint, ratio):
    b = footprint * ratio // 100
    return max(16 << 20, (b + (1 << 20) - 1) >> 20 << 20)


class Suite:
    memnode = None

    def __init__(self, mode, workloads, out_path, command, systems=None, ratios=None, progress=True):
        self.mode = mode
        self.workloads = workloads
        self.out_path = out_path
        self.command = command
        self.systems = systems or SWEPT
        self.ratios = ratios
        self.progress = progress
        self.state = swapenv.State()
        self.use_gleaner_run = gleaner_run_available()
        self.swap_reason = swapenv.unavailable_reason()
        self.results = {
            "schema": SCHEMA,
            "mode": mode,
            "date": now_iso(),
            "command": command,
            "git_commit": git_commit(),
            "machine": machine(),
            "gleaner_launch": ("gleaner run --local-mem B [--memnode A --token-file F] --stats F -- CMD"
                               if self.use_gleaner_run else
                               "LD_PRELOAD=libgleaner_preload.so GLEANER_LOCAL_MEM=B [GLEANER_MEMNODE=A] CMD"),
            "linux_swap": {"cgroup": swapenv.cgroup_mode(), "unavailable": self.swap_reason,
                           "swappiness": open("/proc/sys/vm/swappiness").read().strip(),
                           "page_cluster": open("/proc/sys/vm/page-cluster").read().strip()},
            "complete": False,
            "workloads": {},
        }

    # ---- one run ---------------------------------------------------------------------------

    def _cell(self, w, system, ratio, budget, memnode):
        tmp = tempfile.mkdtemp(prefix=f"{w.name}-{system}-{ratio}-", dir=self.tmp_root)
        rec = {"system": system, "ratio": ratio, "budget_bytes": budget, "started": now_iso()}
        t0 = time.monotonic()
        try:
            if system == "all-local":
                launch = Launch("all-local", None, tmp)
                r = w.run(launch, tmp)
                r.update(launch.collect())
            elif system in ("gleaner", "gleaner-memnode"):
                mn = memnode if system == "gleaner-memnode" else None
                if system == "gleaner-memnode" and (mn is None or not mn.alive()):
                    raise RuntimeError("the separate memnode is not running")
                launch = Launch(system, f"{budget >> 20}M", tmp, self.use_gleaner_run, memnode=mn)
                r = w.run(launch, tmp)
                r.update(launch.collect())
            elif system == "linux-swap":
                if self.swap_reason:
                    return {**rec, "ok": False, "skipped": True, "error": f"linux-swap unavailable: {self.swap_reason}"}
                zsize = max(1 << 30, 2 * (self.footprint or 0) + (256 << 20))
                with swapenv.swap_environment(zsize, algorithm=None, state=self.state) as (_, zinfo):
                    cg = swapenv.Cgroup(self.state, f"{os.getpid()}-{w.name}-{ratio}", budget)
                    try:
                        launch = Launch("linux-swap", budget, tmp, cgroup=cg, swap_dev=zinfo["device"])
                        # zram's mm_stat during the run (the program's swap is freed when it
                        # exits, so the end-of-run mm_stat keeps only mem_used_max).
                        with swapenv.ZramSampler(zinfo["device"], cgroup=cg) as zs:
                            try:
                                r = w.run(launch, tmp)
                            except Interrupted:
                                raise
                            except Exception as e:   # noqa: BLE001 - still look for an OOM kill
                                # A killed server shows first as a client error (a closed
                                # connection): the cgroup's OOM count below says why.
                                r = {"ok": False, "error": f"harness error: {type(e).__name__}: {e}"}
                        r.update(launch.collect())
                        r["zram"] = zinfo
                        if isinstance(r.get("swap"), dict):
                            r["swap"]["zram_peak_sampled"] = zs.peak
                            r["swap"]["zram_at_peak_sampled"] = zs.at_peak
                            r["swap"]["zram_samples"] = zs.samples
                        ooms = (r.get("swap") or {}).get("cgroup", {}).get("oom_kills")
                        if ooms:
                            r["ok"] = False
                            r["error"] = (f"OOM-killed by the kernel in the memory cgroup ({ooms} kill(s)); "
                                          + (r.get("error") or ""))
                    finally:
                        err = swapenv._remove_cgroup(cg.path)
                        if err:
                            log(err)
                        else:
                            self.state.remove("cgroups", cg.path)
            else:
                raise ValueError(system)
        except Interrupted:
            raise
        except Exception as e:   # noqa: BLE001 - a harness error is a failed cell, recorded
            r = {"ok": False, "error": f"harness error: {type(e).__name__}: {e}"}
        rec.update(r)
        rec["cell_s"] = round(time.monotonic() - t0, 3)
        keep = {self.memnode.proc.pid} if self.memnode else set()
        left = _leftovers(keep)
        if left:
            rec["leftover_processes"] = left
            log(f"{w.name} {system} {ratio}%: processes left behind (ended): {left}")
        cpu = (rec.get("usage") or {}).get("cpu_s")
        if cpu is not None:
            rec["cpu_total_s"] = round(cpu + (rec.get("memnode_cpu_s") or 0)
                                       + ((rec.get("swap") or {}).get("kswapd_cpu_s") or 0), 3)
        swapenv_cleanup_tmp(tmp)
        return rec

    def _tick(self, bar, w, system, ratio, rec):
        status = "ok" if rec.get("ok") else ("skipped" if rec.get("skipped") else "FAILED")
        m = rec.get("metrics") or {}
        msg = (f"{w.name:14s} {system:15s} {str(ratio) + '%' if ratio else 'all':>4s} {status:7s} "
               f"{m.get('throughput', '-')} {w.throughput_unit}"
               + (f" p99 {m.get('p99_us')} us" if 'p99_us' in m else ""))
        if not rec.get("ok") and rec.get("error"):
            msg += " | " + rec["error"][:200].replace("\n", " ")
        if bar is not None:
            bar.write("[harness] " + msg)
            bar.update(1)
        else:
            self.done_cells += 1
            log(f"[{self.done_cells}/{self.total_cells}] {msg}")

    # ---- a workload ------------------------------------------------------------------------

    def _workload(self, w, bar):
        ratios = self.ratios or w.ratios
        if w.name.startswith("micro"):
            ratios = [r for r in ratios if r in w.ratios] or w.ratios
        systems = [s for s in self.systems if s in w.systems]
        wres = {"name": w.name, "description": w.description, "throughput_unit": w.throughput_unit,
                "has_latency": w.has_latency, "metric_keys": w.metric_keys, "params": w.run_params(),
                "systems": ["all-local"] + systems, "ratios": ratios, "runs": []}
        self.results["workloads"][w.name] = wres
        memnode = None
        self.memnode = None
        self.footprint = None
        try:
            if "gleaner-memnode" in systems:
                try:
                    memnode = self.memnode = Memnode(self.tmp_root)
                    wres["memnode_command"] = " ".join(memnode.cmd)
                except Exception as e:   # noqa: BLE001
                    wres["memnode_error"] = str(e)
            if hasattr(w, "run_micro"):
                self.footprint = w.footprint()
                wres["footprint_bytes"] = self.footprint
                wres["footprint_source"] = "region size"
                local_done = False
                for ratio in ratios:
                    for system in systems:
                        tmp = tempfile.mkdtemp(dir=self.tmp_root)
                        mn = memnode if system == "gleaner-memnode" else None
                        if system == "gleaner-memnode" and mn is None:
                            rec, local = {"ok": False, "error": "memnode did not start: " + wres.get("memnode_error", "")}, None
                        else:
                            rec, local = w.run_micro(ratio, mn, tmp)
                        rec.update({"system": system, "ratio": ratio, "budget_bytes": self.footprint * ratio // 100})
                        left = _leftovers({memnode.proc.pid} if memnode else set())
                        if left:
                            rec["leftover_processes"] = left
                        wres["runs"].append(rec)
                        self._tick(bar, w, system, ratio, rec)
                        if local and not local_done:
                            local.update({"system": "all-local", "ratio": None, "budget_bytes": None})
                            wres["runs"].insert(0, local)
                            local_done = True
                            self._tick(bar, w, "all-local", None, local)
                if not local_done:
                    wres["runs"].insert(0, {"system": "all-local", "ratio": None, "ok": False,
                                            "error": "no far-memory run succeeded, so no all-local pass"})
                    self._tick(bar, w, "all-local", None, wres["runs"][0])
                return
            base = self._cell(w, "all-local", None, None, None)
            base["rep"] = 0
            wres["runs"].append(base)
            self._tick(bar, w, "all-local", None, base)
            if not base.get("ok") or not base.get("peak_rss_bytes"):
                wres["error"] = "the all-local run failed: no footprint, no sweep"
                return
            w.baseline = base
            self.footprint = base["peak_rss_bytes"]
            wres["footprint_bytes"] = self.footprint
            wres["footprint_source"] = ("peak RSS of the all-local run (VmHWM of the server / "
                                        "ru_maxrss of the job), program text and runtime included")
            for ratio in ratios:
                budget = _budget(self.footprint, ratio)
                for system in systems:
                    rec = self._cell(w, system, ratio, budget, memnode)
                    if system == "linux-swap" and _oom_killed(rec):
                        # The cgroup-v1 OOM killer fires now and then under heavy swap traffic
                        # even with swap to spare; one more try, the first one kept on record.
                        log(f"{w.name} linux-swap {ratio}%: OOM-killed in its cgroup; running it again")
                        first = {k: rec.get(k) for k in ("error", "cell_s", "started")}
                        rec = self._cell(w, system, ratio, budget, memnode)
                        rec["first_try"] = first
                    wres["runs"].append(rec)
                    self._tick(bar, w, system, ratio, rec)
            base2 = self._cell(w, "all-local", None, None, None)
            base2["rep"] = 1
            wres["runs"].append(base2)
            self._tick(bar, w, "all-local", None, base2)
        finally:
            if memnode:
                wres["memnode_peak_rss_bytes"] = memnode.rss()
                memnode.close()
                self.memnode = None
            self._summarise(wres)
            self._write()

    def _summarise(self, wres):
        locals_ = [r["metrics"]["throughput"] for r in wres["runs"]
                   if r["system"] == "all-local" and r.get("ok") and (r.get("metrics") or {}).get("throughput")]
        if not locals_:
            return
        base = statistics.mean(locals_)
        wres["all_local_throughput"] = base
        wres["all_local_spread"] = (max(locals_) / min(locals_) - 1) if len(locals_) > 1 else 0.0
        swap = {r["ratio"]: r for r in wres["runs"] if r["system"] == "linux-swap" and r.get("ok")}
        for r in wres["runs"]:
            m = r.get("metrics") or {}
            if not r.get("ok") or not m.get("throughput"):
                continue
            r["vs_all_local"] = round(m["throughput"] / base, 4)
            s = swap.get(r["ratio"])
            if s and r["system"] != "linux-swap" and s["metrics"].get("throughput"):
                r["vs_linux_swap"] = round(m["throughput"] / s["metrics"]["throughput"], 4)
                if "p99_us" in m and s["metrics"].get("p99_us"):
                    r["p99_vs_linux_swap"] = round(m["p99_us"] / s["metrics"]["p99_us"], 4)
        # The lowest ratio from which upwards the system keeps >= 80% of all-local throughput.
        thr = {}
        for system in wres["systems"]:
            if system == "all-local":
                continue
            by_ratio = {r["ratio"]: r for r in wres["runs"] if r["system"] == system}
            lowest = None
            for ratio in sorted(wres["ratios"], reverse=True):
                r = by_ratio.get(ratio)
                if r and r.get("ok") and r.get("vs_all_local", 0) >= 0.8:
                    lowest = ratio
                else:
                    break
            thr[system] = lowest
        wres["lowest_ratio_within_80pct"] = thr

    def _write(self):
        os.makedirs(os.path.dirname(self.out_path), exist_ok=True)
        tmp = self.out_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.results, f, indent=1)
        os.replace(tmp, self.out_path)

    # ---- the whole sweep -------------------------------------------------------------------

    def run(self):
        if not os.access(GLEANER, os.X_OK):
            sys.exit(f"{GLEANER} is missing: cargo build --release first")
        _become_subreaper()
        old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        self.tmp_root = tempfile.mkdtemp(prefix="gleaner-harness-")
        self.total_cells = 0
        for w in self.workloads:
            systems = [s for s in self.systems if s in w.systems]
            ratios = self.ratios or w.ratios
            if w.name.startswith("micro"):
                ratios = [r for r in ratios if r in w.ratios] or w.ratios
                self.total_cells += 1 + len(ratios) * len(systems)
            else:
                self.total_cells += 2 + len(ratios) * len(systems)
        self.done_cells = 0
        bar = None
        if self.progress:
            try:
                from tqdm import tqdm
                bar = tqdm(total=self.total_cells, unit="run", desc=f"harness {self.mode}", file=sys.stderr,
                           dynamic_ncols=True)
            except ImportError:
                bar = None
        log(f"{self.total_cells} runs; launch: {'gleaner run' if self.use_gleaner_run else 'LD_PRELOAD env'}; "
            f"linux-swap: {self.swap_reason or 'cgroup ' + swapenv.cgroup_mode() + ' + zram'}; results: {self.out_path}")
        t0 = time.monotonic()
        try:
            for w in self.workloads:
                self._workload(w, bar)
            self.results["complete"] = True
        except Interrupted as e:
            self.results["interrupted"] = str(e)
            log(f"interrupted ({e}): cleaning up")
            raise SystemExit(130)
        finally:
            for s in old:
                signal.signal(s, signal.SIG_IGN)   # a second Ctrl-C must not stop the cleanup
            _kill_live()
            errors = swapenv.teardown(self.state)
            left = _leftovers(set())
            if left:
                log(f"ended leftover processes: {left}")
            if errors:
                log("cleanup errors: " + "; ".join(errors) + " -- run `python3 -m bench.harness cleanup`")
                self.results["cleanup_errors"] = errors
            self.results["duration_s"] = round(time.monotonic() - t0, 1)
            self._write()
            swapenv_cleanup_tmp(self.tmp_root)
            if bar is not None:
                bar.close()
            for s, h in old.items():
                signal.signal(s, h)
        log(f"wrote {self.out_path} ({self.results['duration_s']} s)")
        return self.results


def swapenv_cleanup_tmp(path):
    import shutil
    shutil.rmtree(path, ignore_errors=True)


def default_out(mode):
    return os.path.join(RESULTS, f"harness-{mode}.json")


_ = PAGE
