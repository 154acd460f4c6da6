"""Shared pieces of the harness: paths, the machine description, and running a child under a
watchdog with its resource usage (CPU of the whole process tree that it reaps, peak RSS, faults)."""

import datetime
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

HARNESS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HARNESS))
RESULTS = os.path.join(ROOT, "bench", "results")
PLOTS = os.path.join(RESULTS, "harness-plots")
BUILD = os.path.join(HARNESS, "build")
JOBS = os.path.join(HARNESS, "jobs")
DOC = os.path.join(ROOT, "bench", "results", "DETAILS.md")
GLEANER = os.environ.get("GLEANER_HARNESS_BIN", os.path.join(ROOT, "target", "release", "gleaner"))
PRELOAD = os.path.join(os.path.dirname(GLEANER), "libgleaner_preload.so")
PAGE = 4096


def log(*args):
    print("[harness]", *args, file=sys.stderr, flush=True)


def python_exe():
    """The real interpreter (not a pyenv shim): what runs the Python workloads."""
    return os.path.realpath(sys.executable)


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def machine():
    mem_kib = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    virt = "unknown"
    try:
        virt = subprocess.run(["systemd-detect-virt"], capture_output=True, text=True).stdout.strip() or virt
    except OSError:
        pass
    if virt == "unknown":
        with open("/proc/cpuinfo") as f:
            virt = "vm" if " hypervisor" in f.read() else "bare metal?"
    os_name = "unknown"
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    os_name = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return {
        "hostname_hash": hash(socket.gethostname()) & 0xFFFF,
        "kernel": platform.release(),
        "os": os_name,
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "mem_gib": round(mem_kib / (1 << 20), 1),
        "virtualization": virt,
        "python": platform.python_version(),
        "loadavg_at_start": os.getloadavg()[0],
    }


def git_commit():
    try:
        out = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "crates"],
                               capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + ("+uncommitted-crates-changes" if dirty else "")
    except OSError:
        return "unknown"


def fmt_cmd(cmd, env=None):
    pre = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in (env or {}).items())
    return (pre + " " if pre else "") + " ".join(shlex.quote(str(c)) for c in cmd)


def parse_size(s):
    s = str(s).strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def children_of(pid):
    kids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                kids.append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    return kids


def descendants(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children_of(p):
            out.append(c)
            todo.append(c)
    return out


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def vm_hwm(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def proc_cpu_s(pid):
    """utime + stime of a live process (its own threads), seconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def vmstat():
    out = {}
    with open("/proc/vmstat") as f:
        for line in f:
            k, v = line.split()
            out[k] = int(v)
    return out


def kswapd_cpu_s():
    total = 0.0
    for d in os.listdir("/proc"):
        if d.isdigit() and comm(int(d)).startswith("kswapd"):
            total += proc_cpu_s(int(d))
    return total


LIVE = set()   # Child objects not yet reaped: the harness ends their groups on an interruption


class Child:
    """A child process in its own session (so that the watchdog can end its whole group), reaped
    with wait4 so that its rusage covers the tree it reaped (user+sys, max RSS, faults)."""

    elapsed = 0.0

    def __init__(self, cmd, env=None, preexec=None, stdout=None, stderr=None, stdin=None, timeout=None,
                 name=None):
        self.cmd = [str(c) for c in cmd]
        self.name = name or os.path.basename(self.cmd[0])
        full_env = dict(os.environ)
        full_env.update({k: str(v) for k, v in (env or {}).items()})
        self.proc = subprocess.Popen(self.cmd, env=full_env, preexec_fn=preexec, stdout=stdout,
                                     stderr=stderr, stdin=stdin, start_new_session=True)
        self.pid = self.proc.pid
        LIVE.add(self)
        self.start = time.monotonic()
        self.rc = None
        self.rusage = None
        self.timed_out = False
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._watchdog = None
        if timeout:
            self._watchdog = threading.Thread(target=self._watch, args=(timeout,), daemon=True)
            self._watchdog.start()

    def _watch(self, timeout):
        if self._done.wait(timeout):
            return
        self.timed_out = True
        log(f"watchdog: {self.name} (pid {self.pid}) still running after {timeout:.0f} s: SIGTERM")
        self.signal_group(signal.SIGTERM)
        if self._done.wait(10):
            return
        log(f"watchdog: {self.name} (pid {self.pid}) ignored SIGTERM: SIGKILL")
        self.signal_group(signal.SIGKILL)

    def signal_group(self, sig):
        """Signals the child's process group (the child and what it started, all ours)."""
        with self._lock:
            if self.rc is not None:
                return
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                pass

    def poll(self):
        return self.proc.poll() if self.rc is None else self.rc

    def wait(self, timeout=None):
        """Reaps the child (after `timeout` seconds it is terminated, then killed)."""
        if self.rc is not None:
            return self.rc
        if timeout is not None:
            t = threading.Timer(timeout, self._expire)
            t.daemon = True
            t.start()
        else:
            t = None
        while True:
            try:
                _, status, ru = os.wait4(self.pid, 0)
                break
            except InterruptedError:
                continue
            except ChildProcessError:
                status, ru = 0, None
                break
        if t:
            t.cancel()
        with self._lock:
            self.rusage = ru
            self.rc = os.waitstatus_to_exitcode(status) if ru is not None else self.proc.returncode
            self.proc.returncode = self.rc
        self._done.set()
        LIVE.discard(self)
        self.elapsed = time.monotonic() - self.start
        return self.rc

    def _expire(self):
        self.timed_out = True
        self.signal_group(signal.SIGTERM)
        time.sleep(10)
        self.signal_group(signal.SIGKILL)

    def stop(self, sig=signal.SIGTERM, grace=20):
        """Asks the child to stop (only the child: a launcher forwards it), then waits; kills the
        whole group if it does not go within `grace` seconds."""
        if self.rc is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass
            t = threading.Timer(grace, lambda: self.signal_group(signal.SIGKILL))
            t.daemon = True
            t.start()
            self.wait()
            t.cancel()
        # Anything left in its group (a launcher's helper that outlived it) is ours: end it.
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return self.rc

    def usage(self):
        ru = self.rusage
        if ru is None:
            return {}
        return {
            "cpu_user_s": round(ru.ru_utime, 3),
            "cpu_sys_s": round(ru.ru_stime, 3),
            "cpu_s": round(ru.ru_utime + ru.ru_stime, 3),
            "maxrss_tree_bytes": ru.ru_maxrss * 1024,
            "major_faults": ru.ru_majflt,
            "minor_faults": ru.ru_minflt,
        }


def run_capture(cmd, timeout, env=None):
    """Runs a client-side helper (not measured), returns (rc, stdout, stderr)."""
    try:
        p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **(env or {})})
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return 124, out, err + f"\n(timed out after {timeout} s)"


def last_json_line(text):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None
