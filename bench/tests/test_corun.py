"""bench/corun.py: slowdowns, their aggregates and WMMR are computed from the cells (a small
synthetic result), and the section renders them per schedule."""
import json

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
