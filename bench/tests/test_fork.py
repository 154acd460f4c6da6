"""bench/fork.py: the section is rendered from the numbers (a small synthetic result), with the
issue's bound, failed cells and systems that were not run."""
import json

from bench import fork


def _cell(system, fork_us, bgsave_s, pss, rss, rep=0, ok=True, non_heap=4.0):
    return {"system": system, "ok": ok, "rep": rep, "fork_us": fork_us, "bgsave_s": bgsave_s,
            "peak_pss_anon_mib": pss, "peak_rss_anon_mib": rss, "non_heap_mib": non_heap,
            "error": None if ok else "digest differs"}


def test_render_reports_each_system_and_the_bound(tmp_path):
    doc = tmp_path / "B.md"
    doc.write_text("# Benchmarks\n")
    res = {"reps": 2, "date": "d", "git_commit": "abc", "machine": {"cpus": 2, "kernel": "k"},
           "params": {"keys": 25000, "value_bytes": 8000, "local_mib": 48},
           "cells": [_cell("all-local", 2000, 0.2, 210, 210), _cell("all-local", 3000, 0.3, 212, 212, rep=1),
                     _cell("gleaner-far", 6000, 2.0, 70, 95), _cell("gleaner-far", 8000, 2.2, 74, 97, rep=1),
                     _cell("gleaner-home", 190000, 0.2, 260, 430),
                     _cell("gleaner-home", 0, 0, 0, 0, rep=1, ok=False)]}
    fork.render(json.loads(json.dumps(res)), str(doc), "bench/results/fork.json")
    text = doc.read_text()
    assert "| all-local | 2.5 | 0.25 | 211 | 211 | all |" in text
    assert "| gleaner-far | 7.0 | 2.10 | 72 | 96 | all |" in text
    assert "| gleaner-home | 190.0 | 0.20 | 260 | 430 | FAILED: digest differs |" in text
    assert "| linux-swap | not run | | | | |" in text
    assert "failed cells: 1 of 6" in text
    assert "80 MiB; `gleaner-far` peaked at 72 MiB (0.90× the bound)" in text
