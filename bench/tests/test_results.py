"""bench-quick's JSON is complete: every workload x system x ratio is there with its metrics (or,
for a run that failed, with its error); the load generator and the doc generator behave.

HARNESS_RUN_QUICK=1 runs the quick sweep first (what CI does); otherwise the committed
bench/results/harness-quick.json (or GLEANER_HARNESS_QUICK_JSON) is checked. HARNESS_QUICK_RATIOS
(for example `50`, what CI runs: every workload and system, at the headline ratio only, in about a
third of the full quick sweep's five minutes) limits the sweep to those local-memory ratios, and
the check expects exactly them."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from bench.harness import report
from bench.harness.common import BUILD, HARNESS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKLOADS = {"memcached", "redis", "xgboost", "pagerank", "micro-seq", "micro-random"}
# The quick sweep's ratios, or those HARNESS_QUICK_RATIOS asked for.
QUICK_RATIOS = os.environ.get("HARNESS_QUICK_RATIOS", "")
RATIOS = [int(x) for x in QUICK_RATIOS.split(",")] if QUICK_RATIOS else [100, 75, 50, 25]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    if os.environ.get("HARNESS_RUN_QUICK") == "1":
        out = tmp_path_factory.mktemp("quick") / "harness-quick.json"
        ratios = ["--ratios", QUICK_RATIOS] if QUICK_RATIOS else []
        p = subprocess.run([sys.executable, "-m", "bench.harness", "quick", "--out", str(out),
                            "--no-render", "--no-progress", *ratios], cwd=ROOT, timeout=900)
        assert p.returncode == 0
        path = str(out)
    else:
        path = os.environ.get("GLEANER_HARNESS_QUICK_JSON",
                              os.path.join(ROOT, "bench", "results", "harness-quick.json"))
    if not os.path.exists(path):
        pytest.skip(f"{path} missing: run `make bench-quick` or set HARNESS_RUN_QUICK=1")
    with open(path) as f:
        return json.load(f)


def test_quick_is_complete(quick):
    assert quick["complete"] is True
    for key in ("machine", "command", "date", "git_commit", "gleaner_launch", "linux_swap"):
        assert quick.get(key), key
    for key in ("kernel", "cpus", "cpu_model", "mem_gib"):
        assert quick["machine"].get(key), key
    assert set(quick["workloads"]) >= WORKLOADS, set(quick["workloads"])
    for name, w in quick["workloads"].items():
        assert w["runs"], name
        assert w.get("footprint_bytes", 0) > 0, name
        assert "all-local" in w["systems"]
        if not name.startswith("micro"):
            assert set(w["systems"]) == {"all-local", "gleaner", "gleaner-memnode", "linux-swap"}, name
            assert w["ratios"] == RATIOS, name
        locals_ = [r for r in w["runs"] if r["system"] == "all-local"]
        assert locals_ and all(r["ok"] for r in locals_), (name, [r.get("error") for r in locals_])
        for system in w["systems"]:
            if system == "all-local":
                continue
            for ratio in w["ratios"]:
                runs = [r for r in w["runs"] if r["system"] == system and r["ratio"] == ratio]
                assert len(runs) == 1, (name, system, ratio, len(runs))
                r = runs[0]
                assert isinstance(r["ok"], bool)
                assert r.get("budget_bytes", 0) > 0
                if not r["ok"]:
                    assert r.get("error"), (name, system, ratio)
                    continue
                for k in w["metric_keys"]:
                    assert (r.get("metrics") or {}).get(k) is not None, (name, system, ratio, k)
                assert r.get("far_faults") is not None and r.get("bytes_moved") is not None, (name, system, ratio)
                assert r.get("command"), (name, system, ratio)
                assert r.get("verified"), (name, system, ratio)
                assert r.get("vs_all_local") is not None
                if not name.startswith("micro"):
                    assert r.get("cpu_total_s") is not None and r.get("peak_rss_bytes"), (name, system, ratio)
        for r in locals_:
            for k in w["metric_keys"]:
                if k == "seconds" and name.startswith("micro"):
                    continue
                assert (r.get("metrics") or {}).get(k) is not None, (name, "all-local", k)
        assert "lowest_ratio_within_80pct" in w


def test_quick_gleaner_runs_succeed(quick):
    """Failures are recorded rather than hidden; in the smoke run gleaner must not fail."""
    bad = [(n, r["system"], r["ratio"], r["error"][:200]) for n, w in quick["workloads"].items()
           for r in w["runs"] if r["system"].startswith("gleaner") and not r["ok"]]
    assert not bad, bad


def test_section_only_between_markers(quick, tmp_path):
    doc = tmp_path / "B.md"
    doc.write_text("# Benchmarks\n\nhand-written text\n")
    text = report.section(quick, os.path.join(ROOT, "bench/results/harness-quick.json"))
    report.write_section(text, str(doc))
    first = doc.read_text()
    assert first.startswith("# Benchmarks\n\nhand-written text\n")
    assert first.count(report.BEGIN) == 1 and first.count(report.END) == 1
    doc.write_text(first + "\ntext after the section\n")
    report.write_section(text, str(doc))
    second = doc.read_text()
    assert second == first + "\ntext after the section\n"
    assert "memcached" in text and "| system |" in text


@pytest.mark.skipif(shutil.which("memcached") is None, reason="memcached not installed")
def test_mcload_checks_every_value(tmp_path):
    os.makedirs(BUILD, exist_ok=True)  # a fresh checkout has no build directory yet
    exe = os.path.join(BUILD, "mcload")
    subprocess.run(["gcc", "-O2", "-o", exe, os.path.join(HARNESS, "mcload.c"), "-lm"], check=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = subprocess.Popen(["memcached", "-p", str(port), "-U", "0", "-l", "127.0.0.1", "-m", "64", "-u", "root"])
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                time.sleep(0.05)
        base = [exe, None, "127.0.0.1", str(port), "2000", "512"]

        def mc(mode, *extra):
            p = subprocess.run([base[0], mode] + base[2:] + list(map(str, extra)), capture_output=True,
                               text=True, timeout=60)
            return p.returncode, json.loads(p.stdout)
        rc, j = mc("load")
        assert rc == 0 and j["completed"] == 2000
        rc, j = mc("verify", 1)
        assert rc == 0 and j["hits"] == 2000 and j["mismatches"] == 0
        rc, j = mc("open", 2000, 1, 90, 0.99, 2, 1)
        assert rc == 0 and j["sent"] == 2000 and j["completed"] == 2000 and j["unanswered"] == 0
        assert 0 < j["latency_us"]["p50"] <= j["latency_us"]["p99"] <= j["latency_us"]["max"]
        assert j["gets"] + j["sets"] == 2000 and j["misses"] == 0
        # A value changed behind mcload's back is reported as wrong.
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"set k00000007 0 0 512\r\n" + b"x" * 512 + b"\r\n")
            assert s.recv(100) == b"STORED\r\n"
        rc, j = mc("verify", 1)
        assert rc == 1 and j["mismatches"] == 1
    finally:
        srv.terminate()
        srv.wait()
