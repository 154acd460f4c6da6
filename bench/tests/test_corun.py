"""bench/corun.py: slowdowns, their aggregates and WMMR are computed from the cells (a small
synthetic result), and the section renders them per schedule."""
import json
import os
import sys

from bench import corun


def _cells(schedule, mc_solo, mc_co, b_solo, b_co):
    mc = lambda p99, b: {"ok": True, "p99_us": p99, "bytes": b, "open_s": 10.0}  # noqa: E731
    bt = lambda w, b: {"ok": True, "wall_s": w, "bytes": b}  # noqa: E731
    return [
        {"kind": "solo-memcached", "schedule": schedule, "rep": 0, "ok": True,
         "programs": {"memcached": mc(mc_solo, 1000)}},
        {"kind": "solo-batch", "schedule": schedule, "rep": 0, "ok": True,
         "programs": {"batch1": bt(b_solo, 1000)}},
        {"kind": "corun", "schedule": schedule, "rep": 0, "ok": True,
         "programs": {"memcached": mc(mc_co, 500), "batch1": bt(b_co, 1000),
                      "batch2": bt(b_co * 2, 1000)}},
    ]


def _rendered(res, tmp_path):
    """The co-run section `render` writes for `res` into a fresh document."""
    doc = tmp_path / "B.md"
    doc.write_text("# Benchmarks\n")
    corun.render(res, str(doc), "bench/results/corun.json")
    return doc.read_text()


def test_summarise_and_render(tmp_path):
    res = {"reps": 1, "date": "d", "git_commit": "abc", "machine": {"cpus": 2, "kernel": "k"},
           "params": {"bandwidth": "32M", "keys": 10, "vsize": 1024, "rate": 100, "open_s": 10,
                      "mc_local": "16M", "demo_n": 100, "batch_local": "16M"},
           "cells": _cells("fifo", 100, 400, 10.0, 20.0) + _cells("fair", 100, 120, 10.0, 12.0)}
    out, agg = corun.summarise(res, "fifo")
    assert out["memcached"]["slowdown"] == 4.0
    assert out["batch1"]["slowdown"] == 2.0 and out["batch2"]["slowdown"] == 4.0
    # Bandwidth ratios: memcached 500/10 over 1000/10 = 0.5; batch1 (1000/20)/(1000/10) = 0.5;
    # batch2 (1000/40)/(100) = 0.25: WMMR 0.25 / 0.5.
    assert abs(agg["wmmr"] - 0.5) < 1e-9
    assert abs(agg["mean"] - 10 / 3) < 1e-9 and agg["max"] == 4.0
    text = _rendered(json.loads(json.dumps(res)), tmp_path)
    assert "| fifo | 100 → 400 | 4.00 | 10.0 → 20.0 | 2.00 | 4.00 | 3.33 | 4.00 |" in text
    assert "| fair | 100 → 120 | 1.20 | 10.0 → 12.0 | 1.20 | 2.40 |" in text
    assert "failed cells: 0 of 6" in text


def _linux_res(systems, cells):
    """A run with Linux swap among its systems: its params carry the measured idle sizes."""
    return {"reps": 1, "date": "d", "git_commit": "abc", "machine": {"cpus": 2, "kernel": "k"},
            "systems": systems,
            "params": {"bandwidth": "32M", "keys": 10, "vsize": 1024, "rate": 100, "open_s": 10,
                       "mc_local": "16M", "demo_n": 100, "batch_local": "16M",
                       "demo_baseline": 9 * 2**20, "mc_baseline": 3 * 2**20},
            "cells": cells}


def test_linux_swap_is_a_third_row_with_its_cgroup_limits(tmp_path):
    res = _linux_res(["fifo", "fair", "linux-swap"],
                     _cells("fifo", 100, 400, 10.0, 20.0) + _cells("fair", 100, 120, 10.0, 12.0)
                     + _cells("linux-swap", 200, 1000, 8.0, 16.0))
    out, agg = corun.summarise(res, "linux-swap")
    assert out["memcached"]["slowdown"] == 5.0 and agg["max"] == 5.0
    text = _rendered(res, tmp_path)
    assert "| linux-swap | 200 → 1000 | 5.00 | 8.0 → 16.0 | 2.00 | 4.00 |" in text
    assert "interpreter 9.0 MiB: 25.0 MiB per batch job" in text
    assert "with no keys 3.0 MiB: 35.0 MiB" in text
    assert "failed cells: 0 of 9" in text


def test_unknown_system_is_refused(capsys):
    import pytest
    with pytest.raises(SystemExit) as e:
        corun.main(["--systems", "fair,zswap", "--no-render", "--out", "/tmp/never-written.json"])
    assert "unknown system zswap" in str(e.value)


def test_a_linux_cell_the_oom_killer_stopped_is_run_again_and_kept_on_record():
    oom = {"programs": {"memcached": {"ok": False, "error": "OOM-killed in its cgroup; x"}}}
    good = {"programs": {"memcached": {"ok": True, "error": None}}}
    outcomes = [oom, oom, good]
    rec = corun.run_cell(lambda: dict(outcomes.pop(0)), "linux-swap")
    assert rec["programs"]["memcached"]["ok"]
    assert len(rec["oom_killed_tries"]) == 2
    # Two retries at most; and a gleaner cell is never retried.
    outcomes = [oom, oom, oom, good]
    assert not corun.run_cell(lambda: dict(outcomes.pop(0)), "linux-swap")["programs"]["memcached"]["ok"]
    outcomes = [oom, good]
    assert "oom_killed_tries" not in corun.run_cell(lambda: dict(outcomes.pop(0)), "fair")


def test_a_program_that_failed_is_left_out_and_named_but_its_neighbours_count(tmp_path):
    cells = _cells("linux-swap", 200, 1000, 8.0, 16.0)
    cells[2]["ok"] = False
    cells[2]["programs"]["memcached"] = {"ok": False, "error": "OOM-killed in its cgroup; x"}
    res = _linux_res(["linux-swap"], cells)
    out, _ = corun.summarise(res, "linux-swap")
    assert out["memcached"]["slowdown"] is None
    assert out["batch1"]["slowdown"] == 2.0
    text = _rendered(res, tmp_path)
    assert "| linux-swap | 200 → n/a | n/a | 8.0 → 16.0 | 2.00 | 4.00 |" in text
    assert "linux-swap: corun rep 1: memcached: OOM-killed in its cgroup" in text


def test_the_memnodes_priority_is_in_the_command_and_the_header(tmp_path):
    res = {"reps": 1, "date": "d", "git_commit": "abc", "machine": {"cpus": 2, "kernel": "k"},
           "params": {"bandwidth": "32M", "keys": 10, "vsize": 1024, "rate": 2000, "open_s": 10,
                      "mc_local": "16M", "demo_n": 100, "batch_local": "16M",
                      "memnode_nice": corun.MEMNODE_NICE},
           "cells": _cells("fair", 100, 120, 10.0, 12.0)}
    text = _rendered(json.loads(json.dumps(res)), tmp_path)
    assert "`python3 bench/corun.py --reps 1` →" in text
    assert f"(run at nice {corun.MEMNODE_NICE}, as a memnode on a host of its own" in text
    # A run from before the option (no such parameter) ran the memnode at the programs' priority.
    del res["params"]["memnode_nice"]
    text = _rendered(json.loads(json.dumps(res)), tmp_path)
    assert "`python3 bench/corun.py --reps 1 --memnode-nice 0` →" in text
    assert "each way (at the programs' priority)" in text


def _measured(res):
    """`res`'s fair cells with what the script now records of CPU and link bytes: a batch run
    alone takes 3 s of CPU (the memnode 1 s more) in 4 s, co-run 3.3 s; memcached's open phase
    takes 0.2 + 0.1 + 0.2 CPUs for 10 s, and moves 50 and 100 MB/s on the read and write lanes;
    a batch run moves 100 MB each way."""
    for c in res["cells"]:
        progs = c["programs"]
        if c["kind"] == "solo-memcached":
            progs["memcached"].update(cpu_open_s=2.0, load_cpu_open_s=1.0, memnode_cpu_open_s=2.0,
                                      open_lane_bytes=[500e6, 1000e6])
        elif c["kind"] == "solo-batch":
            progs["batch1"].update(wall_s=4.0, cpu_s=3.0)
            c["memnode_cpu_s"] = 1.0
            c["queues"] = {"batch1": {"classes": {"demand": {"bytes": 40e6},
                                                  "prefetch": {"bytes": 60e6},
                                                  "writeback": {"bytes": 100e6}}}}
        else:
            progs["batch1"]["cpu_s"] = progs["batch2"]["cpu_s"] = 3.3
    return res


def test_floors_bound_the_batch_slowdown_by_cpu_and_by_link(tmp_path):
    res = {"reps": 1, "date": "d", "git_commit": "abc", "machine": {"cpus": 2, "kernel": "k"},
           "params": {"bandwidth": "200M", "keys": 10, "vsize": 1024, "rate": 100, "open_s": 10,
                      "mc_local": "16M", "demo_n": 100, "batch_local": "16M"},
           "cells": _cells("fair", 100, 120, 10.0, 12.0)}
    assert corun.floors(res, "fair")["cpu"] is None, "no CPU recorded: no bound"
    assert "What no schedule of the link can beat" not in _rendered(json.loads(json.dumps(res)), tmp_path)
    f = corun.floors(_measured(res), "fair")
    # CPU: two runs of 3 + 1 s on the 2 - 0.5 CPUs memcached leaves: 5.33 s, over 4 s alone.
    assert abs(f["memcached_cpus"] - 0.5) < 1e-9
    assert abs(f["cpu"] - (8 / 1.5) / 4) < 1e-9
    # Link (200 MiB/s): the write lane binds, 200 MB beside memcached's 100 MB/s.
    cap = 200 * 2**20
    assert abs(f["link"] - max(200e6 / (cap - 50e6), 200e6 / (cap - 100e6)) / 4) < 1e-9
    assert abs(f["cpu_inflation"] - 1.1) < 1e-9
    text = _rendered(json.loads(json.dumps(res)), tmp_path)
    assert ("fair: a batch run alone takes 3.00 s of CPU + 1.00 s of the memnode's, memcached's "
            "open phase 0.50 CPUs; bounds on the batch slowdown: CPU 1.33x, link 0.46x; in the "
            "co-run a batch run took 3.30 s of CPU (1.10x alone)") in text


def test_wait_measured_counts_the_descendants_cpu_and_returns_the_output():
    import subprocess
    import pytest
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    # The child spins 0.3 s itself and waits for a grandchild that spins 0.3 s more.
    code = (f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {spin!r}])\n{spin}"
            "print('done'); print('err', file=sys.stderr)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err, cpu = corun.wait_measured(proc, 60)
    assert (out, err, proc.returncode) == ("done\n", "err\n", 0)
    assert cpu >= 0.6, cpu
    proc = subprocess.Popen(["sleep", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    with pytest.raises(subprocess.TimeoutExpired):
        corun.wait_measured(proc, 0.2)
    assert proc.returncode is not None, "killed and reaped"


def test_tree_cpu_counts_a_live_process_and_its_children():
    import subprocess
    spin = "while True: pass"
    parent = subprocess.Popen([sys.executable, "-c",
                               f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {spin!r}])\n"
                               "time.sleep(30)"])
    try:
        import time
        # The parent only sleeps: once the tree has used half a CPU-second, the grandchild's
        # spinning is what counted. On a loaded machine that takes longer than on an idle one.
        deadline, own = time.monotonic() + 20, None
        while time.monotonic() < deadline:
            time.sleep(0.25)
            own = corun.tree_cpu_s(parent.pid)
            if own is not None and own >= 0.5:
                break
        assert own is not None and own >= 0.5, f"the spinning grandchild's CPU counts: {own}"
    finally:
        for child in open(f"/proc/{parent.pid}/task/{parent.pid}/children").read().split():
            os.kill(int(child), 9)
        parent.kill()
        parent.wait()
    assert corun.tree_cpu_s(parent.pid) is None, "a process gone has no CPU to report"


def test_a_programs_fault_steps_are_weighted_over_its_processes_and_rendered(tmp_path):
    def stats(fetch):
        # Two processes: 300 faults at `fetch` µs, 100 at three times that.
        proc = lambda k, f: {"stats": {"fault_breakdown": {  # noqa: E731
            "timed_faults": k, "fetch_mean_us": f, "lookup_mean_us": 10.0, "install_mean_us": 5.0}}}
        return {"total": {"remote_fault_latency": {"count": 400, "mean_us": 1.0, "p99_us": 2.0},
                          "reclaim": {"direct_ns": 2_500_000}},
                "processes": [proc(300, fetch), proc(100, 3 * fetch), {"stats": {}}]}
    assert corun.fault_summary(None) is None
    assert corun.fault_summary({"total": {"remote_fault_latency": {"count": 0}}}) is None
    f = corun.fault_summary(stats(10.0))
    assert f["fetch_mean_us"] == 15.0 and f["lookup_mean_us"] == 10.0
    assert f["remote_faults"] == 400 and f["direct_reclaim_ms"] == 2.5
    res = {"reps": 1, "date": "d", "git_commit": "abc", "machine": {"cpus": 2, "kernel": "k"},
           "params": {"bandwidth": "32M", "keys": 10, "vsize": 1024, "rate": 100, "open_s": 10,
                      "mc_local": "16M", "demo_n": 100, "batch_local": "16M"},
           "cells": _cells("fair", 100, 120, 10.0, 12.0)}
    assert "A far fault's steps" not in _rendered(json.loads(json.dumps(res)), tmp_path)
    for c in res["cells"]:
        for name, prog in c["programs"].items():
            prog["faults"] = corun.fault_summary(stats(20.0 if c["kind"] == "corun" else 10.0))
    text = _rendered(json.loads(json.dumps(res)), tmp_path)
    assert ("fair: a batch job's fetch 15 → 30, lookup 10 → 10, install 5 → 5; memcached's "
            "fetch 15 → 30") in text
