"""The Linux-swap baseline's machine state: swap on a zram device and a memory cgroup per run.

Everything this module creates is written to a state file under /run/gleaner-harness/ *before*
(cgroups) or *as soon as* (zram: the number hot_add hands back) it exists, so that
`python3 -m bench.harness cleanup` can undo it after a crash or a SIGKILL of the harness. Teardown
is idempotent: it checks what is still there and undoes only that.

Supports cgroup v2 (memory.max, memory.swap.max, memory.peak) when the memory controller is on the
unified hierarchy, else cgroup v1 (memory.limit_in_bytes; swap unlimited: memory.memsw.* left alone).
"""

import contextlib
import json
import os
import signal
import subprocess
import threading
import time

from .common import log

STATE_DIR = os.environ.get("GLEANER_HARNESS_STATE", "/run/gleaner-harness")
V2_ROOT = "/sys/fs/cgroup"
V1_ROOT = "/sys/fs/cgroup/memory"
PREFIX = "gleaner-harness-"
ZRAM_CONTROL = "/sys/class/zram-control"


def _write(path, value):
    with open(path, "w") as f:
        f.write(str(value))


def _read(path, default=""):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def cgroup_mode():
    """'v2', 'v1' or None (no memory controller we can use)."""
    if "memory" in _read(os.path.join(V2_ROOT, "cgroup.controllers")).split():
        return "v2"
    if os.path.exists(os.path.join(V1_ROOT, "memory.limit_in_bytes")):
        return "v1"
    return None


def cgroup_base():
    mode = cgroup_mode()
    return V2_ROOT if mode == "v2" else V1_ROOT if mode == "v1" else None


def active_swaps():
    lines = _read("/proc/swaps").splitlines()[1:]
    return [ln.split()[0] for ln in lines if ln.strip()]


def zram_devices():
    return sorted(d for d in os.listdir("/sys/block") if d.startswith("zram"))


def harness_cgroups():
    out = []
    for base in {V1_ROOT, V2_ROOT}:
        try:
            out += [os.path.join(base, d) for d in os.listdir(base)
                    if d.startswith(PREFIX) and os.path.isdir(os.path.join(base, d))]
        except OSError:
            pass
    return sorted(out)


def snapshot():
    """What a test compares before and after: zram devices, active swaps, harness cgroups."""
    return {"zram": zram_devices(), "swaps": active_swaps(), "cgroups": harness_cgroups(),
            "v2_subtree": _read(os.path.join(V2_ROOT, "cgroup.subtree_control"))}


def unavailable_reason():
    if os.geteuid() != 0:
        return "needs root (cgroups, swapon)"
    if cgroup_mode() is None:
        return "no cgroup memory controller (neither v2 memory nor v1 memory.limit_in_bytes)"
    if not (os.path.isdir(ZRAM_CONTROL) or os.path.exists("/sys/block/zram0") or _modprobe_ok()):
        return "no zram (modprobe zram failed)"
    for tool in ("mkswap", "swapon", "swapoff"):
        if not any(os.access(os.path.join(d, tool), os.X_OK) for d in ("/sbin", "/usr/sbin", "/bin", "/usr/bin")):
            return f"{tool} not found (apt-get install util-linux)"
    return None


def _modprobe_ok():
    return subprocess.run(["modprobe", "-n", "zram"], capture_output=True).returncode == 0


# ---- the state file ------------------------------------------------------------------------


class State:
    def __init__(self, pid=None):
        self.pid = pid or os.getpid()
        self.path = os.path.join(STATE_DIR, f"state-{self.pid}.json")
        self.data = {"pid": self.pid, "zram": [], "cgroups": [], "v2_enabled_memory": False,
                     "swapon": []}
        if os.path.exists(self.path):
            with open(self.path) as f:
                self.data.update(json.load(f))

    def save(self):
        os.makedirs(STATE_DIR, exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def add(self, key, item):
        if item not in self.data[key]:
            self.data[key].append(item)
        self.save()

    def remove(self, key, item):
        if item in self.data[key]:
            self.data[key].remove(item)
        self.save()

    def empty(self):
        return not (self.data["zram"] or self.data["cgroups"] or self.data["v2_enabled_memory"]
                    or self.data["swapon"])

    def drop(self):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


# ---- zram swap -----------------------------------------------------------------------------


def _run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def zram_swap_on(state, size_bytes, algorithm=None):
    """Adds a zram device of `size_bytes`, makes it swap (highest priority). Returns its record."""
    how = None
    if os.path.isdir(ZRAM_CONTROL):
        rec = {"dev": None, "how": "hot_add"}
        state.add("zram", rec)           # the intent, before the device exists
        n = int(_read(os.path.join(ZRAM_CONTROL, "hot_add")))
        state.remove("zram", rec)
        rec = {"dev": n, "how": "hot_add"}
        state.add("zram", rec)
        how = "hot_add"
    else:
        rec = {"dev": 0, "how": "module"}
        state.add("zram", rec)
        _run(["modprobe", "zram", "num_devices=1"])
        for _ in range(50):
            if os.path.exists(os.path.join(ZRAM_CONTROL, "hot_add")) or os.path.exists("/sys/block/zram0"):
                break
            time.sleep(0.1)
        if os.path.isdir(ZRAM_CONTROL):
            # The module came with hot_add: use a device of our own as above, keep the module
            # record so that teardown unloads it.
            n = int(_read(os.path.join(ZRAM_CONTROL, "hot_add")))
            rec2 = {"dev": n, "how": "hot_add"}
            state.add("zram", rec2)
            rec = rec2
        how = rec["how"]
    dev = f"/dev/zram{rec['dev']}"
    sysfs = f"/sys/block/zram{rec['dev']}"
    for _ in range(50):
        if os.path.exists(dev) and os.path.exists(os.path.join(sysfs, "disksize")):
            break
        time.sleep(0.05)
    algos = _read(os.path.join(sysfs, "comp_algorithm"))
    if algorithm and algorithm in algos.replace("[", " ").replace("]", " ").split():
        _write(os.path.join(sysfs, "comp_algorithm"), algorithm)
    _write(os.path.join(sysfs, "disksize"), int(size_bytes))
    _run(["mkswap", dev])
    state.add("swapon", dev)
    _run(["swapon", "-p", "32767", dev])
    chosen = _read(os.path.join(sysfs, "comp_algorithm"))
    chosen = chosen[chosen.find("[") + 1:chosen.find("]")] if "[" in chosen else chosen
    log(f"swap on {dev} ({size_bytes >> 20} MiB zram, {chosen}, {how})")
    return {"device": dev, "disksize_bytes": int(size_bytes), "comp_algorithm": chosen, "how": how}


def linux_swap_settings():
    """What a Linux-swap baseline ran under, for a results file."""
    return {
        "cgroup": cgroup_mode(),
        "swappiness": open("/proc/sys/vm/swappiness").read().strip(),
        "page_cluster": open("/proc/sys/vm/page-cluster").read().strip(),
        "thp_enabled": _read("/sys/kernel/mm/transparent_hugepage/enabled"),
        "other_swaps_at_start": active_swaps(),
    }


def zram_stats(dev):
    """mm_stat of the device: orig_data_size, compr_data_size, mem_used_total, ..."""
    name = os.path.basename(dev)
    vals = _read(f"/sys/block/{name}/mm_stat").split()
    keys = ["orig_data_size", "compr_data_size", "mem_used_total", "mem_limit", "mem_used_max",
            "same_pages", "pages_compacted", "huge_pages"]
    return {k: int(v) for k, v in zip(keys, vals)}


class ZramSampler:
    """Polls the zram device's mm_stat while a run is in progress (the process's swap is freed
    when it exits, so mem_used_total is read during the run; mem_used_max after it). `peak` holds
    each field's own maximum; `at_peak` the whole mm_stat of the sample where mem_used_total was
    highest (so that its mem_used_total and orig_data_size are of the same moment). Given the
    run's `cgroup`, `at_peak` also holds what the cgroup had charged at that moment:
    `cgroup_anon_bytes` and `cgroup_file_bytes` (memory.stat's rss and cache on v1, anon and
    file on v2), i.e. how much of the limit the program's local anonymous memory had."""

    def __init__(self, dev, interval=0.05, cgroup=None):
        self.dev, self.interval, self.cgroup = dev, interval, cgroup
        self.peak = {"mem_used_total": 0, "orig_data_size": 0, "compr_data_size": 0}
        self.at_peak = {}
        self.samples = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.is_set():
            st = zram_stats(self.dev)
            self.samples += 1
            if st.get("mem_used_total", 0) > self.at_peak.get("mem_used_total", -1):
                if self.cgroup is not None:
                    st.update(self.cgroup.charged())
                self.at_peak = st
            for k in self.peak:
                self.peak[k] = max(self.peak[k], st.get(k, 0))
            self._stop.wait(self.interval)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(timeout=5)


def _teardown_zram(state):
    errors = []
    for dev in list(state.data["swapon"]):
        if dev in active_swaps():
            p = subprocess.run(["swapoff", dev], capture_output=True, text=True)
            if p.returncode != 0:
                errors.append(f"swapoff {dev}: {p.stderr.strip()}")
                continue
        state.remove("swapon", dev)
    for rec in reversed(list(state.data["zram"])):
        n = rec["dev"]
        if n is None:
            # Crashed between hot_add and recording the number: a device that is not swap and
            # was not there... cannot be told from others safely; report it.
            state.remove("zram", rec)
            continue
        sysfs = f"/sys/block/zram{n}"
        if rec["how"] == "hot_add":
            if os.path.exists(sysfs):
                if f"/dev/zram{n}" in active_swaps():
                    errors.append(f"/dev/zram{n} still swap")
                    continue
                with contextlib.suppress(OSError):
                    _write(os.path.join(sysfs, "reset"), 1)
                try:
                    _write(os.path.join(ZRAM_CONTROL, "hot_remove"), n)
                except OSError as e:
                    errors.append(f"hot_remove zram{n}: {e}")
                    continue
            state.remove("zram", rec)
        elif rec["how"] == "module":
            if os.path.isdir("/sys/module/zram"):
                p = subprocess.run(["modprobe", "-r", "zram"], capture_output=True, text=True)
                if p.returncode != 0:
                    errors.append(f"modprobe -r zram: {p.stderr.strip()}")
                    continue
            state.remove("zram", rec)
    return errors


# ---- cgroups -------------------------------------------------------------------------------


class Cgroup:
    """A memory cgroup limited to `limit_bytes`, swap unlimited. Join it from a child's preexec."""

    def __init__(self, state, name, limit_bytes):
        self.mode = cgroup_mode()
        self.base = cgroup_base()
        self.path = os.path.join(self.base, PREFIX + name)
        self.limit = int(limit_bytes)
        state.add("cgroups", self.path)   # the intent first
        if self.mode == "v2":
            sub = _read(os.path.join(V2_ROOT, "cgroup.subtree_control")).split()
            if "memory" not in sub:
                state.data["v2_enabled_memory"] = True
                state.save()
                _write(os.path.join(V2_ROOT, "cgroup.subtree_control"), "+memory")
        os.makedirs(self.path, exist_ok=True)
        if self.mode == "v2":
            _write(os.path.join(self.path, "memory.max"), self.limit)
            with contextlib.suppress(OSError):
                _write(os.path.join(self.path, "memory.swap.max"), "max")
        else:
            _write(os.path.join(self.path, "memory.limit_in_bytes"), self.limit)
            with contextlib.suppress(OSError):
                _write(os.path.join(self.path, "memory.swappiness"), _read("/proc/sys/vm/swappiness", "60"))
        self.procs = os.path.join(self.path, "cgroup.procs")

    def preexec(self):
        """For subprocess preexec_fn: moves the new child into the cgroup before it execs."""
        procs = self.procs

        def join():
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        return join

    def memory_stat(self):
        """The cgroup's memory.stat as {name: int} (empty when it cannot be read, as after the
        cgroup is gone)."""
        st = {}
        for line in _read(os.path.join(self.path, "memory.stat")).splitlines():
            k, v = line.split()
            st[k] = int(v)
        return st

    def charged(self):
        """What the cgroup holds now: {"cgroup_anon_bytes", "cgroup_file_bytes"} (empty when
        memory.stat cannot be read)."""
        st = self.memory_stat()
        anon, file = ("anon", "file") if self.mode == "v2" else ("rss", "cache")
        if anon not in st or file not in st:
            return {}
        return {"cgroup_anon_bytes": st[anon], "cgroup_file_bytes": st[file]}

    def stats(self):
        if self.mode == "v2":
            st = self.memory_stat()
            peak = _read(os.path.join(self.path, "memory.peak"), "0")
            ev = dict(line.split() for line in _read(os.path.join(self.path, "memory.events")).splitlines() if line)
            return {"limit_bytes": self.limit, "peak_bytes": int(peak or 0), "oom_kills": int(ev.get("oom_kill", 0)),
                    "pgmajfault": st.get("pgmajfault"), "swap_bytes": _read(os.path.join(self.path, "memory.swap.current")),
                    "stat": {k: st[k] for k in ("anon", "file", "pgmajfault", "pgfault", "pswpin", "pswpout") if k in st}}
        st = self.memory_stat()
        oc = dict(line.split() for line in _read(os.path.join(self.path, "memory.oom_control")).splitlines() if line)
        return {"limit_bytes": self.limit, "oom_kills": int(oc.get("oom_kill", 0)),
                "peak_bytes": int(_read(os.path.join(self.path, "memory.max_usage_in_bytes"), "0") or 0),
                "failcnt": int(_read(os.path.join(self.path, "memory.failcnt"), "0") or 0),
                "pgmajfault": st.get("total_pgmajfault", st.get("pgmajfault")),
                "stat": {k: st[k] for k in ("rss", "cache", "swap", "pgpgin", "pgpgout", "pgmajfault",
                                            "total_pgmajfault") if k in st}}


def _remove_cgroup(path):
    if not os.path.isdir(path):
        return None
    procs = os.path.join(path, "cgroup.procs")
    for attempt in range(50):
        pids = [int(p) for p in _read(procs).split()]
        if not pids:
            try:
                os.rmdir(path)
                return None
            except OSError as e:
                if attempt == 49:
                    return f"rmdir {path}: {e}"
        # Processes left in a harness cgroup were started by the harness: end them.
        kill = os.path.join(path, "cgroup.kill")
        if os.path.exists(kill):
            with contextlib.suppress(OSError):
                _write(kill, 1)
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.1)
    return f"{path} not removed"


def _teardown_cgroups(state, extra=()):
    errors = []
    for path in list(state.data["cgroups"]) + list(extra):
        err = _remove_cgroup(path)
        if err:
            errors.append(err)
        elif path in state.data["cgroups"]:
            state.remove("cgroups", path)
    if state.data["v2_enabled_memory"]:
        others = [d for d in os.listdir(V2_ROOT) if os.path.isdir(os.path.join(V2_ROOT, d))
                  and os.path.exists(os.path.join(V2_ROOT, d, "memory.max"))]
        try:
            _write(os.path.join(V2_ROOT, "cgroup.subtree_control"), "-memory")
            state.data["v2_enabled_memory"] = False
            state.save()
        except OSError as e:
            errors.append(f"could not turn the v2 memory controller back off ({len(others)} "
                          f"cgroups use it): {e}")
    return errors


def teardown(state):
    """Undoes everything `state` records: cgroups first (their processes), then swap and zram."""
    errors = _teardown_cgroups(state) + _teardown_zram(state)
    if state.empty() and not errors:
        state.drop()
    return errors


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def cleanup_all(force=False):
    """The idempotent `cleanup` command: undoes what any harness left behind (state files of dead
    harnesses; with force, of live ones too), and removes any stray gleaner-harness-* cgroup."""
    errors = []
    done = []
    if os.path.isdir(STATE_DIR):
        for f in sorted(os.listdir(STATE_DIR)):
            if not (f.startswith("state-") and f.endswith(".json")):
                continue
            pid = int(f[len("state-"):-len(".json")])
            if pid != os.getpid() and _alive(pid) and not force:
                errors.append(f"harness {pid} is still running; not touching its state (--force to)")
                continue
            st = State(pid)
            errors += teardown(st)
            done.append(pid)
    stray = [c for c in harness_cgroups()]
    if stray:
        errors += _teardown_cgroups(_Scratch(), extra=stray)
    return done, errors


class _Scratch(State):
    """A state that is never saved (for removing stray cgroups found by name)."""

    def __init__(self):
        self.pid = 0
        self.path = None
        self.data = {"pid": 0, "zram": [], "cgroups": [], "v2_enabled_memory": False, "swapon": []}

    def save(self):
        pass

    def drop(self):
        pass


@contextlib.contextmanager
def swap_environment(size_bytes, algorithm=None, state=None):
    """zram swap for the duration of the block; undone on exit, whatever the exit."""
    state = state or State()
    info = None
    try:
        info = zram_swap_on(state, size_bytes, algorithm)
        yield state, info
    finally:
        errors = teardown(state)
        if errors:
            log("teardown left errors: " + "; ".join(errors))
