"""bench/pool.py: the demo checksum is compared without its timing, and the section is rendered
from the numbers (a small synthetic result), failed cells and missing phases included."""
import json

from bench import pool


def test_checksum_drops_the_timing():
    out = "warming up\nchecksum 6b477e7fed232302 over 50000 objects in 0.28 s\n"
    assert pool._checksum(out) == "checksum 6b477e7fed232302 over 50000 objects"
    assert pool._checksum("nothing here\n") is None


def _member(written):
    return {"endpoint": "127.0.0.1:1", "alive": True, "pages_written": written}


def _mc(replicas, kill, p99, rps=None, rep=0, ok=True):
    phases = {"open": {"latency_us": {"p50": 100, "p99": p99}, "unanswered": 0, "mismatches": 0},
              "verify": {"misses": 0}}
    if rps:
        phases["closed"] = {"throughput_rps": rps}
    if kill:
        phases["open_recovery"] = {"latency_us": {"p50": 100, "p99": 2 * p99}, "unanswered": 0,
                                   "mismatches": 0}
    return {"kind": "memcached", "replicas": replicas, "kill": kill, "ok": ok, "rep": rep,
            "error": None if ok else "boom", "phases": phases,
            "pool": {"pages_repaired": 1000, "repair_seconds": 0.5} if kill else None}


def test_render_reports_ratios_and_the_kill(tmp_path):
    doc = tmp_path / "B.md"
    doc.write_text("# Benchmarks\n")
    res = {"reps": 1, "date": "d", "git_commit": "abc", "machine": {"cpus": 2, "kernel": "k"},
           "params": {"keys": 10, "vsize": 1024, "rate": 100, "open_s": 1, "closed_s": 1, "local": "8M"},
           "cells": [
               {"kind": "demo", "config": "one", "ok": True, "wall_s": 2.0, "pages_written": 100},
               {"kind": "demo", "config": "pool-r1", "ok": True, "wall_s": 2.2, "pages_written": 100},
               {"kind": "demo", "config": "pool-r2", "ok": True, "wall_s": 3.0, "pages_written": 200},
               _mc(1, False, 400, rps=1000), _mc(2, False, 500, rps=800), _mc(2, True, 300),
               _mc(2, True, 300, rep=1, ok=False)]}
    pool.render(json.loads(json.dumps(res)), str(doc), "bench/results/pool.json")
    text = doc.read_text()
    assert "| pool of 3, 2 replicas | 3.00 | 1.50 | 200 | all match |" in text
    assert "Two replicas against one: 0.80× the closed-loop throughput." in text
    assert "| 1 | 300 | 600 | 0 | 0 | 0 | 1000 | 0.50 | 2000 |" in text
    assert "FAILED: boom" in text
    assert "Failed cells: 1 of 7." in text
