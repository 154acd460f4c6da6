"""bench/vs_swap.py: the renderer decides met / not met from the numbers (synthetic results), and
-- as root with zram -- a real --quick run of one pattern writes complete JSON with checked data
and leaves no zram device, swap, cgroup or state file behind."""
import copy
import json
import os
import subprocess
import sys

import pytest

from bench import vs_swap
from bench.harness import swapenv

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fault(mean, p50, p99, count=1000):
    return {"count": count, "mean_us": mean, "p50_us": p50, "p99_us": p99, "p999_us": p99 * 2,
            "max_us": p99 * 4}


def _micro_run(system, pattern, rep, ns, mean, p50, p99, ok=True):
    result = {"pattern": pattern, "ns_per_op": ns, "checksum_ok": ok, "accesses": 2000,
              "init_pass_s": 0.1, "remote_fault_app_visible": _fault(mean, p50, p99)}
    if system == "gleaner":
        result.update({"system": "gleaner", "region": {"faults": {"remote": 900}}})
        rec = {}
    else:
        result.update({"system": "plain", "baseline_rss_bytes": 4 << 20,
                       "fault_counts": {"major": 950, "minor": 10}})
        rec = {"swap": {"swap_ins": 940, "swap_ins_source": "test", "major_faults_cgroup": 950,
                        "vmstat_delta": {"pswpin": 940, "pswpout": 1200},
                        "zram": {"peak_sampled": {"mem_used_total": 8 << 20, "orig_data_size": 20 << 20}}}}
    return {"kind": "micro", "system": system, "pattern": pattern, "rep": rep, "ok": ok,
            "command": f"gleaner bench micro --pattern {pattern}", "wall_s": 1.0, "result": result,
            **rec, **({} if ok else {"error": "CHECKSUM MISMATCH"})}


def _demo_run(system, rep, wall, checksum="abc123"):
    return {"kind": "demo", "system": system, "rep": rep, "ok": True, "wall_s": wall, "job_s": wall - 0.1,
            "checksum": checksum, "command": f"{system} demo",
            **({"gleaner": {"remote_faults": 5}} if system == "gleaner" else {}),
            **({"swap": {"vmstat_delta": {"pswpin": 7, "pswpout": 9}}} if system == "linux-swap" else {})}


def synthetic():
    """seq: every target met. random: mean met (0.9), p50 not met (2.5), p99 not met (0.5); no
    speed target for random. Demo: gleaner 2.0 s / Linux 4.0 s = 0.5, met. Two reps each."""
    res = {"schema": 1, "date": "2025-01-01T00:00:00+00:00", "command": "python3 bench/vs_swap.py",
           "git_commit": "deadbeef", "complete": True,
           "machine": {"cpus": 2, "cpu_model": "test CPU", "mem_gib": 8, "kernel": "6.8", "virtualization": "kvm"},
           "params": {"quick": False, "reps": 2, "size": "512M", "local_pct": 50, "pin_cpu": 0,
                      "demo_n": 50000, "demo_local": "64M"},
           "linux_swap": {"cgroup": "v2", "swappiness": "60", "page_cluster": "3",
                          "cgroup_limit_bytes": (256 + 4) << 20,
                          "baseline_probe": {"result": {"baseline_rss_bytes": 4 << 20}}},
           "micro": {"seq": {"gleaner": [], "linux-swap": []}, "random": {"gleaner": [], "linux-swap": []}},
           "demo": {"all-local": [], "gleaner": [], "linux-swap": []},
           "demo_reference_checksum": "abc123"}
    for rep in range(2):
        # seq: gleaner mean 9 vs 10 (0.9), p50 15 vs 10 (1.5), p99 20 vs 100 (0.2), speed 3000/1000 = 3.
        res["micro"]["seq"]["gleaner"].append(_micro_run("gleaner", "seq", rep, 1000, 9, 15, 20))
        res["micro"]["seq"]["linux-swap"].append(_micro_run("linux-swap", "seq", rep, 3000, 10, 10, 100))
        # random: mean 9 vs 10 (0.9 met), p50 25 vs 10 (2.5 not met), p99 50 vs 100 (0.5 not met).
        res["micro"]["random"]["gleaner"].append(_micro_run("gleaner", "random", rep, 5000, 9, 25, 50))
        res["micro"]["random"]["linux-swap"].append(_micro_run("linux-swap", "random", rep, 4000, 10, 10, 100))
        res["demo"]["all-local"].append(_demo_run("all-local", rep, 0.5))
        res["demo"]["gleaner"].append(_demo_run("gleaner", rep, 2.0))
        res["demo"]["linux-swap"].append(_demo_run("linux-swap", rep, 4.0))
    return res


def _by(vs):
    return {(v["scope"], v["target"]): v for v in vs}


def test_verdicts_come_from_the_numbers():
    v = _by(vs_swap.verdicts(synthetic()))
    assert set(v) == {("seq", "mean"), ("seq", "p50"), ("seq", "p99"), ("seq", "speed"),
                      ("random", "mean"), ("random", "p50"), ("random", "p99"), ("demo", "wall")}
    assert v[("seq", "mean")]["ratio"] == pytest.approx(0.9)
    assert v[("seq", "p50")]["ratio"] == pytest.approx(1.5)
    assert v[("seq", "p99")]["ratio"] == pytest.approx(0.2)
    assert v[("seq", "speed")]["ratio"] == pytest.approx(3.0)   # Linux ns/op / gleaner ns/op
    # Fault-time bounds apply to random access; for seq the ratios are shown without a verdict.
    assert all(v[("seq", k)]["verdict"] == "no target" for k in ("mean", "p50", "p99"))
    assert v[("seq", "speed")]["verdict"] == "met"
    assert v[("random", "mean")]["verdict"] == "met"
    assert v[("random", "p50")]["verdict"] == "not met"
    assert v[("random", "p99")]["verdict"] == "not met"
    assert v[("demo", "wall")]["ratio"] == pytest.approx(0.5)
    assert v[("demo", "wall")]["verdict"] == "met"
    assert v[("seq", "mean")]["per_rep"] == [pytest.approx(0.9)] * 2

    # Move the numbers across the bounds: the verdicts follow.
    res = synthetic()
    for r in res["micro"]["seq"]["linux-swap"]:
        r["result"]["ns_per_op"] = 1500            # speed 1.5 < 2
        r["result"]["remote_fault_app_visible"]["p99_us"] = 50   # p99 ratio 0.4 > 0.25
    for r in res["demo"]["linux-swap"]:
        r["wall_s"] = 1.0                          # gleaner / Linux = 2
    v = _by(vs_swap.verdicts(res))
    assert v[("seq", "speed")]["verdict"] == "not met"
    assert v[("seq", "p99")]["verdict"] == "no target"
    assert v[("demo", "wall")]["verdict"] == "not met"
    for r in res["micro"]["random"]["linux-swap"]:
        r["result"]["remote_fault_app_visible"]["p50_us"] = 30   # random p50 ratio 25/30 <= 2
    assert _by(vs_swap.verdicts(res))[("random", "p50")]["verdict"] == "met"
    # Exactly on the bound counts as met (<= and >=).
    for r in res["micro"]["seq"]["linux-swap"]:
        r["result"]["ns_per_op"] = 2000
    assert _by(vs_swap.verdicts(res))[("seq", "speed")]["verdict"] == "met"


def test_failed_runs_and_undefined_ratios():
    res = synthetic()
    res["micro"]["seq"]["gleaner"][1] = _micro_run("gleaner", "seq", 1, 1000, 9, 15, 20, ok=False)
    for r in res["micro"]["random"]["linux-swap"]:
        r["result"]["remote_fault_app_visible"] = _fault(0.0, 0.0, 0.0, count=0)   # Linux never slow
    v = _by(vs_swap.verdicts(res))
    assert all(v[("seq", k)]["verdict"] == "FAILED" for k in ("mean", "p50", "p99", "speed"))
    assert v[("random", "mean")]["verdict"] == "n/a"
    text = vs_swap.render_text(res)
    assert "**FAILED (1 of 2)**" in text and "**FAILED**" in text

    # A demo checksum that differs from all-local fails the cell, and so the demo target.
    res = synthetic()
    res["demo"]["linux-swap"][0]["checksum"] = "0000"
    vs_swap.check_demo_checksums(res)
    bad = res["demo"]["linux-swap"][0]
    assert not bad["ok"] and "CHECKSUM MISMATCH" in bad["error"]
    assert res["demo"]["gleaner"][0]["ok"]
    assert _by(vs_swap.verdicts(res))[("demo", "wall")]["verdict"] == "FAILED"
    assert vs_swap.failed_cells(res)

    # A gleaner run checked before any all-local run of the rep is judged once all-local is in.
    res = synthetic()
    local = res["demo"]["all-local"]
    res["demo"]["all-local"] = []
    for r in res["demo"]["gleaner"] + local:
        r["run_ok"], r["run_error"] = True, None
    vs_swap.check_demo_checksums(res)
    assert res["demo"]["gleaner"][0]["ok"]
    vs_swap.check_demo_checksums(res, final=True)
    assert not res["demo"]["gleaner"][0]["ok"]
    assert "no all-local checksum" in res["demo"]["gleaner"][0]["error"]
    res["demo"]["all-local"] = local
    vs_swap.check_demo_checksums(res, final=True)
    assert res["demo"]["gleaner"][0]["ok"] and "error" not in res["demo"]["gleaner"][0]
    assert res["demo"]["gleaner"][0]["checksum_matches"] is True


def test_render_text_and_section(tmp_path):
    res = synthetic()
    text = vs_swap.render_text(res)
    assert text.startswith(vs_swap.BEGIN) and text.endswith(vs_swap.END)
    assert "3 of 5 targets met; not met: random p50, random p99." in text
    assert "| seq | speed: Linux ns/op / gleaner ns/op | 1000 ns/op | 3000 ns/op | 3.00 (3.00, 3.00) | ≥ 2 | **met** |" in text
    assert "| random | fault p50: gleaner / Linux | 25.0 µs | 10.0 µs | 2.50 (2.50, 2.50) | ≤ 2 | **not met** |" in text
    assert "| demo | wall time: gleaner / Linux | 2.00 s | 4.00 s | 0.50 | ≤ 1 | **met** |" in text
    assert "covers only the managed heap" in text
    assert "random | speed" not in text   # the speed target is stated for seq and stride:10 only

    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\n<!-- micro:begin -->\nm\n<!-- micro:end -->\n\n"
                   "<!-- harness:begin -->\nh\n<!-- harness:end -->\n")
    out = tmp_path / "vs.json"
    out.write_text(json.dumps(res))
    assert vs_swap.main(["--render-only", "--out", str(out), "--doc", str(doc)]) == 0
    d = doc.read_text()
    assert d.index(vs_swap.BEGIN) < d.index("<!-- harness:begin -->")
    assert d.index("<!-- micro:end -->") < d.index(vs_swap.BEGIN)
    # Re-rendering replaces the section in place.
    res2 = copy.deepcopy(res)
    for r in res2["demo"]["linux-swap"]:
        r["wall_s"] = 1.0
    out.write_text(json.dumps(res2))
    vs_swap.main(["--render-only", "--out", str(out), "--doc", str(doc)])
    d2 = doc.read_text()
    assert d2.count(vs_swap.BEGIN) == 1 and d2.count(vs_swap.END) == 1
    assert "| demo | wall time: gleaner / Linux | 2.00 s | 1.00 s | 2.00 | ≤ 1 | **not met** |" in d2


def test_rotated_order():
    patterns = ["seq", "stride:10", "random"]
    cells = [("micro", p, s) for p in patterns for s in ("gleaner", "linux-swap")]
    cells += [("demo", None, s) for s in ("all-local", "gleaner", "linux-swap")]
    orders = [vs_swap.cell_order(patterns, True, r) for r in range(3)]
    assert all(sorted(o, key=str) == sorted(cells, key=str) for o in orders)
    assert len({o[0] for o in orders}) == 3
    # Within each pattern, gleaner runs first in some reps and Linux in others.
    for p in patterns:
        firsts = {[c for c in o if c[1] == p][0][2] for o in orders}
        assert firsts == {"gleaner", "linux-swap"}, p
    # The demo's three runs each go first once.
    assert {[c for c in o if c[0] == "demo"][0][2] for o in orders} == {"all-local", "gleaner", "linux-swap"}
    assert vs_swap.cell_order(["seq"], False, 0) == [("micro", "seq", "gleaner"), ("micro", "seq", "linux-swap")]


def test_needs_root(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit) as e:
        vs_swap.main(["--quick", "--out", str(tmp_path / "x.json"), "--no-render"])
    assert "needs root" in str(e.value)
    assert not (tmp_path / "x.json").exists()


def test_real_quick_run(tmp_path):
    """A real --quick run of one pattern, no demo (well under two minutes)."""
    reason = swapenv.unavailable_reason()
    if reason is not None:
        pytest.skip(f"vs_swap real run: linux-swap baseline unavailable here: {reason}")
    gleaner = os.path.join(ROOT, "target", "release", "gleaner")
    assert os.access(gleaner, os.X_OK), f"{gleaner} missing: cargo build --release -p gleaner-cli"
    before = swapenv.snapshot()
    states_before = set(os.listdir(swapenv.STATE_DIR)) if os.path.isdir(swapenv.STATE_DIR) else set()
    out = tmp_path / "vs-swap.json"
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# B\n\n<!-- harness:begin -->\nh\n<!-- harness:end -->\n")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "vs_swap.py"), "--quick",
                        "--patterns", "seq", "--skip-demo", "--out", str(out), "--doc", str(doc)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    after = swapenv.snapshot()
    states_after = set(os.listdir(swapenv.STATE_DIR)) if os.path.isdir(swapenv.STATE_DIR) else set()
    assert after == before, f"left behind: before {before}, after {after}"
    assert states_after <= states_before, f"state files left: {states_after - states_before}"
    assert p.returncode == 0, p.stderr[-3000:]

    res = json.loads(out.read_text())
    assert res["complete"] is True and "cleanup_errors" not in res
    for key in ("date", "command", "git_commit", "machine", "params", "linux_swap"):
        assert res.get(key), key
    for key in ("kernel", "cpus", "cpu_model", "mem_gib"):
        assert res["machine"].get(key), key
    assert res["params"]["size"] == "64M" and res["params"]["reps"] == 1
    assert res["demo"] is None and list(res["micro"]) == ["seq"]
    ls = res["linux_swap"]
    baseline = ls["baseline_probe"]["result"]["baseline_rss_bytes"]
    assert baseline > 0
    assert ls["cgroup_limit_bytes"] >= (32 << 20) + baseline
    assert ls["limit_rule"]

    g, = res["micro"]["seq"]["gleaner"]
    lx, = res["micro"]["seq"]["linux-swap"]
    for rec in (g, lx):
        assert rec["ok"], rec.get("error")
        assert rec["command"].startswith("gleaner bench micro")
        r = rec["result"]
        assert r["checksum_ok"] is True
        assert r["accesses"] == 2 * (64 << 20) // 4096
        assert r["ns_per_op"] > 0 and r["init_pass_s"] > 0
        assert r["pin_cpu"] == 0
        for k in ("count", "p50_us", "p99_us", "p999_us", "mean_us"):
            assert k in r["remote_fault_app_visible"], k
    assert g["result"]["system"] == "gleaner" and g["result"]["local_bytes"] == 32 << 20
    r = lx["result"]
    assert r["system"] == "plain" and r["baseline_rss_bytes"] > 0
    assert set(r["fault_counts"]) == {"major", "minor"}
    assert "gleaner-harness-" in r["cgroup"], r["cgroup"]   # it ran inside the harness's cgroup
    # Half of the region does not fit: Linux had to swap to zram and fault pages back.
    assert r["fault_counts"]["major"] > 0
    assert r["remote_fault_app_visible"]["count"] > 0
    sw = lx["swap"]
    assert sw["cgroup_limit_bytes"] == ls["cgroup_limit_bytes"]
    assert sw["cgroup"]["oom_kills"] == 0
    assert sw["zram"]["peak_sampled"]["mem_used_total"] > 0
    assert sw["zram"]["after"]["mem_used_max"] > 0
    assert sw["swap_ins"] > 0

    text = doc.read_text()
    assert text.index(vs_swap.BEGIN) < text.index("<!-- harness:begin -->")
    assert "| seq | fault mean: gleaner / Linux |" in text
    assert "| seq | speed: Linux ns/op / gleaner ns/op |" in text
