"""bench/spawn.py: per-iteration cost, gleaner's overhead over plain bash and the ratio are taken
per rep from the same rep's plain run, failed runs are left out and counted, and the section
names every system; a real one-iteration run of each loop works (plain bash only when gleaner is
not built)."""
import os
import subprocess
import sys

from bench import spawn


def _run(loop, system, rep, wall, rc=0):
    return {"loop": loop, "system": system, "rep": rep, "rc": rc, "wall_s": wall,
            "cpu_s": wall / 2, "command": f"{system} {loop}"}


def synthetic():
    """fork+exec, 100 iterations: plain 0.10 and 0.12 s, gleaner 0.30 and 0.42 s, compared 0.60
    and (failed) in rep 1. python, 10 iterations: plain 0.5 s, gleaner 0.6 s, compared 0.7 s."""
    return {"date": "2026-11-28T00:00:00+00:00", "git_commit": "abcdef0123",
            "machine": {"cpus": 2, "cpu_model": "test", "mem_gib": 1, "kernel": "6.18",
                        "virtualization": "none"},
            "command": "python3 bench/spawn.py", "results_file": "bench/results/spawn.json",
            "local_mem": "256M", "reps": 2, "iterations": 100,
            "systems": {"plain": "plain", "gleaner": "/g/gleaner", "compared": "/old/gleaner"},
            "compare_label": "the commit before",
            "loops": [{"name": "fork+exec", "what": "true", "script": "x", "iterations": 100},
                      {"name": "python", "what": "py", "script": "y", "iterations": 10}],
            "runs": [_run("fork+exec", "plain", 0, 0.10), _run("fork+exec", "gleaner", 0, 0.30),
                     _run("fork+exec", "compared", 0, 0.60),
                     _run("fork+exec", "gleaner", 1, 0.42), _run("fork+exec", "plain", 1, 0.12),
                     _run("fork+exec", "compared", 1, 9.0, rc=86),
                     _run("python", "plain", 0, 0.5), _run("python", "gleaner", 0, 0.6),
                     _run("python", "compared", 0, 0.7)]}


def test_overhead_and_ratio_come_from_the_same_rep():
    s = spawn.summarize(synthetic())
    fe = s["fork+exec"]
    g = fe["systems"]["gleaner"]
    assert [round(x, 3) for x in g["ms"]] == [3.0, 4.2]
    assert [round(x, 3) for x in g["over_ms"]] == [2.0, 3.0]
    assert [round(x, 3) for x in g["ratio"]] == [3.0, 3.5]
    c = fe["systems"]["compared"]
    assert [round(x, 3) for x in c["over_ms"]] == [5.0]
    assert fe["failed"] == 1
    assert fe["systems"]["plain"]["over_ms"] == []
    py = s["python"]["systems"]["gleaner"]
    assert [round(x, 3) for x in py["ms"]] == [60.0]
    assert [round(x, 3) for x in py["over_ms"]] == [10.0]


def test_the_section_names_every_system_and_counts_failures():
    text = spawn.render_text(synthetic())
    assert text.startswith(spawn.BEGIN) and text.endswith(spawn.END)
    assert "gleaner run at `abcdef0`" in text
    assert "gleaner run, the commit before" in text
    assert "| fork+exec | true | gleaner run at `abcdef0` | 3.60 (3.00–4.20) |" in text
    assert "2.50 (2.00–3.00) | 3.25 (3.00–3.50) |" in text
    assert "Failed runs: 1" in text


def test_a_one_iteration_run_of_each_loop_succeeds():
    for name, _, script, n in spawn.loops(1):
        for system in ["plain"] + ([spawn.GLEANER] if os.path.exists(spawn.GLEANER) else []):
            rec = spawn.timed(spawn.command(system, script))
            assert rec["rc"] == 0, (name, system, rec)
            assert n == 1, name
            assert rec["wall_s"] > 0 and rec["cpu_s"] >= 0, rec


def test_the_script_rejects_a_missing_binary(tmp_path):
    p = subprocess.run([sys.executable, spawn.__file__, "--quick", "--compare",
                        str(tmp_path / "no-such-gleaner"), "--out", str(tmp_path / "o.json")],
                       capture_output=True, text=True)
    assert p.returncode != 0
    assert "no-such-gleaner is missing" in p.stderr
