"""bench/wakeup.py: the renderer takes medians and ranges over the runs, names the fastest
configuration by mean and by p50 from the numbers, shows skipped configurations and failed runs,
and writes its section between its markers (synthetic results, no gleaner needed)."""
import json
import subprocess
import sys

from bench import wakeup
from bench.doc_section import write_section


def _handler(cpu, served, empty):
    return {"cpu": cpu, "wait": "block", "fifo": False, "served": served, "messages": served,
            "wakeups": served + empty, "empty_wakeups": empty, "already_present": 0}


def _config(name, mean, p50, handlers, p99=None):
    faults = sum(h["served"] for h in handlers)
    return {"name": name, "description": f"What {name} is.", "skipped": None, "app_cpus": [0],
            "accesses": faults, "faults": faults,
            "fault_latency": {"count": faults, "mean_us": mean, "p50_us": p50,
                              "p99_us": p99 or p50 * 3, "p999_us": p50 * 6, "max_us": p50 * 9},
            "wall_s": faults * mean / 1e6, "faults_per_s": 1e6 / mean, "handlers": handlers}


def _run(block_same_mean, per_cpu_mean, served0):
    return {"ok": True, "rc": 0, "command": "gleaner bench wakeup --json", "wall_s": 1.0,
            "result": {"pages": 1000, "app_cpu": 0, "allowed_cpus": [0, 1],
                       "fault_threshold_ns": 1000, "configs": [
                           _config("block-same", block_same_mean, 6.0, [_handler(0, 1000, 0)]),
                           _config("per-cpu", per_cpu_mean, 5.0,
                                   [_handler(0, served0, 40), _handler(1, 1000 - served0, 60)]),
                           {"name": "fifo-per-cpu", "description": "What fifo-per-cpu is.",
                            "skipped": "pthread_setschedparam(SCHED_FIFO, priority 1): EPERM"},
                       ]}}


def synthetic():
    """block-same: mean 6.4 (6.0–7.0), p50 6.0; per-cpu: mean 10.0 (9.0–11.0), p50 5.0. So the
    fastest by mean is block-same and by p50 per-cpu. One run of four failed."""
    return {"schema": 1, "date": "2025-01-01T00:00:00+00:00", "git_commit": "deadbeef",
            "command": "python3 bench/wakeup.py",
            "bench_command": "/x/target/release/gleaner bench wakeup --json --pages 1000",
            "results_file": "bench/results/wakeup.json", "pages": 1000, "runs_requested": 4,
            "quick": False,
            "machine": {"cpus": 2, "cpu_model": "test CPU", "mem_gib": 8, "kernel": "6.8",
                        "virtualization": "kvm", "loadavg_at_start": 0.5},
            "runs": [_run(6.4, 10.0, 900), _run(6.0, 9.0, 800), _run(7.0, 11.0, 700),
                     {"ok": False, "rc": 1, "command": "gleaner bench wakeup --json",
                      "error": "gleaner bench wakeup: error: fault handler on CPU 1: boom"}]}


def _row(text, name):
    return next(line for line in text.splitlines() if line.startswith(f"| {name} |"))


def test_rows_are_medians_with_ranges():
    text = wakeup.render_text(synthetic())
    assert text.startswith(wakeup.BEGIN) and text.endswith(wakeup.END)
    row = _row(text, "block-same")
    assert "What block-same is." in row
    assert "| 1000 / 1000 |" in row
    assert "| 6.4 (6.0–7.0) |" in row  # mean
    assert "| 6.0 (6.0–6.0) |" in row  # p50
    assert "CPU 0: 1000 | CPU 0: 0 |" in row
    row = _row(text, "per-cpu")
    assert "| 10.0 (9.0–11.0) |" in row
    assert "CPU 0: 800, CPU 1: 200 | CPU 0: 40, CPU 1: 60 |" in row
    assert "3 of 4 runs of `gleaner bench wakeup --json --pages 1000`" in text


def test_fastest_is_computed_from_the_numbers():
    text = wakeup.render_text(synthetic())
    assert "Fastest by mean: **block-same** (6.4 µs); by p50: **per-cpu** (5.0 µs)." in text
    assert "Slowest by mean: per-cpu (10.0 µs, 1.6× the fastest)." in text
    res = synthetic()
    for rec in res["runs"][:3]:
        rec["result"]["configs"][1]["fault_latency"]["mean_us"] = 3.0
    assert "Fastest by mean: **per-cpu** (3.0 µs)" in wakeup.render_text(res)


def test_skipped_and_failed_are_stated():
    text = wakeup.render_text(synthetic())
    row = _row(text, "fifo-per-cpu")
    assert "skipped: pthread_setschedparam(SCHED_FIFO, priority 1): EPERM" in row
    assert "Skipped: fifo-per-cpu (pthread_setschedparam" in text
    assert "Failed runs: run 4: gleaner bench wakeup: error: fault handler on CPU 1: boom." in text


def test_single_run_has_no_range():
    res = synthetic()
    res["runs"] = res["runs"][:1]
    res["runs_requested"] = 1
    row = _row(wakeup.render_text(res), "block-same")
    assert "| 6.4 | 6.0 |" in row


def test_section_replaces_only_its_own_markers(tmp_path):
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\nbefore\n\n<!-- harness:begin -->\nharness\n<!-- harness:end -->\n")
    text = wakeup.render_text(synthetic())
    write_section(text, wakeup.BEGIN, wakeup.END, str(doc))
    first = doc.read_text()
    assert first.index(wakeup.BEGIN) < first.index("<!-- harness:begin -->")
    write_section(text, wakeup.BEGIN, wakeup.END, str(doc))
    assert doc.read_text() == first
    assert first.count(wakeup.BEGIN) == 1 and "before" in first and "harness\n" in first


def test_render_only_from_a_results_file(tmp_path):
    out, doc = tmp_path / "wakeup.json", tmp_path / "doc.md"
    out.write_text(json.dumps(synthetic()))
    doc.write_text("# Benchmarks\n")
    p = subprocess.run([sys.executable, wakeup.__file__, "--render-only", "--out", str(out),
                        "--doc", str(doc)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "Fastest by mean: **block-same**" in doc.read_text()
