#!/usr/bin/env python3
"""The page codec measured against its targets (issue 12): each comparison in one run, the
repetitions interleaved in rotated order, both sides pinned alike, reported as ratios.

    sudo python3 bench/codec.py                 # 2 interleaved reps, then render
    sudo python3 bench/codec.py --quick         # a smoke run: micro 64M, harness --size quick, 1 rep
    sudo python3 bench/codec.py --skip-harness  # without memcached and redis
    python3 bench/codec.py --render-only        # re-render bench/results/DETAILS.md from the JSON

The targets, and the cells each repetition runs once:

(a) far memory: the host memory gleaner spends on far pages (its stats' `total.store.
    peak_resident_bytes`, shared-memory data path) against zram's mem_used_total for the same
    workload at the same limit, ratio <= 1.1. Beside it, the pages each system held far at its
    peak (gleaner: `store.blobs_at_peak`; zram: orig_data_size / 4096 in the sample where
    mem_used_total peaked) and the bytes per far page; and Linux's local anonymous memory at
    that moment (the cgroup's rss), which shows how much of the same limit each system spent on
    the program's pages.
    * demo job (scripts/demo_job.py 50000, taskset -c 0): all-local; `gleaner run --local-mem 64M`;
      a 64 MiB memory cgroup with zram swap (bench/vs_swap.py's cells; zram's peak mem_used_total
      sampled every 50 ms during the run);
    * Java (bench/java/FarHeap.java, compiled with javac into a temporary directory; 300k x 1 KiB
      arrays of java.util.Random bytes in a HashMap, two System.gc(), a checksum pass; taskset -c 0,
      `java -Xms512m -Xmx512m -XX:+UseSerialGC -XX:-UsePerfData`, the same flags everywhere since
      gleaner serves class-data sharing's archive mapping, 2026-11-26; before, `-Xshare:off` under
      gleaner only): all-local; `gleaner run --local-mem 160M`; a 160 MiB memory cgroup with zram
      swap (sampled the same way); and, as information, `gleaner run --local-mem 128M`, the
      pairing used until 2026-11-26 (it assumed the JVM's non-heap memory lay outside gleaner's
      budget: it does not, the preload serves every private anonymous mapping, and the cgroup's
      charge at zram's peak is all anonymous memory, which the run records);
    * memcached and redis at 50% local as the harness runs them (`python3 -m bench.harness run
      --size full --workloads W --systems gleaner,linux-swap --ratios 50 ...`, the two systems'
      order swapped every rep): gleaner's far-memory peak from its stats, zram's mem_used_max
      from the mm_stat the harness records after the run.
(b) fault path: remote-fault p50 with the codec on (the default) <= 1.2 x with it off
    (`--compress off --encrypt off`): `gleaner bench micro --pattern random --size 256M --local 50%
    --json --pin-cpu 0`, with and without those flags, over shared memory (the default embedded
    memnode) and over TCP (`--memnode embedded-tcp`); p99 and the codec's per-page times beside.
(c) wire: the bytes to a TCP memnode shrink by the measured compression ratio: from the TCP micro
    runs, wire payload = codec blob_bytes + blob_bytes_decoded against (pages_encoded +
    pages_decoded) x 4096 (the page batches' 12 bytes of framing per entry, request ids and frame
    headers not counted), codec on and off; the reduction must reach 95% of the compression ratio.
    The demo job's wall time with the codec on against off is shown as information.

Writes bench/results/codec.json (every run's command, raw JSON or stats, counters; the machine,
the git commit, the date) and the codec section of bench/results/DETAILS.md (at the end of the
document the first time). Needs root (zram, cgroups). Progress goes to stderr. Exit status: 0,
1 if any cell failed (a checksum mismatch included), 130 if interrupted; the zram devices and
cgroups it made are removed in every case (after a SIGKILL: `python3 -m bench.harness cleanup`).
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from bench import vs_swap  # noqa: E402
from bench.doc_section import DOC, write_section  # noqa: E402
from bench.harness import swapenv  # noqa: E402
from bench.harness.common import (GLEANER, Child, fmt_cmd, git_commit, machine, now_iso,  # noqa: E402
                                  parse_size, python_exe)
from bench.vs_swap import (Interrupted, _fmt, _med, _meets, _on_signal, _span, _tail,  # noqa: E402
                           _write, check_demo_checksums, demo_cell, micro_cell)

BEGIN, END = "<!-- codec:begin -->", "<!-- codec:end -->"
RESULTS = os.path.join(ROOT, "bench", "results")
DEFAULT_OUT = os.path.join(RESULTS, "codec.json")
SCHEMA = 1
PAGE = 4096
PIN_CPU = vs_swap.PIN_CPU
LOCAL_PCT = vs_swap.LOCAL_PCT

MICRO_PATTERN = "random"
MICRO_SIZE, MICRO_SIZE_QUICK = "256M", "64M"
CODEC_OFF = ["--compress", "off", "--encrypt", "off"]
DATA_PATHS = {"shm": [], "tcp": ["--memnode", "embedded-tcp"]}
PATH_LABEL = {"shm": "shared memory (embedded memnode)", "tcp": "TCP (--memnode embedded-tcp)"}
EXPECTED_STORE_PATH = {"shm": "shm", "tcp": "socket"}

DEMO_LOCAL = vs_swap.DEMO_LOCAL
DEMO_SYSTEMS = ["all-local", "gleaner", "gleaner-codec-off", "gleaner-keep-copies", "gleaner-drop-demand",
                "linux-swap"]
# The same run keeping resident pages' far copies (the old default), to show what dropping them
# saves in far memory and costs in time.
KEEP_COPIES = ["--drop-far-copies", "none"]
DROP_DEMAND = ["--drop-far-copies", "demand"]

JAVA_SRC = os.path.join(ROOT, "bench", "java", "FarHeap.java")
JAVA_N = 300000
JAVA_LOCAL = "160M"
JAVA_CGROUP = "160M"
# The pairing before 2026-11-26 (gleaner's budget 32 MiB under the cgroup's limit), run beside the
# same-limit one as information (system "gleaner-128m"): gleaner's budget covers every private
# anonymous mapping the JVM makes, heap or not, as the cgroup's limit does.
JAVA_LOCAL_FORMER = "128M"
JAVA_OPTS = ["-Xms512m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:-UsePerfData"]
# Under gleaner only (none since 2026-11-26, when gleaner began to give way to class-data
# sharing's archive mapping; before, `-Xshare:off`, which the older results files record).
JAVA_GLEANER_OPTS = []
JAVA_CLASSES = "JAVA_CLASSES"   # how the temporary class directory appears in recorded commands
JAVA_SYSTEMS = ["all-local", "gleaner", "gleaner-128m", "linux-swap"]

HARNESS_WORKLOADS = ["memcached", "redis"]
HARNESS_RATIO = 50

# The targets: (key, what, op, bound).
MEMORY_TARGET = ("memory", "far memory at peak: gleaner / zram mem_used_total", "<=", 1.1)
FAULT_TARGET = ("fault_p50", "remote-fault p50: codec on / codec off", "<=", 1.2)
WIRE_TARGET = ("wire", "wire reduction / compression ratio", ">=", 0.95)
NO_TARGET = "no target"
MEMORY_SCOPES = ["demo", "java"] + HARNESS_WORKLOADS


def log(msg):
    print(f"[codec] {msg}", file=sys.stderr, flush=True)


# ---- the order of the cells ------------------------------------------------------------------


def blocks(skip_harness):
    """The cells of one repetition, in blocks: the demo job's four runs, Java's three, the micro
    pairs (codec on / off) per data path, and one harness run per workload (both systems)."""
    out = [[("demo", None, s) for s in DEMO_SYSTEMS],
           [("java", None, s) for s in JAVA_SYSTEMS]]
    out += [[("micro", p, c) for c in ("codec-on", "codec-off")] for p in DATA_PATHS]
    if not skip_harness:
        out += [[("harness", w, None)] for w in HARNESS_WORKLOADS]
    return out


def cell_order(blks, rep):
    """Rep `rep`'s order: the list of blocks starts one block further on each rep, and each
    block's runs rotate by one (a pair swaps), so no run always goes first or always follows the
    same neighbour."""
    k = rep % len(blks)
    out = []
    for b in blks[k:] + blks[:k]:
        j = rep % len(b)
        out += b[j:] + b[:j]
    return out


def harness_systems(rep):
    """The harness runs its systems in the order given: gleaner first on even reps, Linux on odd."""
    return ["gleaner", "linux-swap"] if rep % 2 == 0 else ["linux-swap", "gleaner"]


# ---- the cells -------------------------------------------------------------------------------


def _load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _fail(rec, msg):
    """Fails a demo/java record (its run, so that the checksum check keeps it failed)."""
    rec["run_ok"] = rec["ok"] = False
    rec["run_error"] = rec["error"] = "; ".join(x for x in (rec.get("run_error"), msg) if x)


def _check_stats(rec, stats, codec_on=True):
    """A gleaner run's stats must be there and say what was measured (the data path, the codec)."""
    if stats is None:
        return "no stats file (gleaner run --stats) to read the far-memory numbers from"
    store = (stats.get("total") or {}).get("store")
    if not store:
        return "the stats have no total.store object"
    codec = [((p.get("stats") or {}).get("store") or {}).get("codec") or {} for p in stats.get("processes", [])]
    # The default compression was `lz4` until `auto` (LZ4 unless the link is slow) replaced it.
    wants = ({("lz4", "aes-256-gcm")}, {("auto", "aes-256-gcm")}) if codec_on else ({("off", "off")},)
    seen = {(c.get("compression"), c.get("encryption")) for c in codec if c}
    if seen and seen not in wants:
        return f"the codec was {sorted(seen)}, expected one of {wants}"
    return None


# Tries a demo or Java cell under Linux swap gets after its first when the cgroup-v1 OOM killer
# stops it (which it does now and then under heavy swap traffic: both Java cells of a run on
# 2026-11-26, each on its first try; one Java cell three times running later that day, at about
# one kill in two tries), as bench/corun.py does.
JOB_OOM_RETRIES = 4


def job_cell_retried(ctx, kind, system, rep, tmp):
    """`job_cell`; a Linux run the OOM killer stopped runs again (up to `JOB_OOM_RETRIES` times),
    the stopped tries' errors kept in `oom_tries`."""
    rec = job_cell(ctx, kind, system, rep, tmp)
    tries = []
    while (system == "linux-swap" and not rec.get("ok") and "OOM-killed" in (rec.get("error") or "")
           and len(tries) < JOB_OOM_RETRIES):
        tries.append(rec.get("error"))
        log(f"  {kind} {system} rep {rep + 1}: OOM-killed in its cgroup: running the cell again "
            f"({len(tries)} of {JOB_OOM_RETRIES})")
        rec = job_cell(ctx, kind, system, rep, tempfile.mkdtemp(dir=tmp))
    if tries:
        rec["oom_tries"] = tries
    return rec


def job_cell(ctx, kind, system, rep, tmp):
    """A demo or Java run (vs_swap's demo cell); a gleaner run keeps its whole stats file."""
    label = system
    kw = {"kind": kind, "label": label}
    if system == "gleaner-codec-off":
        system, kw["extra_args"] = "gleaner", CODEC_OFF
    elif system == "gleaner-keep-copies":
        system, kw["extra_args"] = "gleaner", KEEP_COPIES
    elif system == "gleaner-drop-demand":
        system, kw["extra_args"] = "gleaner", DROP_DEMAND
    java_local = JAVA_LOCAL
    if system == "gleaner-128m":
        system, java_local = "gleaner", JAVA_LOCAL_FORMER
    if kind == "java":
        if ctx.get("java_error"):
            return {"kind": kind, "system": label, "rep": rep, "ok": False, "run_ok": False,
                    "error": ctx["java_error"], "run_error": ctx["java_error"]}
        job = ctx["java_job_gleaner"] if system == "gleaner" else ctx["java_job"]
        kw.update(job=job, local_mem=java_local, cgroup_limit=parse_size(JAVA_CGROUP))
    rec = demo_cell(ctx, system, rep, tmp, **kw)
    if kind == "java":
        rec["command"] = rec["command"].replace(ctx["java_classes"], JAVA_CLASSES)
    fatal = [ln.strip() for ln in (rec.get("stderr_tail") or "").splitlines() if ln.startswith("gleaner: FATAL")]
    if not rec.get("run_ok") and fatal:
        _fail(rec, fatal[-1])   # gleaner's own word on why far memory failed
    if system == "gleaner":
        stats = _load(os.path.join(tmp, vs_swap.STATS_NAME))
        rec["stats"] = stats
        codec_on = label in ("gleaner", "gleaner-keep-copies", "gleaner-drop-demand", "gleaner-128m")
        err = _check_stats(rec, stats, codec_on=codec_on) if rec.get("run_ok") else None
        if err:
            _fail(rec, err)
    return rec


def micro_run(ctx, path, codec, rep, tmp):
    extra = DATA_PATHS[path] + (CODEC_OFF if codec == "codec-off" else [])
    rec = micro_cell(ctx, "gleaner", MICRO_PATTERN, rep, tmp, extra_args=extra, label=codec)
    rec["data_path"] = path
    r = rec.get("result") or {}
    if rec.get("ok"):
        store = (r.get("region") or {}).get("store") or {}
        c = store.get("codec") or {}
        want = ("lz4", "aes-256-gcm") if codec == "codec-on" else ("off", "off")
        if codec == "codec-on" and c.get("compression") == "auto":
            want = ("auto", "aes-256-gcm")   # the default since `auto` replaced `lz4`
        errors = []
        if store.get("data_path") != EXPECTED_STORE_PATH[path]:
            errors.append(f"data path {store.get('data_path')!r}, expected {EXPECTED_STORE_PATH[path]!r}")
        if (c.get("compression"), c.get("encryption")) != want:
            errors.append(f"codec {(c.get('compression'), c.get('encryption'))}, expected {want}")
        if not c.get("pages_decoded"):
            errors.append("no page was decoded: no remote fault to measure")
        if errors:
            rec["ok"] = False
            rec["error"] = "; ".join(errors)
    return rec


def check_micro_checksums(res):
    """Every micro run checks every word in-process (checksum_ok); beyond that, all of them run
    the same pattern over the same data, so their checksums must agree."""
    runs = [r for by in (res.get("micro") or {}).values() for rs in by.values() for r in rs
            if r.get("result") and r["result"].get("checksum_ok")]
    sums = {r["result"].get("checksum") for r in runs}
    res["micro_reference_checksum"] = next(iter(sums)) if len(sums) == 1 else None
    if len(sums) > 1:
        for r in runs:
            if r.get("ok"):
                r["ok"] = False
                r["error"] = f"CHECKSUM MISMATCH between micro runs: {sorted(sums)}"
                log(f"!!! micro {r['data_path']} {r['system']} rep {r['rep'] + 1}: {r['error']}")


def harness_cmd(workload, size, systems, out):
    return [python_exe(), "-m", "bench.harness", "run", "--size", size, "--workloads", workload,
            "--systems", ",".join(systems), "--ratios", str(HARNESS_RATIO), "--out", out,
            "--no-render", "--no-progress"]


def _stop_harness(child):
    """Interrupted: the harness cleans up on SIGTERM; give it the time, then kill its group and
    undo whatever its state file still records."""
    child.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + 60
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    child.signal_group(signal.SIGKILL)
    try:
        child.wait()
    except Exception:   # noqa: BLE001 - best effort on the way out
        pass
    return _undo_harness_state(child.pid)


def _undo_harness_state(pid):
    path = os.path.join(swapenv.STATE_DIR, f"state-{pid}.json")
    if not os.path.exists(path):
        return []
    errors = swapenv.teardown(swapenv.State(pid))
    log(f"undid what the harness (pid {pid}) left" + (f"; errors: {errors}" if errors else ""))
    return errors


def summarise_harness(hres, workload):
    """The harness's runs of one workload: (all-local runs, gleaner run, linux-swap run, errors)."""
    w = ((hres or {}).get("workloads") or {}).get(workload)
    if not w:
        return [], None, None, [f"the harness results have no {workload} workload"]
    runs = w.get("runs", [])
    local = [r for r in runs if r.get("system") == "all-local"]
    g = next((r for r in runs if r.get("system") == "gleaner" and r.get("ratio") == HARNESS_RATIO), None)
    lx = next((r for r in runs if r.get("system") == "linux-swap" and r.get("ratio") == HARNESS_RATIO), None)
    errors = []
    if w.get("error"):
        errors.append(w["error"])
    if not local or not all(r.get("ok") for r in local):
        errors.append("all-local: " + "; ".join(str(r.get("error")) for r in local if not r.get("ok"))
                      if local else "no all-local run")
    for name, r in (("gleaner", g), ("linux-swap", lx)):
        if r is None:
            errors.append(f"no {name} run at {HARNESS_RATIO}%")
        elif not r.get("ok"):
            errors.append(f"{name}: {str(r.get('error'))[:400]}")
    if g is not None and g.get("ok") and not (g.get("gleaner") or {}).get("far_memory_peak_bytes"):
        errors.append("gleaner: its stats carry no far-memory peak (total.store.peak_resident_bytes)")
    if hres is not None and not hres.get("complete"):
        errors.append("the harness run is incomplete: " + str(hres.get("interrupted", "stopped early")))
    return local, g, lx, errors


def harness_cell(ctx, workload, rep, tmp):
    systems = harness_systems(rep)
    out = os.path.join(tmp, f"harness-{workload}.json")
    cmd = harness_cmd(workload, ctx["harness_size"], systems, out)
    shown = ["python3"] + cmd[1:]
    rec = {"kind": "harness", "workload": workload, "system": "gleaner+linux-swap", "rep": rep,
           "systems_order": systems, "command": fmt_cmd([c if c != out else "OUT.json" for c in shown]),
           "started": now_iso()}
    out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
    env = {"PYTHONPATH": ROOT + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
           "GLEANER_HARNESS_ARGS": ""}   # the defaults, whatever the caller's environment says
    t0 = time.monotonic()
    with open(out_path, "w") as so, open(err_path, "w") as se:
        child = Child(cmd, env=env, stdout=so, stderr=se, stdin=subprocess.DEVNULL,
                      timeout=ctx["harness_timeout"], name="harness")
        ctx["harness_child"] = child
        try:
            rc = child.wait()
        except Interrupted:
            ctx["cleanup_errors"] += _stop_harness(child)
            raise
        finally:
            ctx["harness_child"] = None
    wall = time.monotonic() - t0
    ctx["cleanup_errors"] += _undo_harness_state(child.pid)
    hres = _load(out)
    rec.update({"rc": rc, "wall_s": round(wall, 3), "harness": hres})
    _, g, lx, errors = summarise_harness(hres, workload)
    if child.timed_out:
        errors.insert(0, f"timed out after {ctx['harness_timeout']} s")
    if rc != 0:
        errors.insert(0, f"the harness exited with status {rc}")
    if hres is None:
        errors.insert(0, "no harness results file")
    rec["ok"] = not errors
    # Only the Linux run failed, OOM-killed in its cgroup (twice: the harness runs such a cell
    # once more itself): the cgroup-v1 OOM killer fires now and then under heavy swap traffic.
    rec["oom_only"] = bool(errors) and all(e.startswith("linux-swap: OOM-killed") for e in errors)
    if errors:
        rec["error"] = "; ".join(errors)
        rec["stderr_tail"] = _tail(err_path, 3000)
    return rec


def harness_cell_retried(ctx, workload, rep, tmp_root):
    """A harness cell; one whose only failure is the Linux run OOM-killed in its cgroup runs once
    more, the first try kept on record (`first_try`) and reported."""
    rec = harness_cell(ctx, workload, rep, tempfile.mkdtemp(dir=tmp_root))
    if not rec.get("ok") and rec.get("oom_only"):
        log(f"  !!! harness {workload} rep {rep + 1}: the Linux run was OOM-killed in its cgroup "
            f"(twice, in the harness): running the whole cell once more; the first try stays on record")
        first = rec
        rec = harness_cell(ctx, workload, rep, tempfile.mkdtemp(dir=tmp_root))
        rec["first_try"] = first
    return rec


def compile_java(tmp_root):
    """javac FarHeap.java into a temporary directory. Returns (classes dir, record, error)."""
    classes = os.path.join(tmp_root, "java-classes")
    os.makedirs(classes, exist_ok=True)
    javac, java = shutil.which("javac"), shutil.which("java")
    rec = {"source": os.path.relpath(JAVA_SRC, ROOT), "javac": javac, "java": java,
           "command": f"javac -d {JAVA_CLASSES} {os.path.relpath(JAVA_SRC, ROOT)}"}
    if not javac or not java:
        return classes, rec, "java or javac not found (apt-get install default-jdk-headless)"
    for tool, key in ((javac, "javac_version"), (java, "java_version")):
        p = subprocess.run([tool, "-version"], capture_output=True, text=True)
        rec[key] = (p.stdout + p.stderr).strip()
    p = subprocess.run([javac, "-d", classes, JAVA_SRC], capture_output=True, text=True)
    if p.returncode != 0:
        return classes, rec, f"javac failed ({p.returncode}): {p.stderr.strip()[-800:]}"
    return classes, rec, None


def java_job(java, classes, n=JAVA_N, gleaner=False):
    opts = (JAVA_GLEANER_OPTS if gleaner else []) + JAVA_OPTS
    return ["taskset", "-c", str(PIN_CPU), java] + opts + ["-cp", classes, "FarHeap", str(n)]


# ---- the numbers, from the records (pure) ----------------------------------------------------


def _ok(runs):
    return [r for r in runs if r.get("ok")]


def _div(a, b):
    return a / b if a is not None and b else None


def _store(stats):
    return ((stats or {}).get("total") or {}).get("store") or {}


def gleaner_far(rec):
    """A gleaner run's far-memory numbers: from its stats file (demo, Java) or the harness's
    read_gleaner_stats (memcached, redis). Pages at the peak: `blobs_at_peak` (far pages with a
    blob; same-filled pages take none); stats without it fall back to `pages_stored` and
    `resident_bytes` when the stats were written (at exit), and say so in `pages_source`."""
    if rec.get("kind") == "harness-run":
        g = rec.get("gleaner") or {}
        peak, blobs, blob_peak = g.get("far_memory_peak_bytes"), g.get("far_blobs_at_peak"), g.get("far_blob_bytes_at_peak")
        pages, at_exit = g.get("far_pages_stored"), g.get("far_memory_bytes_at_exit")
        blob, enc = g.get("codec_blob_bytes"), g.get("codec_pages_encoded")
    else:
        s = _store(rec.get("stats"))
        c = s.get("codec") or {}
        peak, blobs, blob_peak = s.get("peak_resident_bytes"), s.get("blobs_at_peak"), s.get("blob_bytes_at_peak")
        pages, at_exit = s.get("pages_stored"), s.get("resident_bytes")
        blob, enc = c.get("blob_bytes"), c.get("pages_encoded")
    if blobs is not None:
        far = {"pages": blobs, "bytes_per_page": _div(peak, blobs), "blob_per_page": _div(blob_peak, blobs),
               "pages_source": "at the peak (blobs_at_peak)"}
    else:
        far = {"pages": pages, "bytes_per_page": _div(at_exit, pages), "blob_per_page": None,
               "pages_source": "at exit (pages_stored; resident_bytes / pages_stored)"}
    return {"peak_bytes": peak, **far,
            "compression_ratio": _div(enc * PAGE if enc is not None else None, blob)}


def zram_far(rec):
    """A Linux run's zram numbers. The peak: mem_used_total sampled during the run (demo, Java)
    or mem_used_max from mm_stat after it (the harness's record); pages (orig_data_size / 4096,
    same-filled ones included) and bytes per page from the sample where mem_used_total peaked."""
    sw = rec.get("swap") or {}
    if rec.get("kind") == "harness-run":
        z = sw.get("zram") or {}
        peak, source = z.get("mem_used_max"), "mem_used_max (mm_stat after the run)"
        at = sw.get("zram_at_peak_sampled") or {}
        algo = (rec.get("zram") or {}).get("comp_algorithm")
    else:
        z = sw.get("zram") or {}
        peak, source = (z.get("peak_sampled") or {}).get("mem_used_total"), "mem_used_total sampled every 50 ms"
        at = z.get("at_peak_sampled") or {}
        algo = z.get("comp_algorithm")
    pages = at.get("orig_data_size") // PAGE if at.get("orig_data_size") else None
    return {"peak_bytes": peak, "peak_source": source, "pages": pages, "same_pages": at.get("same_pages"),
            "bytes_per_page": _div(at.get("mem_used_total"), pages),
            "blob_per_page": _div(at.get("compr_data_size"), pages),
            "compression_ratio": _div(at.get("orig_data_size"), at.get("compr_data_size")),
            # The cgroup's local charge at that moment (runs from 2026-11-26 on).
            "local_anon_bytes": at.get("cgroup_anon_bytes"), "local_file_bytes": at.get("cgroup_file_bytes"),
            "algorithm": algo}


def memory_pairs(res, scope):
    """(gleaner records, Linux records, failed records) of one workload of target (a); harness
    runs are flattened into records of kind harness-run with the rep of their harness cell."""
    if scope in ("demo", "java"):
        by = res.get(scope) or {}
        g, lx = by.get("gleaner", []), by.get("linux-swap", [])
        failed = [r for r in g + lx + by.get("all-local", []) if not r.get("ok")]
        return _ok(g), _ok(lx), failed, bool(g or lx)
    cells = ((res.get("harness") or {}).get(scope)) or []
    g, lx, failed = [], [], [c for c in cells if not c.get("ok")]
    for c in cells:
        if not c.get("ok"):
            continue
        _, rg, rl, _ = summarise_harness(c.get("harness"), scope)
        g.append({**rg, "kind": "harness-run", "rep": c["rep"]})
        lx.append({**rl, "kind": "harness-run", "rep": c["rep"]})
    return g, lx, failed, bool(cells)


def far_pair(g, lx):
    """Far-memory numbers of gleaner runs `g` against Linux runs `lx`, by rep: (gleaner_far per
    rep, zram_far per rep, gleaner's median peak, zram's median peak, their ratio, the ratio of
    each rep both have)."""
    gf = {r["rep"]: gleaner_far(r) for r in g}
    zf = {r["rep"]: zram_far(r) for r in lx}
    gv = _med([x["peak_bytes"] for x in gf.values()])
    zv = _med([x["peak_bytes"] for x in zf.values()])
    per_rep = [_div(gf[k]["peak_bytes"], zf[k]["peak_bytes"]) for k in sorted(gf) if k in zf]
    return gf, zf, gv, zv, _div(gv, zv), [x for x in per_rep if x is not None]


def memory_verdicts(res):
    out = []
    key, what, op, bound = MEMORY_TARGET
    for scope in MEMORY_SCOPES:
        g, lx, failed, present = memory_pairs(res, scope)
        if not present:
            continue
        gf, zf, gv, zv, ratio, per_rep = far_pair(g, lx)
        if failed or not g or not lx:
            verdict = "FAILED"
        elif ratio is None:
            verdict = "n/a"
        else:
            verdict = "met" if _meets(op, ratio, bound) else "not met"
        out.append({
            "scope": scope, "target": key, "what": what, "op": op, "bound": bound,
            "gleaner": gv, "linux": zv, "ratio": ratio, "per_rep": per_rep, "verdict": verdict,
            "failed_runs": len(failed), "errors": [str(r.get("error")) for r in failed],
            "gleaner_pages": _med([x["pages"] for x in gf.values()]),
            "gleaner_pages_source": sorted({x["pages_source"] for x in gf.values()}),
            "gleaner_bytes_per_page": _med([x["bytes_per_page"] for x in gf.values()]),
            "gleaner_blob_per_page": _med([x["blob_per_page"] for x in gf.values()]),
            "gleaner_compression": _med([x["compression_ratio"] for x in gf.values()]),
            "zram_pages": _med([x["pages"] for x in zf.values()]),
            "zram_same_pages": _med([x["same_pages"] for x in zf.values()]),
            "zram_bytes_per_page": _med([x["bytes_per_page"] for x in zf.values()]),
            "zram_blob_per_page": _med([x["blob_per_page"] for x in zf.values()]),
            "zram_compression": _med([x["compression_ratio"] for x in zf.values()]),
            "zram_local_anon": _med([x["local_anon_bytes"] for x in zf.values() if x["local_anon_bytes"] is not None]),
            "zram_local_file": _med([x["local_file_bytes"] for x in zf.values() if x["local_file_bytes"] is not None]),
            "zram_source": next((x["peak_source"] for x in zf.values()), None),
            "zram_algorithm": next((x["algorithm"] for x in zf.values() if x["algorithm"]), None),
        })
    return out


def java_former_pairing(res):
    """Java with gleaner at the budget used before 2026-11-26 (128M) against the same run's Linux
    cells at 160M: information beside target (a), not a verdict. None when not run."""
    by = res.get("java") or {}
    g, lx = _ok(by.get("gleaner-128m", [])), _ok(by.get("linux-swap", []))
    if not g or not lx:
        return None
    gf, zf, gv, zv, ratio, per_rep = far_pair(g, lx)
    return {"gleaner": gv, "linux": zv, "ratio": ratio, "per_rep": per_rep,
            "gleaner_pages": _med([x["pages"] for x in gf.values()]),
            "gleaner_bytes_per_page": _med([x["bytes_per_page"] for x in gf.values()]),
            "zram_pages": _med([x["pages"] for x in zf.values()]),
            "zram_bytes_per_page": _med([x["bytes_per_page"] for x in zf.values()]),
            "command": _first_command(g)}


def _lat(rec, key):
    return ((rec.get("result") or {}).get("remote_fault_app_visible") or {}).get(key)


def _codec(rec):
    return (((rec.get("result") or {}).get("region") or {}).get("store") or {}).get("codec") or {}


def codec_times(rec):
    """Per-page codec times (µs) of a micro run, computed from its totals."""
    c = _codec(rec)

    def us(ns, n):
        v = _div(c.get(ns), c.get(n))
        return v / 1000 if v is not None else None
    # Since 078a9ac one blob opened in 8 is timed (`blobs_open_timed`); before, every one.
    opened = "blobs_open_timed" if "blobs_open_timed" in c else "blobs_opened"
    return {"decompress_us": us("decompress_ns_total", "pages_decoded"),
            "open_us": us("open_ns_total", opened),
            # Copying a blob out before opening it in place; inside open_ns_total before
            # 2026-11-26 (None for those runs).
            "copy_us": us("blob_copy_ns_total", opened) if "blob_copy_ns_total" in c else None,
            "compress_us": us("compress_ns_total", "pages_compressed"),
            "seal_us": us("seal_ns_total", "blobs_sealed"),
            # Pages stored raw because their chunk decodes over the budget (older runs: none).
            "raw_for_speed_share": _div(min(c.get("raw_for_speed", 0), c.get("pages_encoded") or 0),
                                        c.get("pages_encoded"))}


def wire(rec):
    """Payload bytes to and from the memnode against the pages they carry (a micro run)."""
    c = _codec(rec)
    enc, dec = c.get("pages_encoded"), c.get("pages_decoded")
    wb = (c.get("blob_bytes") or 0) + (c.get("blob_bytes_decoded") or 0)
    pages = (enc or 0) + (dec or 0)
    return {"pages": pages, "page_bytes": pages * PAGE, "wire_bytes": wb,
            "reduction": _div(pages * PAGE, wb), "bytes_per_page": _div(wb, pages),
            "compression_ratio": _div(enc * PAGE if enc is not None else None, c.get("blob_bytes"))}


def fault_verdicts(res):
    out = []
    key, what, op, bound = FAULT_TARGET
    for path, by in (res.get("micro") or {}).items():
        on_all, off_all = by.get("codec-on", []), by.get("codec-off", [])
        failed = [r for r in on_all + off_all if not r.get("ok")]
        on, off = _ok(on_all), _ok(off_all)
        g = _med([_lat(r, "p50_us") for r in on])
        b = _med([_lat(r, "p50_us") for r in off])
        ratio = _div(g, b)
        per_rep = []
        for r in on:
            o = [x for x in off if x["rep"] == r["rep"]]
            if o:
                per_rep.append(_div(_lat(r, "p50_us"), _lat(o[0], "p50_us")))
        per_rep = [x for x in per_rep if x is not None]
        p99_on, p99_off = _med([_lat(r, "p99_us") for r in on]), _med([_lat(r, "p99_us") for r in off])
        verdict = ("FAILED" if failed or not on or not off else "n/a" if ratio is None
                   else "met" if _meets(op, ratio, bound) else "not met")
        times = [codec_times(r) for r in on]
        out.append({
            "scope": path, "target": key, "what": what, "op": op, "bound": bound,
            "gleaner": g, "linux": b, "codec_on": g, "codec_off": b, "ratio": ratio,
            "per_rep": per_rep, "verdict": verdict, "failed_runs": len(failed),
            "errors": [str(r.get("error")) for r in failed],
            "p99_on": p99_on, "p99_off": p99_off, "p99_ratio": _div(p99_on, p99_off),
            "faults_on": _med([_lat(r, "count") for r in on]),
            "faults_off": _med([_lat(r, "count") for r in off]),
            "times": {k: _med([t[k] for t in times])
                      for k in ("decompress_us", "open_us", "copy_us", "compress_us", "seal_us",
                                "raw_for_speed_share")},
            "off_times": {k: _med([codec_times(r)[k] for r in off]) for k in ("decompress_us", "compress_us")},
            "compression_ratio": _med([wire(r)["compression_ratio"] for r in on]),
        })
    return out


def wire_verdicts(res):
    by = (res.get("micro") or {}).get("tcp")
    if by is None:
        return []
    key, what, op, bound = WIRE_TARGET
    on_all, off_all = by.get("codec-on", []), by.get("codec-off", [])
    failed = [r for r in on_all + off_all if not r.get("ok")]
    on, off = [wire(r) for r in _ok(on_all)], [wire(r) for r in _ok(off_all)]
    reduction = _med([w["reduction"] for w in on])
    comp = _med([w["compression_ratio"] for w in on])
    ratio = _div(reduction, comp)
    per_rep = [_div(w["reduction"], w["compression_ratio"]) for w in on]
    per_rep = [x for x in per_rep if x is not None]
    verdict = ("FAILED" if failed or not on or not off else "n/a" if ratio is None
               else "met" if _meets(op, ratio, bound) else "not met")
    bpp_on, bpp_off = _med([w["bytes_per_page"] for w in on]), _med([w["bytes_per_page"] for w in off])
    return [{
        "scope": "tcp", "target": key, "what": what, "op": op, "bound": bound,
        "gleaner": reduction, "linux": comp, "reduction": reduction, "compression_ratio": comp,
        "ratio": ratio, "per_rep": per_rep if len(per_rep) > 1 else [], "verdict": verdict,
        "failed_runs": len(failed), "errors": [str(r.get("error")) for r in failed],
        "on": {k: _med([w[k] for w in on]) for k in ("pages", "page_bytes", "wire_bytes", "reduction", "bytes_per_page")},
        "off": {k: _med([w[k] for w in off]) for k in ("pages", "page_bytes", "wire_bytes", "reduction", "bytes_per_page")},
        "reduction_vs_off": _div(bpp_off, bpp_on),
    }]


def demo_wall(res):
    """The demo job's wall time, codec on against off (information)."""
    demo = res.get("demo") or {}
    on_all, off_all = demo.get("gleaner", []), demo.get("gleaner-codec-off", [])
    failed = [r for r in on_all + off_all if not r.get("ok")]
    on = _med([r["wall_s"] for r in _ok(on_all)])
    off = _med([r["wall_s"] for r in _ok(off_all)])
    per_rep = []
    for r in _ok(on_all):
        o = [x for x in _ok(off_all) if x["rep"] == r["rep"]]
        if o:
            per_rep.append(_div(r["wall_s"], o[0]["wall_s"]))
    return {"on": on, "off": off, "ratio": _div(on, off), "per_rep": [x for x in per_rep if x is not None],
            "failed_runs": len(failed), "present": bool(on_all or off_all)}


def far_copies(res):
    """The demo job under each far-copy policy: peak far memory and wall time (information).
    gleaner's default drops demand-fetched pages' copies; `all` drops every fetched page's,
    `none` keeps them all."""
    demo = res.get("demo") or {}
    out = {"present": bool(demo.get("gleaner-keep-copies") or demo.get("gleaner-drop-all")), "rows": []}
    for label, system in (("all (default)", "gleaner"), ("demand", "gleaner-drop-demand"),
                          ("none", "gleaner-keep-copies")):
        runs = demo.get(system, [])
        if not runs:
            continue
        peaks = [((r.get("stats") or {}).get("total") or {}).get("store", {}).get("peak_resident_bytes")
                 for r in _ok(runs)]
        out["rows"].append({"policy": label, "system": system,
                            "peak": _med([x for x in peaks if x]),
                            "wall": _med([r["wall_s"] for r in _ok(runs)]),
                            "failed_runs": len([r for r in runs if not r.get("ok")])})
    return out


def verdicts(res):
    return memory_verdicts(res) + fault_verdicts(res) + wire_verdicts(res)


def retried_cells(res):
    out = [f"harness {w} rep {c['rep'] + 1}: {c['first_try'].get('error')}"
           for w, cells in (res.get("harness") or {}).items() for c in cells if c.get("first_try")]
    for kind in ("demo", "java"):
        for system, runs in (res.get(kind) or {}).items():
            out += [f"{kind} {system} rep {r['rep'] + 1}: {e}"
                    for r in runs for e in r.get("oom_tries", [])]
    return out


def failed_cells(res):
    out = []
    for kind in ("demo", "java"):
        for system, runs in (res.get(kind) or {}).items():
            out += [f"{kind} {system} rep {r['rep'] + 1}: {r.get('error')}" for r in runs if not r.get("ok")]
    for path, by in (res.get("micro") or {}).items():
        for codec, runs in by.items():
            out += [f"micro {path} {codec} rep {r['rep'] + 1}: {r.get('error')}" for r in runs if not r.get("ok")]
    for w, cells in (res.get("harness") or {}).items():
        out += [f"harness {w} rep {c['rep'] + 1}: {c.get('error')}" for c in cells if not c.get("ok")]
    return out


# ---- the run ---------------------------------------------------------------------------------


def _summary_line(rec):
    if not rec.get("ok"):
        return f"FAILED: {rec.get('error')}"
    if rec["kind"] in ("demo", "java"):
        s = f"wall {rec['wall_s']:.2f} s, checksum {rec.get('checksum')}"
        if rec.get("stats"):
            st = _store(rec["stats"])
            s += (f"; far memory peak {(st.get('peak_resident_bytes') or 0) / (1 << 20):.1f} MiB, "
                  f"{st.get('pages_stored')} pages far at exit")
        if rec.get("swap"):
            z = rec["swap"]["zram"]
            s += (f"; zram peak {z['peak_sampled']['mem_used_total'] / (1 << 20):.1f} MiB for "
                  f"{z['peak_sampled']['orig_data_size'] / (1 << 20):.1f} MiB of pages")
        return s
    if rec["kind"] == "micro":
        a = rec["result"]["remote_fault_app_visible"]
        w = wire(rec)
        return (f"remote faults n={a['count']} p50 {a['p50_us']:.1f} p99 {a['p99_us']:.1f} us, "
                f"{w['bytes_per_page']:.0f} B/page moved, checksum ok")
    _, g, lx, _ = summarise_harness(rec.get("harness"), rec["workload"])
    gf = gleaner_far({**g, "kind": "harness-run"})
    zf = zram_far({**lx, "kind": "harness-run"})
    return (f"gleaner far memory peak {(gf['peak_bytes'] or 0) / (1 << 20):.1f} MiB, zram mem_used_max "
            f"{(zf['peak_bytes'] or 0) / (1 << 20):.1f} MiB")


def _end_children(ctx):
    child = ctx.get("harness_child")
    if child is not None and child.poll() is None:
        ctx["cleanup_errors"] += _stop_harness(child)
    vs_swap._end_live_children()


def run_all(args):
    if os.geteuid() != 0:
        sys.exit("codec.py: needs root: it creates zram swap devices and memory cgroups for the "
                 "Linux-swap runs (run it with sudo; --render-only re-renders without root)")
    reason = swapenv.unavailable_reason()
    if reason:
        sys.exit(f"codec.py: the Linux-swap baseline is unavailable here: {reason}")
    if not os.access(GLEANER, os.X_OK):
        sys.exit(f"codec.py: {GLEANER} is missing: cargo build --release -p gleaner-cli -p gleaner-preload first")
    from bench.harness.runner import _become_subreaper, _leftovers
    _become_subreaper()

    reps = args.reps or (1 if args.quick else 2)
    size = MICRO_SIZE_QUICK if args.quick else MICRO_SIZE
    harness_size = "quick" if args.quick else "full"
    state = swapenv.State()
    tmp_root = tempfile.mkdtemp(prefix="gleaner-codec-")
    res = {
        "schema": SCHEMA,
        "date": now_iso(),
        "command": "python3 bench/codec.py " + " ".join(sys.argv[1:]),
        "git_commit": git_commit(),
        "machine": machine(),
        "gleaner": GLEANER,
        "params": {"quick": args.quick, "reps": reps, "pin_cpu": PIN_CPU,
                   "micro": {"pattern": MICRO_PATTERN, "size": size, "local_pct": LOCAL_PCT,
                             "data_paths": {p: fmt_cmd(a) for p, a in DATA_PATHS.items()},
                             "codec_off": fmt_cmd(CODEC_OFF)},
                   "demo": {"n": vs_swap.DEMO_N, "local_mem": DEMO_LOCAL, "cgroup": DEMO_LOCAL},
                   "java": {"n": JAVA_N, "local_mem": JAVA_LOCAL, "cgroup": JAVA_CGROUP,
                            "former_local_mem": JAVA_LOCAL_FORMER,
                            "opts": JAVA_OPTS, "gleaner_only_opts": JAVA_GLEANER_OPTS},
                   "harness": None if args.skip_harness else {
                       "size": harness_size, "workloads": HARNESS_WORKLOADS, "ratio": HARNESS_RATIO},
                   "python": python_exe()},
        "linux_swap": {**swapenv.linux_swap_settings(),
                       "zram_algorithm": "the kernel's default (comp_algorithm left as it is)"},
        "targets": {"memory": MEMORY_TARGET, "fault_p50": FAULT_TARGET, "wire": WIRE_TARGET},
        "complete": False,
        "order": [],
        "demo": {s: [] for s in DEMO_SYSTEMS},
        "java": {s: [] for s in JAVA_SYSTEMS},
        "micro": {p: {"codec-on": [], "codec-off": []} for p in DATA_PATHS},
        "harness": None if args.skip_harness else {w: [] for w in HARNESS_WORKLOADS},
    }
    ctx = {"state": state, "size": size, "timeout": 300 if args.quick else 900,
           "harness_size": harness_size, "harness_timeout": 1200 if args.quick else 2400,
           "harness_child": None, "cleanup_errors": []}
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    t_start = time.monotonic()
    rc = 0
    try:
        classes, jrec, jerr = compile_java(tmp_root)
        res["java_build"] = {**jrec, "error": jerr}
        ctx["java_classes"] = classes
        if jerr:
            ctx["java_error"] = f"Java not built: {jerr}"
            log(f"!!! {ctx['java_error']} -- the Java cells will FAIL")
        else:
            ctx["java_job"] = java_job(jrec["java"], classes)
            ctx["java_job_gleaner"] = java_job(jrec["java"], classes, gleaner=True)
        blks = blocks(args.skip_harness)
        n_cells = sum(len(b) for b in blks)
        log(f"{reps} rep(s) of {n_cells} cells; micro {MICRO_PATTERN} {size}, harness --size "
            f"{harness_size if not args.skip_harness else '(skipped)'}; results: {args.out}")
        n = 0
        for rep in range(reps):
            order = cell_order(blks, rep)
            res["order"].append([":".join(x for x in c if x) for c in order])
            for kind, what, system in order:
                n += 1
                name = " ".join(x for x in (kind, what, system) if x)
                log(f"rep {rep + 1}/{reps} [{n}/{reps * n_cells}] {name} ...")
                tmp = tempfile.mkdtemp(dir=tmp_root)
                t0 = time.monotonic()
                try:
                    if kind in ("demo", "java"):
                        rec = job_cell_retried(ctx, kind, system, rep, tmp)
                    elif kind == "micro":
                        rec = micro_run(ctx, what, system, rep, tmp)
                    else:
                        rec = harness_cell_retried(ctx, what, rep, tmp)
                except Interrupted:
                    raise
                except Exception as e:   # noqa: BLE001 - a harness error is a failed cell, recorded
                    rec = {"kind": kind, "system": system, "rep": rep, "ok": False,
                           "error": f"harness error: {type(e).__name__}: {e}"}
                    if kind in ("demo", "java"):
                        rec.update(run_ok=False, run_error=rec["error"])
                    if kind == "micro":
                        rec["data_path"] = what
                    if kind == "harness":
                        rec["workload"] = what
                rec["cell_s"] = round(time.monotonic() - t0, 3)
                left = _leftovers(set())
                if left:
                    rec["leftover_processes"] = left
                    log(f"  processes left behind (ended): {left}")
                if kind in ("demo", "java"):
                    res[kind][system].append(rec)
                    check_demo_checksums(res, key=kind)
                elif kind == "micro":
                    res["micro"][what][system].append(rec)
                    check_micro_checksums(res)
                else:
                    res["harness"][what].append(rec)
                log(f"  {name}: {_summary_line(rec)} ({rec['cell_s']:.1f} s)")
                if not rec.get("ok"):
                    log(f"  !!! FAILED CELL: {name} rep {rep + 1}: {rec.get('error')}")
                _write(res, args.out)
                shutil.rmtree(tmp, ignore_errors=True)
        for kind in ("demo", "java"):
            check_demo_checksums(res, final=True, key=kind)
        res["complete"] = True
    except Interrupted as e:
        res["interrupted"] = str(e)
        log(f"interrupted ({e}): cleaning up")
        rc = 130
    finally:
        for s in old:
            signal.signal(s, signal.SIG_IGN)   # a second Ctrl-C must not stop the cleanup
        _end_children(ctx)
        errors = ctx["cleanup_errors"] + swapenv.teardown(state)
        if errors:
            log("cleanup errors: " + "; ".join(errors) + " -- run `python3 -m bench.harness cleanup`")
            res["cleanup_errors"] = errors
        res["duration_s"] = round(time.monotonic() - t_start, 1)
        _write(res, args.out)
        shutil.rmtree(tmp_root, ignore_errors=True)
        for s, h in old.items():
            signal.signal(s, h)
    failed = failed_cells(res)
    log(f"wrote {args.out} ({res['duration_s']} s)")
    for v in verdicts(res):
        log(f"  {v['scope']} {v['target']}: ratio {_fmt(v['ratio'], '{:.3f}')} "
            f"(bound {v['op']} {v['bound']}): {v['verdict'].upper()}")
    for r in retried_cells(res):
        log(f"  run again after an OOM kill: {r}")
    if failed:
        log(f"!!! {len(failed)} FAILED cell(s): " + "; ".join(failed))
    return rc or (1 if failed or not res["complete"] else 0), res


# ---- the report ------------------------------------------------------------------------------


def _x(v):
    return "-" if v is None else f"{v:.2f}×"


def _mib(v, fmt="{:.1f}"):
    return _fmt(v / (1 << 20) if v is not None else None, fmt)


def _verdict_cell(v):
    return {"met": "**MET**", "not met": "**NOT MET**", "FAILED": "**FAILED**"}.get(v, v)


def _bound(v):
    return f"{v['op'].replace('<=', '≤').replace('>=', '≥')} {v['bound']:g}"


def _ratio_cell(v, fmt="{:.2f}"):
    s = _fmt(v["ratio"], fmt)
    if len(v["per_rep"]) > 1:
        s += " ({})".format(", ".join(fmt.format(x) for x in v["per_rep"]))
    return s


def _first_command(runs):
    return runs[0]["command"] if runs else None


def _scope_label(scope, prm):
    return {"demo": f"demo job (`scripts/demo_job.py {prm.get('demo', {}).get('n')}`)",
            "java": f"Java (`FarHeap {prm.get('java', {}).get('n')}`)",
            "memcached": "memcached (harness)", "redis": "redis (harness)"}.get(scope, scope)


def _limits(scope, res):
    prm = res.get("params", {})
    if scope == "demo":
        return f"{prm['demo']['local_mem']} / {prm['demo']['cgroup']} cgroup"
    if scope == "java":
        return f"{prm['java']['local_mem']} / {prm['java']['cgroup']} cgroup"
    cells = [c for c in ((res.get("harness") or {}).get(scope) or []) if c.get("ok")]
    for c in cells:
        _, g, _, _ = summarise_harness(c.get("harness"), scope)
        if g and g.get("budget_bytes"):
            b = g["budget_bytes"] / (1 << 20)
            return f"{b:.0f}M / {b:.0f}M cgroup ({HARNESS_RATIO}% of the footprint)"
    return f"{HARNESS_RATIO}% of the footprint, both"


def _memory_commands(res, scope):
    """The exact commands behind one row of target (a)."""
    if scope in ("demo", "java"):
        by = res.get(scope) or {}
        out = []
        for system in ("gleaner", "linux-swap"):
            c = _first_command(by.get(system, []))
            if c:
                lim = (by[system][0].get("cgroup_limit_bytes") or 0) / (1 << 20)
                out.append(f"`{c}`" + (f" in a {lim:.0f} MiB cgroup with zram swap" if system == "linux-swap" else ""))
        return out
    cells = ((res.get("harness") or {}).get(scope)) or []
    out = [f"`{c['command']}` (rep {c['rep'] + 1})" for c in cells[:2]]
    for c in cells[:1]:
        _, g, lx, _ = summarise_harness(c.get("harness"), scope)
        for name, r in (("gleaner", g), ("linux-swap", lx)):
            if r and r.get("command"):
                out.append(f"its {name} server: `{r['command']}`"
                           + (f" in a {(r.get('budget_bytes') or 0) / (1 << 20):.0f} MiB cgroup" if name == "linux-swap" else ""))
    return out


def render_text(res, results_name="bench/results/codec.json"):
    prm = res.get("params", {})
    m = res.get("machine", {})
    ls = res.get("linux_swap", {})
    L = [BEGIN, "", "## The page codec against its targets (same run)", ""]
    L.append(f"Generated by `python3 bench/codec.py --render-only` from `{results_name}`; every number "
             "is in that file with each run's exact command and its raw JSON or stats. Only this "
             "section, between the `codec:begin`/`codec:end` markers, is generated; the verdicts "
             "are computed from the numbers.")
    L.append("")
    if prm.get("quick"):
        L.append("**A `--quick` smoke run (small sizes, one repetition): these are not the benchmark's numbers.**")
        L.append("")
    if not res.get("complete", False):
        L.append(f"**Incomplete run** ({res.get('interrupted', 'stopped early')}).")
        L.append("")
    L.append(f"Machine: {m.get('cpus')} vCPUs ({m.get('cpu_model')}), {m.get('mem_gib')} GiB RAM, "
             f"Linux {m.get('kernel')} ({m.get('virtualization', '?')}); load average "
             f"{_fmt(m.get('loadavg_at_start'), '{:.2f}')} at the start. Run {res.get('date')}, commit "
             f"`{res.get('git_commit')}`, {prm.get('reps')} interleaved repetition(s) in rotated "
             "order; tables show the median and, in parentheses, the range (or the per-repetition "
             "ratios) over repetitions. The codec on is gleaner's default (LZ4, AES-256-GCM); off "
             "is `--compress off --encrypt off`. Linux: a memory cgroup "
             f"({ls.get('cgroup')}) with swap on a fresh zram device per run (swappiness "
             f"{ls.get('swappiness')}, page-cluster {ls.get('page_cluster')}).")
    L.append("")
    vs = verdicts(res)
    met = sum(v["verdict"] == "met" for v in vs)
    summary = f"**{met} of {len(vs)} targets met**"
    notmet = [f"{v['scope']} {v['target']}" for v in vs if v["verdict"] == "not met"]
    failed = [f"{v['scope']} {v['target']}" for v in vs if v["verdict"] == "FAILED"]
    na = [f"{v['scope']} {v['target']}" for v in vs if v["verdict"] == "n/a"]
    if notmet:
        summary += "; not met: " + ", ".join(notmet)
    if failed:
        summary += "; **FAILED** (a run failed): " + ", ".join(failed)
    if na:
        summary += "; undefined: " + ", ".join(na)
    L.append(summary + ".")
    L.append("")

    # (a)
    mv = memory_verdicts(res)
    if mv:
        L.append("### (a) Host memory for far pages against zram's")
        L.append("")
        L.append("gleaner: the far memory the host spent on the run's far pages at its peak (stats "
                 "`total.store.peak_resident_bytes`: the shared-memory slab bytes holding blobs, "
                 "summed over the run's processes). Linux: zram's `mem_used_total` at its peak, "
                 "sampled every 50 ms during the run (demo job, Java) or zram's own `mem_used_max` "
                 "read after the run (memcached and redis, as the harness records it). Same "
                 "workload, same limit: gleaner's budget covers every private anonymous mapping "
                 "and allocation of the program (its preload serves them all), the cgroup's limit "
                 "everything the program charges; the second table shows how much of the limit "
                 "was the program's anonymous memory at zram's peak, and separates the codec's "
                 "efficiency (bytes per far page) from the size of the far set.")
        L.append("")
        L.append("| workload | limit: gleaner / Linux | gleaner far memory peak MiB | zram peak MiB | ratio | bound | "
                 "verdict | far pages at peak: gleaner / zram | host bytes per far page: gleaner / zram |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        for v in mv:
            at_exit = (v["gleaner_pages"] is not None
                       and v["gleaner_pages_source"] != ["at the peak (blobs_at_peak)"])
            L.append(f"| {_scope_label(v['scope'], prm)} | {_limits(v['scope'], res)} | "
                     f"{_mib(v['gleaner'])} | {_mib(v['linux'])} | {_ratio_cell(v)} | {_bound(v)} | "
                     f"{_verdict_cell(v['verdict'])} | {_fmt(v['gleaner_pages'], '{:.0f}')}"
                     f"{' (at exit)' if at_exit else ''} / {_fmt(v['zram_pages'], '{:.0f}')} | "
                     f"{_fmt(v['gleaner_bytes_per_page'], '{:.0f}')} / {_fmt(v['zram_bytes_per_page'], '{:.0f}')} |")
        fp = java_former_pairing(res)
        if fp:
            L.append(f"| Java, gleaner at its former budget (information) | {prm['java'].get('former_local_mem')} / "
                     f"{prm['java']['cgroup']} cgroup | {_mib(fp['gleaner'])} | {_mib(fp['linux'])} | "
                     f"{_ratio_cell(fp)} | - | information | {_fmt(fp['gleaner_pages'], '{:.0f}')} / "
                     f"{_fmt(fp['zram_pages'], '{:.0f}')} | {_fmt(fp['gleaner_bytes_per_page'], '{:.0f}')} / "
                     f"{_fmt(fp['zram_bytes_per_page'], '{:.0f}')} |")
        L.append("")
        if fp:
            L.append(f"Java's information row: gleaner given {prm['java'].get('former_local_mem')} against the "
                     f"cgroup's {prm['java']['cgroup']}, the pairing of the runs before 2026-11-26, which "
                     "assumed the JVM's non-heap memory was outside gleaner's budget. It is not (the "
                     "preload serves every private anonymous mapping), and the cgroup's charge at zram's "
                     "peak is the program's anonymous memory (the next table), so that pairing gave "
                     "Linux 32 MiB more local memory for the same pages; it is kept beside the "
                     "same-limit row so the change of pairing can be seen. Its command: "
                     f"`{fp['command']}`.")
            L.append("")
        L.append("| workload | gleaner far pages at peak | gleaner bytes per far page: blob / host memory | "
                 "gleaner compression | zram far pages at peak (same-filled) | zram bytes per far page: "
                 "compressed / host memory | zram compression | Linux local memory at zram's peak: "
                 "anonymous / page cache MiB |")
        L.append("|---|---|---|---|---|---|---|---|")
        for v in mv:
            star = ("" if v["gleaner_pages"] is None or v["gleaner_pages_source"] == ["at the peak (blobs_at_peak)"]
                    else " (at exit)")
            L.append(f"| {_scope_label(v['scope'], prm)} | {_fmt(v['gleaner_pages'], '{:.0f}')}{star} | "
                     f"{_fmt(v['gleaner_blob_per_page'], '{:.0f}')} / {_fmt(v['gleaner_bytes_per_page'], '{:.0f}')} | "
                     f"{_x(v['gleaner_compression'])} | {_fmt(v['zram_pages'], '{:.0f}')} "
                     f"({_fmt(v['zram_same_pages'], '{:.0f}')}) | {_fmt(v['zram_blob_per_page'], '{:.0f}')} / "
                     f"{_fmt(v['zram_bytes_per_page'], '{:.0f}')} | {_x(v['zram_compression'])} "
                     f"({v['zram_algorithm'] or '?'}) | {_mib(v.get('zram_local_anon'))} / "
                     f"{_mib(v.get('zram_local_file'))} |")
        L.append("")
        L.append("gleaner: far pages at the peak = `store.blobs_at_peak` (pages with a blob when "
                 "`resident_bytes` peaked; same-filled pages, kept as one word in the index, take "
                 "none and are not counted); bytes per far page = `blob_bytes_at_peak` / those "
                 "pages (the codec's output) and `peak_resident_bytes` / those pages (with the slab "
                 "allocator's slack: what the host spends); compression = `codec.pages_encoded × 4096 "
                 "/ codec.blob_bytes` over the run. zram, from the sample where `mem_used_total` "
                 "peaked: pages = `orig_data_size / 4096` (its same-filled pages, `same_pages`, "
                 "included: they take no memory either), bytes per far page = `compr_data_size` and "
                 "`mem_used_total` / pages, compression = `orig_data_size / compr_data_size`; "
                 "local memory = the cgroup's memory.stat `rss` and `cache` read in that sample "
                 "(`-`: a results file from before they were recorded).")
        if any(v["gleaner_pages_source"] and v["gleaner_pages_source"] != ["at the peak (blobs_at_peak)"] for v in mv):
            L.append("")
            L.append("(at exit): stats without `blobs_at_peak`: far pages = `store.pages_stored` when the "
                     "stats were written (at exit), bytes per far page = `resident_bytes / pages_stored` then.")
        L.append("")
        for v in mv:
            if v["errors"]:
                L.append(f"* **{_scope_label(v['scope'], prm)} FAILED** ({v['failed_runs']} run(s)): "
                         + "; ".join(e[:300] for e in v["errors"]))
        if any(v["errors"] for v in mv):
            L.append("")
        L.append("Commands:")
        L.append("")
        jb = res.get("java_build") or {}
        for v in mv:
            for c in _memory_commands(res, v["scope"]):
                L.append(f"* {v['scope']}: {c}")
            if v["scope"] == "java" and jb:
                L.append(f"* java: `{JAVA_CLASSES}` built with `{jb.get('command')}` at bench time "
                         f"({(jb.get('java_version') or '?').splitlines()[0]})")
        L.append("")

    # (b)
    fv = fault_verdicts(res)
    if fv:
        mp = prm.get("micro", {})
        L.append("### (b) The codec's cost on the fault path")
        L.append("")
        L.append(f"`gleaner bench micro --pattern {mp.get('pattern')} --size {mp.get('size')} --local "
                 f"{mp.get('local_pct')}%` pinned to CPU {prm.get('pin_cpu')}, codec on against off, "
                 "same run; remote faults as the program saw them (accesses slower than 1 µs in the "
                 "measured passes).")
        L.append("")
        L.append("| data path | codec on p50 µs | codec off p50 µs | ratio | bound | verdict | on p99 µs | off p99 µs | p99 ratio | faults on / off |")
        L.append("|---|---|---|---|---|---|---|---|---|---|")
        for v in fv:
            L.append(f"| {PATH_LABEL.get(v['scope'], v['scope'])} | {_fmt(v['codec_on'], '{:.1f}')} | "
                     f"{_fmt(v['codec_off'], '{:.1f}')} | {_ratio_cell(v)} | {_bound(v)} | "
                     f"{_verdict_cell(v['verdict'])} | {_fmt(v['p99_on'], '{:.1f}')} | {_fmt(v['p99_off'], '{:.1f}')} | "
                     f"{_fmt(v['p99_ratio'], '{:.2f}')} | {_fmt(v['faults_on'], '{:.0f}')} / {_fmt(v['faults_off'], '{:.0f}')} |")
        L.append("")
        L.append("The codec's own time per page (codec on; means from the runs' totals: `decompress_ns_total "
                 "/ pages_decoded`, `open_ns_total / blobs_opened`, `blob_copy_ns_total / blobs_opened`, "
                 "`compress_ns_total / pages_compressed`, `seal_ns_total / blobs_sealed`; runs since "
                 "`078a9ac` time one blob opened in 8 and divide by `blobs_open_timed`). Decompressing "
                 "and opening are on the fault path; compressing and sealing run in the reclaim threads. "
                 "Copy out: the AEAD opens in place, so a blob is first copied out of the store's "
                 "memory; that first read of the blob brings it into the cache, which costs about as "
                 "much wherever it happens (with the codec off, the decode's copy of the raw blob, "
                 "counted as decompression: the codec-off rows), and is timed "
                 "apart from the open (`-`: results from before it was, when it was part of the "
                 "open's time). Stored raw for "
                 "decode speed: the share of pages written that the codec kept raw because pages of "
                 "their chunk decode slower than the budget and the mean decode per page had no room "
                 "left for them (`raw_for_speed / pages_encoded`; a mean of 1.5 µs with LZ4: this "
                 "program's pages of 8-byte counters take 2.9 µs and no faster pages pay for them, so "
                 "the codec-on run ends up holding them raw and paying only the seal and the open).")
        L.append("")
        L.append("| data path | decompress µs/page | open µs/blob | copy out µs/blob | compress µs/page | "
                 "seal µs/blob | compression ratio | stored raw for decode speed |")
        L.append("|---|---|---|---|---|---|---|---|")
        for v in fv:
            t = v["times"]
            L.append(f"| {PATH_LABEL.get(v['scope'], v['scope'])} | {_fmt(t['decompress_us'], '{:.2f}')} | "
                     f"{_fmt(t['open_us'], '{:.2f}')} | {_fmt(t.get('copy_us'), '{:.2f}')} | "
                     f"{_fmt(t['compress_us'], '{:.2f}')} | "
                     f"{_fmt(t['seal_us'], '{:.2f}')} | {_x(v['compression_ratio'])} | "
                     f"{_fmt(t.get('raw_for_speed_share') and 100 * t['raw_for_speed_share'], '{:.0f}%')} |")
        for v in fv:
            o = v.get("off_times") or {}
            L.append(f"| {PATH_LABEL.get(v['scope'], v['scope'])}, codec off | {_fmt(o.get('decompress_us'), '{:.2f}')} | "
                     f"- | - | {_fmt(o.get('compress_us'), '{:.2f}')} | - | - | - |")
        L.append("")
        for v in fv:
            if v["errors"]:
                L.append(f"* **{v['scope']} FAILED** ({v['failed_runs']} run(s)): " + "; ".join(e[:300] for e in v["errors"]))
        if any(v["errors"] for v in fv):
            L.append("")
        L.append("Commands:")
        L.append("")
        for path, by in (res.get("micro") or {}).items():
            for codec in ("codec-on", "codec-off"):
                c = _first_command(by.get(codec, []))
                if c:
                    L.append(f"* {path}, {codec}: `{c}`")
        L.append("")

    # (c)
    wv = wire_verdicts(res)
    dw = demo_wall(res)
    if wv or dw["present"]:
        L.append("### (c) Bytes on the wire to a TCP memnode")
        L.append("")
    if wv:
        v = wv[0]
        L.append("From the TCP micro runs of (b): payload bytes = the codec's `blob_bytes` (written) + "
                 "`blob_bytes_decoded` (read), against the pages they carry, (`pages_encoded` + "
                 "`pages_decoded`) × 4096. Not counted, on either side: the page batches' framing of "
                 "12 bytes per entry (page id and length), the read requests' page ids and the frame "
                 "headers. Compression ratio: `pages_encoded × 4096 / blob_bytes` of the same run. "
                 "The bound: the reduction reaches 95% of the compression ratio.")
        L.append("")
        L.append("| run | pages moved | page bytes MiB | payload bytes MiB | bytes per page | reduction |")
        L.append("|---|---|---|---|---|---|")
        for k, label in (("on", "codec on"), ("off", "codec off")):
            x = v[k]
            L.append(f"| {label} | {_fmt(x['pages'], '{:.0f}')} | {_mib(x['page_bytes'])} | {_mib(x['wire_bytes'])} | "
                     f"{_fmt(x['bytes_per_page'], '{:.0f}')} | {_x(x['reduction'])} |")
        L.append("")
        L.append("| target | reduction (codec on) | compression ratio | ratio | bound | verdict |")
        L.append("|---|---|---|---|---|---|")
        L.append(f"| {v['what']} | {_x(v['reduction'])} | {_x(v['compression_ratio'])} | "
                 f"{_ratio_cell(v, '{:.3f}')} | {_bound(v)} | {_verdict_cell(v['verdict'])} |")
        L.append("")
        L.append(f"Per page moved, the codec-off run sends {_fmt(v['off']['bytes_per_page'], '{:.0f}')} bytes and the "
                 f"codec-on run {_fmt(v['on']['bytes_per_page'], '{:.0f}')}: "
                 f"{_fmt(v['reduction_vs_off'], '{:.2f}')}× fewer with the codec on (same run).")
        L.append("")
        if v["errors"]:
            L.append("* **FAILED**: " + "; ".join(e[:300] for e in v["errors"]))
            L.append("")
        by = (res.get("micro") or {}).get("tcp") or {}
        for codec in ("codec-on", "codec-off"):
            c = _first_command(by.get(codec, []))
            if c:
                L.append(f"* {codec}: `{c}`")
        L.append("")
    if dw["present"]:
        demo = res.get("demo") or {}
        ratio = _fmt(dw["ratio"], "{:.2f}")
        if len(dw["per_rep"]) > 1:
            ratio += " ({})".format(", ".join(f"{x:.2f}" for x in dw["per_rep"]))
        L.append("The demo job's wall time, codec on against off (information, no target):")
        L.append("")
        L.append("| codec on wall s | codec off wall s | on / off | checksum |")
        L.append("|---|---|---|---|")
        runs = demo.get("gleaner", []) + demo.get("gleaner-codec-off", [])
        bad = [r for r in runs if not r.get("ok")]
        ref = res.get("demo_reference_checksum")
        chk = (f"`{ref}` (all match all-local)" if runs and not bad and ref
               else f"**FAILED ({len(bad)} of {len(runs)})**")
        L.append(f"| {_span([r['wall_s'] for r in _ok(demo.get('gleaner', []))], '{:.2f}')} | "
                 f"{_span([r['wall_s'] for r in _ok(demo.get('gleaner-codec-off', []))], '{:.2f}')} | {ratio} | {chk} |")
        L.append("")
        for system in ("gleaner", "gleaner-codec-off"):
            c = _first_command(demo.get(system, []))
            if c:
                L.append(f"* {system}: `{c}`")
        L.append("")

    fc = far_copies(res)
    if fc["present"]:
        L.append("Which fetched pages drop their far copy (`--drop-far-copies`), on the demo job "
                 "(information, no target):")
        L.append("")
        L.append("| policy | far memory at peak MiB | wall s |")
        L.append("|---|---|---|")
        for row in fc["rows"]:
            L.append(f"| {row['policy']} | {_mib(row['peak'])} | {_fmt(row['wall'], '{:.2f}')} |")
        L.append("")
        for system in ("gleaner-drop-demand", "gleaner-keep-copies"):
            c = _first_command((res.get("demo") or {}).get(system, []))
            if c:
                L.append(f"* `{c}`")
        L.append("")

    fails = failed_cells(res)
    L.append("Failed runs: " + ("none." if not fails else f"**{len(fails)}**:"))
    for f in fails:
        L.append(f"* {f[:500]}")
    L.append("")
    retried = retried_cells(res)
    if retried:
        L.append(f"Run again ({len(retried)}; the stopped tries are in the results file): Linux runs the "
                 "kernel OOM-killed in their memory cgroup (a whole harness cell after both of the "
                 "harness's own tries; a demo or Java run after one):")
        for f in retried:
            L.append(f"* {f[:500]}")
        L.append("")
    L.append("Checks: every demo and Java run's checksum is compared with the all-local run's; every "
             "micro run checks every word it reads in-process (`checksum_ok`) and all micro runs' "
             "checksums agree; the harness checks every memcached GET answer byte for byte and reads "
             "redis values back and compares them.")
    L.append("")
    L.append("Reproduce: `cargo build --release && sudo python3 bench/codec.py`.")
    L.append("")
    L.append(END)
    return "\n".join(L)


def render(res, doc=DOC, results_name="bench/results/codec.json"):
    write_section(render_text(res, results_name), BEGIN, END, doc_path=doc, at_end=True)
    log(f"wrote the codec section of {doc}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: micro --size 64M, harness --size quick, --reps 1 (unless given)")
    ap.add_argument("--reps", type=int, help="interleaved repetitions (default 2; 1 with --quick)")
    ap.add_argument("--skip-harness", action="store_true", help="leave out memcached and redis")
    ap.add_argument("--out", default=DEFAULT_OUT, help="results JSON (default bench/results/codec.json)")
    ap.add_argument("--doc", default=DOC,
                    help="the document to render into (default bench/results/DETAILS.md)")
    ap.add_argument("--no-render", action="store_true", help="write the JSON only")
    ap.add_argument("--render-only", action="store_true", help="re-render the doc section from --out")
    return vs_swap.run_or_render(ap, argv, "codec.py", run_all, render, log)


if __name__ == "__main__":
    sys.exit(main())
