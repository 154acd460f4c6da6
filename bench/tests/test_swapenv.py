"""The Linux-swap baseline's setup and teardown leave nothing behind: no zram device, no swap, no
cgroup, no process in it, no state file -- after a normal run, after an exception mid-run, after
SIGINT/SIGTERM mid-run (the harness's own handlers) and after a SIGKILL (then `cleanup`)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from bench.harness import swapenv

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
reason = swapenv.unavailable_reason()
pytestmark = pytest.mark.skipif(reason is not None, reason=f"linux-swap baseline unavailable: {reason}")


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def clean_machine():
    before = swapenv.snapshot()
    states_before = set(os.listdir(swapenv.STATE_DIR)) if os.path.isdir(swapenv.STATE_DIR) else set()
    yield before
    after = swapenv.snapshot()
    states_after = set(os.listdir(swapenv.STATE_DIR)) if os.path.isdir(swapenv.STATE_DIR) else set()
    assert after == before, f"left behind: before {before}, after {after}"
    assert states_after <= states_before, f"state files left: {states_after - states_before}"


def test_swap_and_cgroup_work_and_go(clean_machine):
    st = swapenv.State()
    before = swapenv.snapshot()
    with swapenv.swap_environment(512 << 20, state=st) as (_, info):
        assert info["device"] in swapenv.active_swaps()
        assert os.path.basename(info["device"]) in swapenv.zram_devices()
        cg = swapenv.Cgroup(st, f"{os.getpid()}-t1", 48 << 20)
        assert os.path.isdir(cg.path)
        # 128 MiB of incompressible data in a 48 MiB cgroup: it has to swap, and must survive.
        code = ("import os; b = bytearray(os.urandom(128 << 20)); "
                "import hashlib; h = hashlib.sha256(b).hexdigest(); "
                "print(h == hashlib.sha256(bytes(b)).hexdigest())")
        with swapenv.ZramSampler(info["device"], interval=0.01, cgroup=cg) as zs:
            p = subprocess.run([sys.executable, "-c", code], preexec_fn=cg.preexec(), capture_output=True,
                               text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip() == "True"
        # At zram's peak the cgroup's charge was the program's anonymous memory, near its limit.
        anon, file = zs.at_peak.get("cgroup_anon_bytes"), zs.at_peak.get("cgroup_file_bytes")
        assert anon is not None and file is not None, zs.at_peak
        assert 16 << 20 < anon <= 48 << 20 and anon + file <= 48 << 20, zs.at_peak
        stats = cg.stats()
        assert stats["peak_bytes"] <= 48 << 20
        assert swapenv.zram_stats(info["device"])["mem_used_max"] > 0, "nothing was swapped to zram"
    assert swapenv.snapshot() == before
    assert not os.path.exists(st.path)


def test_exception_mid_run_leaves_nothing(clean_machine):
    st = swapenv.State()
    child = None
    with pytest.raises(RuntimeError, match="simulated failure"):
        with swapenv.swap_environment(256 << 20, state=st):
            cg = swapenv.Cgroup(st, f"{os.getpid()}-t2", 32 << 20)
            child = subprocess.Popen(["sleep", "300"], preexec_fn=cg.preexec())
            assert str(child.pid) in open(cg.procs).read().split()
            raise RuntimeError("simulated failure mid-run")
    child.wait(timeout=10)   # teardown ended the process left in the cgroup
    assert child.returncode is not None


def _hold():
    p = subprocess.Popen([sys.executable, "-m", "bench.harness", "selftest-hold"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline().split()
    assert line and line[0] == "READY", p.stderr.read()
    return p, line[1], line[2], int(line[3])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_mid_run_leaves_nothing(clean_machine, sig):
    p, dev, cgpath, child = _hold()
    assert dev in swapenv.active_swaps() and os.path.isdir(cgpath) and _alive(child)
    p.send_signal(sig)
    assert p.wait(timeout=60) == 130, p.stderr.read()
    assert not _alive(child)


def test_sigkill_then_cleanup_command(clean_machine):
    p, dev, cgpath, child = _hold()
    p.kill()
    p.wait(timeout=10)
    # A SIGKILLed harness cannot clean up: its state file says what to undo.
    assert dev in swapenv.active_swaps() and os.path.isdir(cgpath)
    for _ in range(2):   # idempotent
        c = subprocess.run([sys.executable, "-m", "bench.harness", "cleanup"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        assert c.returncode == 0, c.stderr
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def test_interrupting_the_real_harness_mid_run(clean_machine, tmp_path):
    """SIGINT to a real sweep while the memcached linux-swap run is in progress (zram + cgroup set
    up, the server in the cgroup): the harness records the interruption and undoes everything."""
    out = tmp_path / "r.json"
    p = subprocess.Popen([sys.executable, "-m", "bench.harness", "run", "--size", "quick",
                          "--workloads", "memcached", "--systems", "linux-swap", "--ratios", "50",
                          "--out", str(out), "--no-render", "--no-progress"],
                         cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 120
    seen = []
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        seen.append(line)
        if "swap on /dev/zram" in line:
            time.sleep(1.0)
            break
    assert any("swap on" in s for s in seen), "".join(seen)
    assert swapenv.harness_cgroups() or swapenv.active_swaps()
    p.send_signal(signal.SIGINT)
    rc = p.wait(timeout=120)
    assert rc == 130, p.stderr.read()
    import json
    res = json.loads(out.read_text())
    assert "interrupted" in res and not res["complete"]
