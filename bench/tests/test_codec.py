"""bench/codec.py: the verdicts, the aggregation and the rendering come from the numbers (small
synthetic results); the cells run in rotated order; the pieces of vs_swap and the harness it
reuses keep their old behaviour where it passes nothing new."""
import copy
import json
import os

import pytest

from bench import codec, vs_swap
from bench.harness import systems

MiB = 1 << 20


def _gleaner_stats(peak, pages, resident, encoded, blob, codec_on=True, blobs_at_peak=None,
                   blob_bytes_at_peak=None):
    c = {"compression": "lz4" if codec_on else "off", "encryption": "aes-256-gcm" if codec_on else "off",
         "pages_encoded": encoded, "blob_bytes": blob, "pages_decoded": 10, "blob_bytes_decoded": 10 * 2048}
    store = {"data_path": "shm", "pages_stored": pages, "resident_bytes": resident,
             "peak_resident_bytes": peak, "blob_bytes": resident - 1000, "codec": c}
    if blobs_at_peak is not None:
        store.update(blobs_at_peak=blobs_at_peak, blob_bytes_at_peak=blob_bytes_at_peak)
    total = {"process_count": 1, "faults": {"remote": 5}, "store": {**store, "codec": dict(c)}}
    return {"total": total, "processes": [{"pid": 1, "stats": {"store": store}}]}


def _zram(peak, orig, compr, algo="lzo-rle"):
    at = {"mem_used_total": peak, "orig_data_size": orig, "compr_data_size": compr, "mem_used_max": peak,
          "same_pages": 7}
    return {"swap": {"zram": {"device": "/dev/zram1", "comp_algorithm": algo, "after": {"mem_used_max": peak},
                              "peak_sampled": {"mem_used_total": peak, "orig_data_size": orig, "compr_data_size": compr},
                              "at_peak_sampled": at, "samples": 40},
                     "vmstat_delta": {"pswpin": 1, "pswpout": 2}},
            "cgroup_limit_bytes": 64 * MiB}


def _job(kind, system, rep, wall=1.0, checksum="abc123", **extra):
    return {"kind": kind, "system": system, "rep": rep, "ok": True, "run_ok": True, "run_error": None,
            "wall_s": wall, "job_s": wall - 0.1, "checksum": checksum,
            "command": f"{system} {kind} command", **extra}


def _micro(path, codec_label, rep, p50, p99, encoded=1000, decoded=1000, blob=None, blob_dec=None,
           times=(2000, 500, 4000, 300), checksum=77, copy_ns=None):
    on = codec_label == "codec-on"
    blob = blob if blob is not None else encoded * (2048 if on else 4097)
    blob_dec = blob_dec if blob_dec is not None else decoded * (2048 if on else 4097)
    d, o, c, s = times
    cd = {"compression": "lz4" if on else "off", "encryption": "aes-256-gcm" if on else "off",
          "pages_encoded": encoded, "pages_compressed": encoded, "blob_bytes": blob,
          "pages_decoded": decoded, "blob_bytes_decoded": blob_dec,
          "decompress_ns_total": d * decoded, "compress_ns_total": c * encoded,
          "blobs_opened": decoded if on else 0, "open_ns_total": o * decoded if on else 0,
          "blobs_sealed": encoded if on else 0, "seal_ns_total": s * encoded if on else 0}
    if copy_ns is not None:
        cd["blob_copy_ns_total"] = copy_ns * decoded if on else 0
    result = {"system": "gleaner", "pattern": "random", "checksum": checksum, "checksum_ok": True,
              "ns_per_op": 5000.0,
              "remote_fault_app_visible": {"count": decoded, "p50_us": p50, "p99_us": p99, "mean_us": p50,
                                           "p999_us": p99 * 2},
              "region": {"store": {"data_path": codec.EXPECTED_STORE_PATH[path], "codec": cd}}}
    return {"kind": "micro", "system": codec_label, "pattern": "random", "rep": rep, "ok": True,
            "data_path": path, "result": result,
            "command": f"gleaner bench micro --pattern random {path} {codec_label}"}


def _harness_cell(workload, rep, g_peak, z_max, ok=True):
    g = {"system": "gleaner", "ratio": 50, "ok": True, "budget_bytes": 100 * MiB,
         "command": f"gleaner run --local-mem 100M -- {workload}",
         "gleaner": {"far_memory_peak_bytes": g_peak, "far_pages_stored": 40000,
                     "far_memory_bytes_at_exit": 40000 * 1024, "codec_blob_bytes": 50000 * 1024,
                     "codec_pages_encoded": 50000, "far_blobs_at_peak": 45000,
                     "far_blob_bytes_at_peak": 45000 * 1000}}
    lx = {"system": "linux-swap", "ratio": 50, "ok": ok, "budget_bytes": 100 * MiB,
          "command": f"{workload}", "error": None if ok else "OOM-killed by the kernel in the memory cgroup",
          "zram": {"comp_algorithm": "lzo-rle"},
          "swap": {"zram": {"orig_data_size": 4096, "mem_used_total": 12288, "mem_used_max": z_max},
                   "zram_at_peak_sampled": {"mem_used_total": z_max, "orig_data_size": 50000 * 4096,
                                            "compr_data_size": z_max - 4096}}}
    local = {"system": "all-local", "ratio": None, "ok": True}
    h = {"complete": True, "workloads": {workload: {"runs": [local, g, lx, dict(local)]}}}
    rec = {"kind": "harness", "workload": workload, "rep": rep, "ok": ok,
           "command": f"python3 -m bench.harness run --size full --workloads {workload}", "harness": h}
    if not ok:
        rec["error"] = "linux-swap: OOM-killed by the kernel in the memory cgroup"
    return rec


def synthetic():
    """Two reps. (a) demo: gleaner 20 MiB / zram 25 MiB = 0.8, met; Java 120 / 100 = 1.2, not
    met; memcached 90 / 100 = 0.9, met; redis: a failed harness cell, FAILED. (b) shm p50 10 / 9
    = 1.11, met; tcp 30 / 20 = 1.5, not met. (c) reduction 2.0 / compression 2.0 = 1.0, met.
    Demo wall time: codec on 2.0 s / off 1.6 s = 1.25."""
    res = {"schema": 1, "date": "2026-01-01T00:00:00+00:00", "command": "python3 bench/codec.py",
           "git_commit": "deadbeef", "complete": True,
           "machine": {"cpus": 2, "cpu_model": "test CPU", "mem_gib": 8, "kernel": "6.8",
                       "virtualization": "kvm", "loadavg_at_start": 0.5},
           "params": {"quick": False, "reps": 2, "pin_cpu": 0,
                      "micro": {"pattern": "random", "size": "256M", "local_pct": 50},
                      "demo": {"n": 50000, "local_mem": "64M", "cgroup": "64M"},
                      "java": {"n": 300000, "local_mem": "128M", "cgroup": "160M"},
                      "harness": {"size": "full"}},
           "linux_swap": {"cgroup": "v1", "swappiness": "60", "page_cluster": "3"},
           "java_build": {"command": "javac -d JAVA_CLASSES bench/java/FarHeap.java",
                          "java_version": "openjdk version \"17\"\nmore"},
           "demo": {s: [] for s in codec.DEMO_SYSTEMS},
           "java": {s: [] for s in codec.JAVA_SYSTEMS},
           "micro": {"shm": {"codec-on": [], "codec-off": []}, "tcp": {"codec-on": [], "codec-off": []}},
           "harness": {"memcached": [], "redis": []},
           "demo_reference_checksum": "abc123", "java_reference_checksum": "j1"}
    for rep in range(2):
        d = res["demo"]
        d["all-local"].append(_job("demo", "all-local", rep, 0.3))
        d["gleaner"].append(_job("demo", "gleaner", rep, 2.0, stats=_gleaner_stats(
            20 * MiB, 5000, 1250 * 1024, 10000, 10000 * 1024, blobs_at_peak=8000,
            blob_bytes_at_peak=8000 * 2000)))
        d["gleaner-codec-off"].append(_job("demo", "gleaner-codec-off", rep, 1.6, stats=_gleaner_stats(
            80 * MiB, 5000, 5000 * 4097, 10000, 10000 * 4097, codec_on=False)))
        d["linux-swap"].append(_job("demo", "linux-swap", rep, 3.0, **_zram(25 * MiB, 100 * MiB, 24 * MiB)))
        j = res["java"]
        j["all-local"].append(_job("java", "all-local", rep, 2.0, checksum="j1"))
        j["gleaner"].append(_job("java", "gleaner", rep, 4.0, checksum="j1", stats=_gleaner_stats(
            120 * MiB, 30000, 120 * MiB, 40000, 40000 * 4100)))
        j["linux-swap"].append(_job("java", "linux-swap", rep, 5.0, checksum="j1",
                                    **{**_zram(100 * MiB, 100 * MiB, 99 * MiB), "cgroup_limit_bytes": 160 * MiB}))
        m = res["micro"]
        m["shm"]["codec-on"].append(_micro("shm", "codec-on", rep, 10.0, 30.0))
        m["shm"]["codec-off"].append(_micro("shm", "codec-off", rep, 9.0, 25.0))
        m["tcp"]["codec-on"].append(_micro("tcp", "codec-on", rep, 30.0, 100.0))
        m["tcp"]["codec-off"].append(_micro("tcp", "codec-off", rep, 20.0, 50.0))
        res["harness"]["memcached"].append(_harness_cell("memcached", rep, 90 * MiB, 100 * MiB))
        res["harness"]["redis"].append(_harness_cell("redis", rep, 90 * MiB, 100 * MiB, ok=(rep == 0)))
    return res


def _by(vs):
    return {(v["scope"], v["target"]): v for v in vs}


def test_verdicts_come_from_the_numbers():
    v = _by(codec.verdicts(synthetic()))
    assert set(v) == {("demo", "memory"), ("java", "memory"), ("memcached", "memory"), ("redis", "memory"),
                      ("shm", "fault_p50"), ("tcp", "fault_p50"), ("tcp", "wire")}
    assert v[("demo", "memory")]["ratio"] == pytest.approx(0.8)
    assert v[("demo", "memory")]["verdict"] == "met"
    assert v[("demo", "memory")]["per_rep"] == [pytest.approx(0.8)] * 2
    assert v[("java", "memory")]["ratio"] == pytest.approx(1.2)
    assert v[("java", "memory")]["verdict"] == "not met"
    assert v[("memcached", "memory")]["ratio"] == pytest.approx(0.9)
    assert v[("memcached", "memory")]["verdict"] == "met"
    assert v[("redis", "memory")]["verdict"] == "FAILED"
    assert "OOM" in v[("redis", "memory")]["errors"][0]
    assert v[("shm", "fault_p50")]["ratio"] == pytest.approx(10 / 9)
    assert v[("shm", "fault_p50")]["verdict"] == "met"
    assert v[("tcp", "fault_p50")]["ratio"] == pytest.approx(1.5)
    assert v[("tcp", "fault_p50")]["verdict"] == "not met"
    assert v[("tcp", "fault_p50")]["p99_ratio"] == pytest.approx(2.0)
    assert v[("tcp", "wire")]["reduction"] == pytest.approx(2.0)
    assert v[("tcp", "wire")]["compression_ratio"] == pytest.approx(2.0)
    assert v[("tcp", "wire")]["verdict"] == "met"

    # Move the numbers across the bounds: the verdicts follow.
    res = synthetic()
    for r in res["java"]["gleaner"]:
        r["stats"]["total"]["store"]["peak_resident_bytes"] = 110 * MiB   # exactly 1.1: met
    for r in res["micro"]["tcp"]["codec-off"]:
        r["result"]["remote_fault_app_visible"]["p50_us"] = 25.0          # 30 / 25 = 1.2: met
    for r in res["micro"]["tcp"]["codec-on"]:
        r["result"]["region"]["store"]["codec"]["blob_bytes_decoded"] = 1000 * 4096   # reads uncompressed
    for r in res["demo"]["linux-swap"]:
        r["swap"]["zram"]["peak_sampled"]["mem_used_total"] = 16 * MiB    # 20 / 16 = 1.25
    v = _by(codec.verdicts(res))
    assert v[("java", "memory")]["verdict"] == "met"
    assert v[("tcp", "fault_p50")]["verdict"] == "met"
    assert v[("demo", "memory")]["verdict"] == "not met"
    # 2000 pages carried in 1000 x 2048 + 1000 x 4096 bytes: 1.33x against a 2x compression ratio.
    assert v[("tcp", "wire")]["reduction"] == pytest.approx(2000 * 4096 / (1000 * 2048 + 1000 * 4096))
    assert v[("tcp", "wire")]["ratio"] == pytest.approx(2 / 3)
    assert v[("tcp", "wire")]["verdict"] == "not met"


def test_medians_and_per_rep_ratios():
    res = synthetic()
    res["demo"]["gleaner"][1]["stats"]["total"]["store"]["peak_resident_bytes"] = 30 * MiB
    v = _by(codec.memory_verdicts(res))[("demo", "memory")]
    assert v["gleaner"] == pytest.approx(25 * MiB)           # median of 20 and 30 MiB
    assert v["ratio"] == pytest.approx(1.0)
    assert v["per_rep"] == [pytest.approx(0.8), pytest.approx(1.2)]
    # The far-set columns: gleaner at its peak (blobs_at_peak), zram at its peak sample.
    assert v["gleaner_pages"] == 8000 and v["gleaner_pages_source"] == ["at the peak (blobs_at_peak)"]
    assert v["gleaner_bytes_per_page"] == pytest.approx(25 * MiB / 8000)   # the median peak
    assert v["gleaner_blob_per_page"] == pytest.approx(2000)
    assert v["gleaner_compression"] == pytest.approx(4.0)
    assert v["zram_pages"] == 100 * MiB // 4096 and v["zram_same_pages"] == 7
    assert v["zram_bytes_per_page"] == pytest.approx(25 * MiB / (100 * MiB // 4096))
    assert v["zram_blob_per_page"] == pytest.approx(24 * MiB / (100 * MiB // 4096))
    assert v["zram_compression"] == pytest.approx(100 / 24)
    assert v["zram_algorithm"] == "lzo-rle"
    m = _by(codec.memory_verdicts(res))[("memcached", "memory")]
    assert m["zram_source"].startswith("mem_used_max")
    assert m["zram_pages"] == 50000 and m["gleaner_pages"] == 45000
    assert m["gleaner_bytes_per_page"] == pytest.approx(90 * MiB / 45000)
    assert m["gleaner_blob_per_page"] == pytest.approx(1000)
    assert m["gleaner_compression"] == pytest.approx(4.0)
    # Stats from before blobs_at_peak: the pages and bytes at exit, and the table says so.
    j = _by(codec.memory_verdicts(res))[("java", "memory")]
    assert j["gleaner_pages"] == 30000 and j["gleaner_pages_source"][0].startswith("at exit")
    assert j["gleaner_bytes_per_page"] == pytest.approx(120 * MiB / 30000)
    assert j["gleaner_blob_per_page"] is None
    text = codec.render_text(res)
    assert ("| Java (`FarHeap 300000`) | 30000 (at exit) | - / 4194 | 1.00× | 25600 (7) | 4055 / 4096 | "
            "1.01× (lzo-rle) |") in text
    assert "(at exit): stats without `blobs_at_peak`" in text


def test_the_former_java_pairing_is_information_and_linux_local_memory_is_shown():
    res = synthetic()
    res["params"]["java"].update(local_mem="160M", former_local_mem="128M")
    assert codec.java_former_pairing(res) is None     # not run: no row
    for rep in range(2):
        res["java"]["gleaner-128m"].append(_job("java", "gleaner-128m", rep, 4.5, checksum="j1",
                                                stats=_gleaner_stats(130 * MiB, 32000, 130 * MiB, 40000,
                                                                     40000 * 4100, blobs_at_peak=32000,
                                                                     blob_bytes_at_peak=32000 * 4000)))
        at = res["java"]["linux-swap"][rep]["swap"]["zram"]["at_peak_sampled"]
        at.update(cgroup_anon_bytes=150 * MiB, cgroup_file_bytes=2 * MiB)
    fp = codec.java_former_pairing(res)
    assert fp["ratio"] == pytest.approx(1.3) and fp["per_rep"] == [pytest.approx(1.3)] * 2
    assert fp["gleaner_pages"] == 32000 and fp["zram_pages"] == 25600
    j = _by(codec.memory_verdicts(res))[("java", "memory")]
    assert j["ratio"] == pytest.approx(1.2) and j["verdict"] == "not met"   # the target row is unmoved
    assert j["zram_local_anon"] == 150 * MiB and j["zram_local_file"] == 2 * MiB
    text = codec.render_text(res)
    assert ("| Java, gleaner at its former budget (information) | 128M / 160M cgroup | 130.0 | 100.0 | "
            "1.30 (1.30, 1.30) | - | information | 32000 / 25600 |") in text
    assert "| Java (`FarHeap 300000`) | 160M / 160M cgroup | 120.0 | 100.0 |" in text
    assert "1.01× (lzo-rle) | 150.0 / 2.0 |" in text and "1.04× (lzo-rle) | - / - |" not in text
    assert "Its command: `gleaner-128m java command`." in text
    # The information row counts in no verdict.
    assert "**4 of 7 targets met**" in text


def test_codec_times_and_wire_from_totals():
    r = _micro("tcp", "codec-on", 0, 10, 20, encoded=500, decoded=2000, times=(1500, 400, 3000, 200))
    t = codec.codec_times(r)
    assert t == {"decompress_us": pytest.approx(1.5), "open_us": pytest.approx(0.4),
                 "compress_us": pytest.approx(3.0), "seal_us": pytest.approx(0.2),
                 "raw_for_speed_share": 0.0, "copy_us": None}   # results from before it was timed
    r2 = _micro("tcp", "codec-on", 0, 10, 20, encoded=500, decoded=2000, times=(1500, 400, 3000, 200),
                copy_ns=800)
    assert codec.codec_times(r2)["copy_us"] == pytest.approx(0.8)
    # Since one blob in 8 is timed, the open and copy totals are over `blobs_open_timed`.
    r2["result"]["region"]["store"]["codec"]["blobs_open_timed"] = 250
    t2 = codec.codec_times(r2)
    assert t2["open_us"] == pytest.approx(3.2) and t2["copy_us"] == pytest.approx(6.4)
    # Pages stored raw for decode speed, as a share of the pages written (a count read a page
    # ahead of `pages_encoded` while eviction ran is capped).
    r["result"]["region"]["store"]["codec"]["raw_for_speed"] = 125
    assert codec.codec_times(r)["raw_for_speed_share"] == pytest.approx(0.25)
    r["result"]["region"]["store"]["codec"]["raw_for_speed"] = 502
    assert codec.codec_times(r)["raw_for_speed_share"] == pytest.approx(1.0)
    w = codec.wire(r)
    assert w["pages"] == 2500 and w["page_bytes"] == 2500 * 4096
    assert w["wire_bytes"] == 2500 * 2048
    assert w["reduction"] == pytest.approx(2.0) and w["compression_ratio"] == pytest.approx(2.0)
    off = codec.wire(_micro("tcp", "codec-off", 0, 10, 20))
    assert off["bytes_per_page"] == pytest.approx(4097)
    v = codec.wire_verdicts(synthetic())[0]
    assert v["reduction_vs_off"] == pytest.approx(4097 / 2048)
    # An undefined time (nothing sealed with the codec off) stays undefined, not zero.
    assert codec.codec_times(_micro("shm", "codec-off", 0, 1, 2))["seal_us"] is None
    f = _by(codec.fault_verdicts(synthetic()))[("shm", "fault_p50")]
    assert f["times"]["decompress_us"] == pytest.approx(2.0) and f["times"]["seal_us"] == pytest.approx(0.3)
    d = codec.demo_wall(synthetic())
    assert d["ratio"] == pytest.approx(1.25) and d["per_rep"] == [pytest.approx(1.25)] * 2


def test_failed_runs_checksums_and_undefined_ratios():
    res = synthetic()
    # A Java run whose checksum differs from all-local fails, and so does the target.
    res["java"]["gleaner"][0]["checksum"] = "bad"
    vs_swap.check_demo_checksums(res, key="java")
    bad = res["java"]["gleaner"][0]
    assert not bad["ok"] and "CHECKSUM MISMATCH" in bad["error"]
    assert res["java_reference_checksum"] == "j1"
    assert _by(codec.memory_verdicts(res))[("java", "memory")]["verdict"] == "FAILED"
    assert any(f.startswith("java gleaner rep 1: CHECKSUM MISMATCH") for f in codec.failed_cells(res))
    # The demo's extra system (codec off) is checked too.
    res["demo"]["gleaner-codec-off"][1]["checksum"] = "0000"
    vs_swap.check_demo_checksums(res, key="demo")
    assert not res["demo"]["gleaner-codec-off"][1]["ok"]
    assert codec.demo_wall(res)["failed_runs"] == 1

    # Micro runs whose checksums disagree all fail.
    res = synthetic()
    res["micro"]["shm"]["codec-off"][0]["result"]["checksum"] = 78
    codec.check_micro_checksums(res)
    assert res["micro_reference_checksum"] is None
    assert all(not r["ok"] for by in res["micro"].values() for rs in by.values() for r in rs)
    assert {v["verdict"] for v in codec.fault_verdicts(res)} == {"FAILED"}
    res = synthetic()
    codec.check_micro_checksums(res)
    assert res["micro_reference_checksum"] == 77

    # zram never used (nothing swapped): the ratio is undefined, not a pass.
    res = synthetic()
    for r in res["demo"]["linux-swap"]:
        r["swap"]["zram"]["peak_sampled"]["mem_used_total"] = 0
    assert _by(codec.memory_verdicts(res))[("demo", "memory")]["verdict"] == "n/a"
    # A failed micro run fails its data path's target, and the wire target for tcp.
    res = synthetic()
    res["micro"]["tcp"]["codec-off"][1].update(ok=False, error="exit status 86")
    v = _by(codec.verdicts(res))
    assert v[("tcp", "fault_p50")]["verdict"] == "FAILED" and v[("tcp", "wire")]["verdict"] == "FAILED"
    assert v[("shm", "fault_p50")]["verdict"] == "met"
    text = codec.render_text(res)
    assert "exit status 86" in text and "**FAILED**" in text


def test_an_oom_killed_harness_cell_runs_once_more(monkeypatch, tmp_path):
    outcomes = [{"ok": False, "oom_only": True, "error": "linux-swap: OOM-killed", "rep": 0},
                {"ok": True, "rep": 0}]
    calls = []

    def cell(ctx, w, rep, tmp):
        calls.append(w)
        return dict(outcomes.pop(0))
    monkeypatch.setattr(codec, "harness_cell", cell)
    rec = codec.harness_cell_retried({}, "redis", 0, str(tmp_path))
    assert calls == ["redis", "redis"] and rec["ok"] and rec["first_try"]["error"] == "linux-swap: OOM-killed"
    assert codec.retried_cells({"harness": {"redis": [rec]}}) == ["harness redis rep 1: linux-swap: OOM-killed"]
    # Any other failure (or a second OOM kill) is not run again.
    outcomes[:] = [{"ok": False, "oom_only": False, "error": "gleaner: exit status 86", "rep": 0}]
    calls.clear()
    rec = codec.harness_cell_retried({}, "redis", 0, str(tmp_path))
    assert calls == ["redis"] and not rec["ok"] and "first_try" not in rec
    outcomes[:] = [{"ok": False, "oom_only": True, "error": "e1", "rep": 0},
                   {"ok": False, "oom_only": True, "error": "e2", "rep": 0}]
    rec = codec.harness_cell_retried({}, "redis", 0, str(tmp_path))
    assert not rec["ok"] and rec["error"] == "e2" and rec["first_try"]["error"] == "e1"
    res = synthetic()
    res["harness"]["redis"][1]["first_try"] = {"error": "linux-swap: OOM-killed"}
    text = codec.render_text(res)
    assert "Run again (1; the stopped tries are in the results file)" in text
    assert "* harness redis rep 2: linux-swap: OOM-killed" in text


def test_an_oom_killed_linux_job_runs_again_at_most_four_times(monkeypatch, tmp_path):
    oom = "exit status -9; OOM-killed in the memory cgroup (1 kill(s))"
    outcomes = [{"ok": False, "error": oom, "rep": 0}, {"ok": True, "rep": 0}]
    calls = []

    def cell(ctx, kind, system, rep, tmp):
        calls.append((kind, system))
        return dict(outcomes.pop(0))
    monkeypatch.setattr(codec, "job_cell", cell)
    rec = codec.job_cell_retried({}, "java", "linux-swap", 0, str(tmp_path))
    assert calls == [("java", "linux-swap")] * 2 and rec["ok"] and rec["oom_tries"] == [oom]
    assert codec.retried_cells({"java": {"linux-swap": [rec]}}) == [f"java linux-swap rep 1: {oom}"]
    # Five kills: four more tries, then the failure stands.
    outcomes[:] = [{"ok": False, "error": oom, "rep": 0}] * 5
    calls.clear()
    rec = codec.job_cell_retried({}, "java", "linux-swap", 0, str(tmp_path))
    assert len(calls) == 5 and not rec["ok"] and len(rec["oom_tries"]) == 4
    # gleaner's failures, and Linux failures of other kinds, are never run again.
    for system, err in (("gleaner", oom), ("linux-swap", "checksum mismatch")):
        outcomes[:] = [{"ok": False, "error": err, "rep": 0}]
        calls.clear()
        rec = codec.job_cell_retried({}, "demo", system, 0, str(tmp_path))
        assert len(calls) == 1 and "oom_tries" not in rec


def test_a_failed_job_says_why(monkeypatch, tmp_path):
    def cell(ctx, system, rep, tmp, **kw):
        # The same limit on both sides; the former pairing's cell (information) at 128M.
        want = "128M" if kw["label"] == "gleaner-128m" else "160M"
        assert kw["kind"] == "java" and kw["local_mem"] == want and kw["cgroup_limit"] == 160 * MiB
        assert system == "gleaner"
        assert kw["job"] == ["java", "-Xshare:off", "-cp", "/tmp/cls", "FarHeap"]   # gleaner's
        return {"kind": "java", "system": kw["label"], "rep": rep, "ok": False, "run_ok": False,
                "run_error": "exit status 86", "error": "exit status 86",
                "command": "gleaner run -- java -cp /tmp/cls FarHeap",
                "stderr_tail": ("gleaner: FATAL: vmsplice took 1 of 2 bytes\ngleaner: stopping\n"
                               "gleaner run: java exited with status 86: see the FATAL message above\n")}
    monkeypatch.setattr(codec, "demo_cell", cell)
    ctx = {"java_job": ["java", "-cp", "/tmp/cls", "FarHeap"],
           "java_job_gleaner": ["java", "-Xshare:off", "-cp", "/tmp/cls", "FarHeap"],
           "java_classes": "/tmp/cls"}
    rec = codec.job_cell(ctx, "java", "gleaner", 0, str(tmp_path))
    assert rec["error"] == "exit status 86; gleaner: FATAL: vmsplice took 1 of 2 bytes"
    assert rec["run_error"] == rec["error"] and not rec["ok"]
    assert rec["command"] == "gleaner run -- java -cp JAVA_CLASSES FarHeap"
    rec = codec.job_cell(ctx, "java", "gleaner-128m", 0, str(tmp_path))
    assert rec["system"] == "gleaner-128m" and rec["error"].startswith("exit status 86; gleaner: FATAL")
    # A Java that could not be built fails its cells, saying so.
    rec = codec.job_cell({"java_error": "Java not built: javac failed"}, "java", "linux-swap", 1, str(tmp_path))
    assert not rec["ok"] and rec["error"] == "Java not built: javac failed" and rec["system"] == "linux-swap"


def test_harness_summary():
    cell = _harness_cell("memcached", 0, 90 * MiB, 100 * MiB)
    local, g, lx, errors = codec.summarise_harness(cell["harness"], "memcached")
    assert len(local) == 2 and g["system"] == "gleaner" and lx["system"] == "linux-swap" and not errors
    h = copy.deepcopy(cell["harness"])
    del h["workloads"]["memcached"]["runs"][1]["gleaner"]["far_memory_peak_bytes"]
    h["workloads"]["memcached"]["runs"][0]["ok"] = False
    h["complete"] = False
    _, _, _, errors = codec.summarise_harness(h, "memcached")
    assert any("far-memory peak" in e for e in errors)
    assert any(e.startswith("all-local") for e in errors)
    assert any("incomplete" in e for e in errors)
    assert codec.summarise_harness(None, "redis")[3] == ["the harness results have no redis workload"]


def test_render_text_and_section(tmp_path):
    res = synthetic()
    text = codec.render_text(res)
    assert text.startswith(codec.BEGIN) and text.endswith(codec.END)
    assert "**4 of 7 targets met**; not met: java memory, tcp fault_p50; **FAILED** (a run failed): redis memory." in text
    assert ("| demo job (`scripts/demo_job.py 50000`) | 64M / 64M cgroup | 20.0 | 25.0 | 0.80 (0.80, 0.80) "
            "| ≤ 1.1 | **MET** | 8000 / 25600 | 2621 / 1024 |") in text
    assert ("| Java (`FarHeap 300000`) | 128M / 160M cgroup | 120.0 | 100.0 | 1.20 (1.20, 1.20) | ≤ 1.1 | "
            "**NOT MET** | 30000 (at exit) / 25600 | 4194 / 4096 |") in text
    assert "| memcached (harness) | 100M / 100M cgroup (50% of the footprint) | 90.0 | 100.0 | 0.90 (0.90, 0.90) |" in text
    assert "| TCP (--memnode embedded-tcp) | 30.0 | 20.0 | 1.50 (1.50, 1.50) | ≤ 1.2 | **NOT MET** | 100.0 | 50.0 | 2.00 |" in text
    assert "| shared memory (embedded memnode) | 2.00 | 0.50 | - | 4.00 | 0.30 | 2.00× |" in text
    assert "| shared memory (embedded memnode), codec off | 2.00 | - | - | 4.00 | - | - | - |" in text
    assert "| wire reduction / compression ratio | 2.00× | 2.00× | 1.000 (1.000, 1.000) | ≥ 0.95 | **MET** |" in text
    assert "| codec on | 2000 | 7.8 | 3.9 | 2048 | 2.00× |" in text
    assert "12 bytes per entry" in text
    assert "| 2.00 (2.00–2.00) | 1.60 (1.60–1.60) | 1.25 (1.25, 1.25) | `abc123` (all match all-local) |" in text
    assert "* demo: `gleaner demo command`" in text
    assert "* demo: `linux-swap demo command` in a 64 MiB cgroup with zram swap" in text
    assert "* java: `linux-swap java command` in a 160 MiB cgroup with zram swap" in text
    assert ("* java: `JAVA_CLASSES` built with `javac -d JAVA_CLASSES bench/java/FarHeap.java` at bench "
            "time (openjdk version \"17\")") in text
    assert "* tcp, codec-off: `gleaner bench micro --pattern random tcp codec-off`" in text
    assert "Failed runs: **1**:" in text and "* harness redis rep 2:" in text
    assert "smoke run" not in text

    quick = copy.deepcopy(res)
    quick["params"]["quick"] = True
    quick["complete"] = False
    quick["interrupted"] = "signal SIGINT"
    t = codec.render_text(quick)
    assert "smoke run" in t and "**Incomplete run** (signal SIGINT)" in t

    # No markers yet: the section goes at the end of the document (after the harness's section).
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\n<!-- harness:begin -->\nh\n<!-- harness:end -->\n\n## Last\n\ntext\n")
    out = tmp_path / "codec.json"
    out.write_text(json.dumps(res))
    assert codec.main(["--render-only", "--out", str(out), "--doc", str(doc)]) == 0
    d = doc.read_text()
    assert d.index("## Last") < d.index(codec.BEGIN) and d.rstrip().endswith(codec.END)
    # Re-rendering replaces the section in place.
    res2 = copy.deepcopy(res)
    for r in res2["java"]["gleaner"]:
        r["stats"]["total"]["store"]["peak_resident_bytes"] = 50 * MiB
    out.write_text(json.dumps(res2))
    codec.main(["--render-only", "--out", str(out), "--doc", str(doc)])
    d2 = doc.read_text()
    assert d2.count(codec.BEGIN) == 1 and d2.count(codec.END) == 1
    assert "| Java (`FarHeap 300000`) | 128M / 160M cgroup | 50.0 | 100.0 | 0.50 (0.50, 0.50) | ≤ 1.1 | **MET** |" in d2
    assert d2.startswith("# Benchmarks\n\n<!-- harness:begin -->\nh\n<!-- harness:end -->\n\n## Last\n\ntext\n")


def test_rotated_order():
    blks = codec.blocks(skip_harness=False)
    cells = [c for b in blks for c in b]
    assert len(cells) == len(codec.DEMO_SYSTEMS) + len(codec.JAVA_SYSTEMS) + 2 + 2 + 2
    orders = [codec.cell_order(blks, r) for r in range(len(blks))]
    assert all(sorted(o, key=str) == sorted(cells, key=str) for o in orders)
    assert len({o[0] for o in orders}) == len(blks)   # every block goes first once
    for path in codec.DATA_PATHS:
        firsts = {[c for c in o if c[0] == "micro" and c[1] == path][0][2] for o in orders[:2]}
        assert firsts == {"codec-on", "codec-off"}, path
    demo_first = {[c for c in codec.cell_order(blks, r) if c[0] == "demo"][0][2]
                  for r in range(len(codec.DEMO_SYSTEMS))}
    assert demo_first == set(codec.DEMO_SYSTEMS)
    assert codec.harness_systems(0) == ["gleaner", "linux-swap"]
    assert codec.harness_systems(1) == ["linux-swap", "gleaner"]
    assert not any(c[0] == "harness" for b in codec.blocks(skip_harness=True) for c in b)


def test_needs_root(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit) as e:
        codec.main(["--quick", "--out", str(tmp_path / "x.json"), "--no-render"])
    assert "needs root" in str(e.value)
    assert not (tmp_path / "x.json").exists()


def test_reused_pieces_keep_their_behaviour(tmp_path):
    # vs_swap's commands are unchanged when nothing new is passed.
    assert vs_swap.micro_cmd("gleaner", "random", "64M")[1:] == [
        "bench", "micro", "--pattern", "random", "--size", "64M", "--local", "50%", "--json", "--pin-cpu", "0"]
    assert vs_swap.micro_cmd("gleaner", "random", "64M", ["--compress", "off"])[-2:] == ["--compress", "off"]
    d = vs_swap.demo_cmd("gleaner", "S.json")
    assert d[1:6] == ["run", "--local-mem", "64M", "--stats", "S.json"] and d[6] == "--"
    assert d[7:10] == ["taskset", "-c", "0"] and d[-1] == "50000"
    d = vs_swap.demo_cmd("gleaner", "S.json", codec.CODEC_OFF, job=["java", "X"], local_mem="128M")
    assert d[1:] == ["run", "--local-mem", "128M", "--stats", "S.json", "--compress", "off", "--encrypt", "off",
                     "--", "java", "X"]
    assert vs_swap.demo_cmd("linux-swap", job=["java", "X"]) == ["java", "X"]
    j = codec.java_job("/usr/bin/java", "/tmp/c")
    assert j[:4] == ["taskset", "-c", "0", "/usr/bin/java"] and j[-4:] == ["-cp", "/tmp/c", "FarHeap", "300000"]
    assert "-XX:+UseSerialGC" in j and "-Xshare:off" not in j
    # The same JVM flags under gleaner since it serves class-data sharing.
    assert codec.java_job("/usr/bin/java", "/tmp/c", gleaner=True) == j

    # The harness keeps gleaner's far-memory numbers.
    stats = tmp_path / "s.json"
    stats.write_text(json.dumps(_gleaner_stats(20 * MiB, 5000, 10 * MiB, 10000, 4 * MiB)))
    st = systems.read_gleaner_stats(str(stats))
    assert st["far_memory_peak_bytes"] == 20 * MiB and st["far_pages_stored"] == 5000
    assert st["far_blobs_at_peak"] is None   # stats from before it
    assert st["far_memory_bytes_at_exit"] == 10 * MiB
    assert st["codec_blob_bytes"] == 4 * MiB and st["codec_pages_encoded"] == 10000
    stats.write_text(json.dumps({"total": {"faults": {"remote": 1}}}))   # stats from before the codec
    st = systems.read_gleaner_stats(str(stats))
    assert st["remote_faults"] == 1 and st["far_memory_peak_bytes"] is None


def test_far_copies_compares_the_demo_under_each_policy():
    def run(rep, peak, wall):
        return {"rep": rep, "ok": True, "wall_s": wall,
                "stats": {"total": {"store": {"peak_resident_bytes": peak}}}}
    res = {"demo": {"gleaner": [run(0, 10 << 20, 2.0)], "gleaner-drop-demand": [run(0, 12 << 20, 1.8)],
                    "gleaner-keep-copies": [run(0, 20 << 20, 1.6)]}}
    fc = codec.far_copies(res)
    assert fc["present"]
    assert [(r["policy"], r["peak"], r["wall"]) for r in fc["rows"]] == [
        ("all (default)", 10 << 20, 2.0), ("demand", 12 << 20, 1.8), ("none", 20 << 20, 1.6)]
    assert not codec.far_copies({"demo": {"gleaner": [run(0, 1, 1.0)]}})["present"]
