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
    doc = tmp_path / "B.md"
    doc.write_text("# Benchmarks\n")
    corun.render(json.loads(json.dumps(res)), str(doc), "bench/results/corun.json")
    text = doc.read_text()
    assert "| fifo | 100 → 400 | 4.00 | 10.0 → 20.0 | 2.00 | 4.00 | 3.33 | 4.00 |" in text
    assert "| fair | 100 → 120 | 1.20 | 10.0 → 12.0 | 1.20 | 2.40 |" in text
    assert "failed cells: 0 of 6" in text
