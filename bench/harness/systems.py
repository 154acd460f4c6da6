"""The systems a workload runs under, and how each one launches a program at a local budget.

* all-local        the program alone, no limit;
* gleaner          `gleaner run --local-mem B` with its embedded memnode (Unix socket, same machine),
                   or, where `gleaner run` is missing, LD_PRELOAD + GLEANER_LOCAL_MEM;
* gleaner-memnode  the same against a memnode in a separate process (`gleaner memnode`, Unix socket);
* linux-swap       the program in a memory cgroup limited to B, swap on zram.

For experiments: GLEANER_HARNESS_ARGS="--evict fifo" adds flags to every `gleaner run` (each run's
recorded command shows them), and GLEANER_HARNESS_KEEP_STATS=FILE keeps the last gleaner run's
whole stats file.
"""

import glob
import json
import os
import shutil
import subprocess
import tempfile
import time

from . import swapenv
from .common import GLEANER, PAGE, PRELOAD, kswapd_cpu_s, log, proc_cpu_s, vmstat

SYSTEMS = ["all-local", "gleaner", "gleaner-memnode", "linux-swap"]
SWEPT = ["gleaner", "gleaner-memnode", "linux-swap"]


def gleaner_run_available():
    try:
        p = subprocess.run([GLEANER, "run", "--help"], capture_output=True, timeout=20)
        return p.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class Memnode:
    """A memnode in its own process for the gleaner-memnode system (Unix socket, private token).
    It exits by itself when the harness dies (--exit-on-stdin-eof on a pipe the harness holds)."""

    def __init__(self, tmp, capacity="12G"):
        self.dir = tempfile.mkdtemp(prefix="memnode-", dir=tmp)
        self.addr = f"unix:{self.dir}/memnode.sock"
        self.token = os.path.join(self.dir, "token")
        self.cmd = [GLEANER, "memnode", "--listen", self.addr, "--capacity", capacity,
                    "--token-file", self.token, "--exit-on-stdin-eof"]
        self.log = open(os.path.join(self.dir, "memnode.log"), "w")
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=self.log, stderr=self.log,
                                     start_new_session=True)
        deadline = time.monotonic() + 20
        while not os.path.exists(self.addr[5:]):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"memnode did not start: {open(self.log.name).read()[-1000:]}")
            time.sleep(0.05)
        log(f"memnode pid {self.proc.pid} on {self.addr}")

    def cpu_s(self):
        return proc_cpu_s(self.proc.pid)

    def rss(self):
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None

    def alive(self):
        return self.proc.poll() is None

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()   # our own child, by pid
                self.proc.wait()
        self.log.close()


class Launch:
    """How one run starts its program: a command prefix, environment, a preexec hook; and what it
    collects afterwards (far-memory stats, swap traffic)."""

    def __init__(self, system, budget, tmp, use_gleaner_run=True, memnode=None, cgroup=None,
                 swap_dev=None):
        self.system = system
        self.budget = budget
        self.tmp = tmp
        self.stats_file = os.path.join(tmp, "gleaner-stats.json")
        self.memnode = memnode
        self.cgroup = cgroup
        self.swap_dev = swap_dev
        self.prefix, self.env, self.preexec = [], {}, None
        if system in ("gleaner", "gleaner-memnode"):
            if use_gleaner_run:
                self.prefix = [GLEANER, "run", "-q", "--local-mem", str(budget), "--stats", self.stats_file]
                if memnode:
                    self.prefix += ["--memnode", memnode.addr, "--token-file", memnode.token]
                # Extra `gleaner run` flags for an experiment (e.g. "--prefetch none"); results
                # files record the launch command, so such a run is never mistaken for the defaults.
                self.prefix += os.environ.get("GLEANER_HARNESS_ARGS", "").split()
                self.prefix += ["--"]
            else:
                self.env = {"LD_PRELOAD": PRELOAD, "GLEANER_BIN": GLEANER, "GLEANER_LOCAL_MEM": str(budget),
                            "GLEANER_STATS": self.stats_file}
                if memnode:
                    self.env.update({"GLEANER_MEMNODE": memnode.addr, "GLEANER_TOKEN_FILE": memnode.token})
        elif system == "linux-swap":
            self.preexec = cgroup.preexec()
        self._before = {}

    def wrap(self, cmd):
        return self.prefix + list(cmd)

    def begin(self):
        self._before = {"vmstat": vmstat(), "kswapd": kswapd_cpu_s(),
                        "memnode_cpu": self.memnode.cpu_s() if self.memnode else 0.0}

    def program_pid(self, launcher_pid, name):
        """The program's own pid: the launcher's descendant named `name` under `gleaner run`."""
        if not self.prefix:
            return launcher_pid
        from .common import comm, descendants
        for p in descendants(launcher_pid):
            if comm(p).startswith(name[:15]):
                return p
        return None

    def far_faults_now(self, launcher_pid, name):
        """The run's far faults so far, for counting them over one phase: under gleaner the
        program's remote faults from its live status (`gleaner status`'s files), waited for until
        a status written after this call is there (they are rewritten every second; between
        phases the program is idle, so the count is exact); under Linux swap the cgroup's major
        faults; 0 all-local. None when it cannot be read."""
        if self.system in ("gleaner", "gleaner-memnode"):
            pid = self.program_pid(launcher_pid, name)
            if pid is None:
                return None
            asked = time.time()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                docs = []
                for f in glob.glob(f"/dev/shm/gleaner-status-*/{pid}-*.json") + \
                        glob.glob(f"/tmp/gleaner-status-*/{pid}-*.json"):
                    try:
                        with open(f) as fh:
                            docs.append(json.load(fh))
                    except (OSError, ValueError):
                        pass
                if docs and all(d.get("updated_unix_s", 0) > asked for d in docs):
                    return sum(d["stats"]["faults"]["remote"] for d in docs)
                time.sleep(0.1)
            return None
        if self.system == "linux-swap":
            return self.cgroup.stats().get("pgmajfault")
        return 0

    def collect(self):
        """Far-memory and swap counters for the run, normalised: faults, bytes moved."""
        out = {}
        vs = vmstat()
        b = self._before.get("vmstat", vs)
        if self.system in ("gleaner", "gleaner-memnode"):
            st = read_gleaner_stats(self.stats_file)
            out["gleaner"] = st
            keep = os.environ.get("GLEANER_HARNESS_KEEP_STATS")
            if keep and os.path.exists(self.stats_file):
                shutil.copy(self.stats_file, keep)   # the whole stats file, for an experiment
            if st:
                out["far_faults"] = st.get("remote_faults")
                out["bytes_moved"] = (st.get("bytes_in") or 0) + (st.get("bytes_out") or 0)
            if self.memnode:
                out["memnode_cpu_s"] = round(self.memnode.cpu_s() - self._before["memnode_cpu"], 3)
                out["memnode_alive_after"] = self.memnode.alive()
        elif self.system == "linux-swap":
            cg = self.cgroup.stats()
            sin = vs.get("pswpin", 0) - b.get("pswpin", 0)
            sout = vs.get("pswpout", 0) - b.get("pswpout", 0)
            out["swap"] = {
                "pswpin_pages": sin, "pswpout_pages": sout,
                "kswapd_cpu_s": round(kswapd_cpu_s() - self._before.get("kswapd", kswapd_cpu_s()), 3),
                "cgroup": cg,
                "zram": swapenv.zram_stats(self.swap_dev) if self.swap_dev else None,
            }
            out["far_faults"] = cg.get("pgmajfault")
            out["bytes_moved"] = (sin + sout) * PAGE
        else:
            out["far_faults"] = 0
            out["bytes_moved"] = 0
        return out


def read_gleaner_stats(path):
    """The region stats JSON (summed over the run's processes under `gleaner run`), normalised."""
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    t = d.get("total", d)
    lat = t.get("remote_fault_latency", {})
    ev = t.get("evictions", {})
    fl = t.get("faults", {})
    store = t.get("store") or {}
    codec = store.get("codec") or {}
    return {
        "process_count": t.get("process_count", len(d.get("processes", [])) or 1),
        "remote_faults": fl.get("remote", 0),
        "zero_fill_faults": fl.get("zero_fill", 0),
        "write_protect_faults": fl.get("write_protect", 0),
        "evicted_clean": ev.get("clean", 0),
        "evicted_dirty": ev.get("dirty", 0),
        "bytes_in": t.get("bytes_in", 0),
        "bytes_out": t.get("bytes_out", 0),
        "remote_fault_p50_us": lat.get("p50_us"),
        "remote_fault_p99_us": lat.get("p99_us"),
        "remote_fault_p999_us": lat.get("p999_us"),
        # The far memory the host spent on the run's far pages at its peak (shared-memory data
        # path; summed over processes) with the blobs held then and their bytes, the same at
        # exit (when the stats were written), and the codec's output: for comparing with zram
        # (bench/codec.py). None where the stats predate a field.
        "far_memory_peak_bytes": store.get("peak_resident_bytes"),
        "far_memory_bytes_at_exit": store.get("resident_bytes"),
        "far_blobs_at_peak": store.get("blobs_at_peak"),
        "far_blob_bytes_at_peak": store.get("blob_bytes_at_peak"),
        "far_pages_stored": store.get("pages_stored"),
        "codec_blob_bytes": codec.get("blob_bytes"),
        "codec_pages_encoded": codec.get("pages_encoded"),
        "outcome": d.get("outcome"),
        "exit_status": d.get("exit_status"),
    }


def cleanup_tmp(tmp):
    shutil.rmtree(tmp, ignore_errors=True)
