#!/usr/bin/env python3
"""Renders bench/results/reclaim.json into the reclaim section of bench/results/DETAILS.md
(between the `reclaim:begin`/`reclaim:end` markers) and plots p99 latency against offered load.

    python3 bench/reclaim_report.py [bench/results/reclaim.json]
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.doc_section import DOC, write_section  # noqa: E402

PLOTS = os.path.join(ROOT, "bench", "results", "reclaim-plots")
BEGIN, END = "<!-- reclaim:begin -->", "<!-- reclaim:end -->"
from bench.reclaim import P99_TARGET_US  # noqa: E402
# Looser p99 targets shown beside the fixed one, to show how much a ranking depends on it.
LOOSER = [2 * P99_TARGET_US, 5 * P99_TARGET_US]
# The median latency under which a rate counts as kept up with (the capacity column).
P50_LIMIT_US = 5000.0
# CPU steal (percent of a step) above which a step counts as disturbed by the hypervisor.
STEAL_CUT = 8.0


def sustained(run, target):
    """The highest offered rate answered in full with p99 within `target` µs (0 if none)."""
    ok = [x["offered_rps"] for x in run["rates"] if not x["unanswered"] and x["p99_us"] <= target]
    return max(ok) if ok else 0


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return None if n == 0 else (xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2)


INF = float("inf")


def median_by_rate(passes, rates, field):
    """Median of `field` over the passes at each rate; a pass that stopped before a rate
    (saturated) or left requests unanswered counts as infinitely slow there."""
    out = {}
    for rate in rates:
        vals = []
        for r in passes:
            x = next((y for y in r["rates"] if y["offered_rps"] == rate), None)
            vals.append(INF if x is None or x["unanswered"] else x[field])
        out[rate] = median(vals)
    return out


def p99_by_rate(passes, rates):
    """Median p99 over the passes at each rate (see `median_by_rate`)."""
    return median_by_rate(passes, rates, "p99_us")


def capacity(passes, rates, p50_limit=P50_LIMIT_US):
    """The highest rate whose median p50 over the passes is within `p50_limit` µs: where the
    server stops keeping up, which CPU steal moves far less than the tail."""
    med = median_by_rate(passes, rates, "p50_us")
    ok = [rate for rate in rates if med[rate] <= p50_limit]
    return max(ok) if ok else 0


def sustained_median(passes, rates, target):
    """The highest rate whose median p99 over the passes is within `target` (0 if none)."""
    med = p99_by_rate(passes, rates)
    ok = [rate for rate in rates if med[rate] <= target]
    return max(ok) if ok else 0


def by_mode(runs):
    """Runs grouped by mode, modes in first-seen order."""
    out = {}
    for r in runs:
        out.setdefault(r["mode"], []).append(r)
    return out


def us(v):
    return "—" if v is None else (f"{v / 1000:.1f} ms" if v >= 10000 else f"{v:.0f} µs")


def plot(res, ratio, groups, rates):
    """p99 against offered load, the median over the passes, one line per mode."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    os.makedirs(PLOTS, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for mode, passes in groups.items():
        med = p99_by_rate(passes, rates)
        xs = [r for r in rates if med[r] != INF]
        ax.plot(xs, [med[r] / 1000 for r in xs], marker="o", label=mode)
    ax.axhline(res["p99_target_us"] / 1000, color="grey", linestyle="--", linewidth=1,
               label="p99 target")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("p99 latency (ms), median of passes")
    ax.set_title(f"memcached at {ratio}% local memory, open loop")
    ax.legend()
    fig.tight_layout()
    path = os.path.join(PLOTS, f"memcached-p99-{ratio}pct.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return os.path.relpath(path, os.path.dirname(DOC))


def latency_table(groups, rates, target):
    """Markdown rows: per mode, the rate sustained under `target` (median p99 over the passes),
    each pass's own, the rates sustained under the looser targets, and the median p99 per rate."""
    L = ["| mode | sustained rps (median p99 ≤ target) | each pass | " +
         " | ".join(f"p99 ≤ {us(t)}" for t in LOOSER) + f" | capacity (p50 ≤ {us(P50_LIMIT_US)}) | " +
         " | ".join(f"p99 @ {r}" for r in rates) + " |",
         "|---" * (len(rates) + 4 + len(LOOSER)) + "|"]
    for mode, passes in groups.items():
        med = p99_by_rate(passes, rates)
        each = " / ".join(str(sustained(r, target)) for r in passes)
        L.append(f"| {mode} | {sustained_median(passes, rates, target)} | {each} | " +
                 " | ".join(str(sustained_median(passes, rates, t)) for t in LOOSER) +
                 f" | {capacity(passes, rates)} | " +
                 " | ".join("past saturation" if med[r] == INF else us(med[r]) for r in rates) +
                 " |")
    return L


def steps(rc):
    """Median µs per evicted page of each eviction step over runs, or — if not recorded."""
    s = [x["evict_step_ns_per_page"] for x in rc if x.get("evict_step_ns_per_page")]
    if not s:
        return "—"
    return " / ".join(f"{median([y[k] for y in s]) / 1000:.1f}"
                      for k in ("protect", "read", "send", "drop"))


def steal_effect(m, target, cut=STEAL_CUT):
    """One sentence: how the far-memory runs' steps that kept up (p50 within the capacity limit)
    fared against the p99 target with and without much CPU steal."""
    steps = [x for runs in m["by_ratio"].values() for r in runs for x in r["rates"]
             if x.get("steal_pct") is not None and not x["unanswered"] and x["p50_us"] <= P50_LIMIT_US]
    hi = [x["p99_us"] for x in steps if x["steal_pct"] >= cut]
    lo = [x["p99_us"] for x in steps if x["steal_pct"] < cut]
    if not hi or not lo:
        return ""
    miss = lambda v: 100 * sum(p > target for p in v) / len(v)  # noqa: E731
    return (f"Of the far-memory steps that kept up (p50 ≤ {us(P50_LIMIT_US)}), the {len(hi)} with "
            f"≥ {cut:.0f}% steal missed the p99 target {miss(hi):.0f}% of the time (median p99 "
            f"{us(median(hi))}), the {len(lo)} with less {miss(lo):.0f}% (median p99 "
            f"{us(median(lo))}).")


def pressure(passes):
    """What the pager did during the rate ladder, over every pass and step of one mode."""
    steps = [x["pager"] for r in passes for x in r["rates"] if x.get("pager")]
    if not steps:
        return None
    return {"faults_per_s": max(x["faults_per_s"] for x in steps),
            "busy_mean": sum(x["reclaim_busy_frac"] for x in steps) / len(steps),
            "busy_peak": max(x["reclaim_busy_frac_peak_100ms"] for x in steps),
            "waits": sum(x["waited_on_budget"] + x["direct_waits"] for x in steps)}


def section(res, src):
    res["p99_target_us"] = P99_TARGET_US
    target = P99_TARGET_US
    L = [BEGIN, "",
         "## Reclamation: Hermit against its ablations (same run)", "",
         f"Generated by `python3 bench/reclaim_report.py` from `{src}` (produced by "
         f"`{res['command']}` on {res['date'][:10]}, commit {res['git_commit'][:10]}; "
         f"{res['machine'].get('cpus')} vCPUs, kernel {res['machine'].get('kernel')}). "
         "Modes: `hermit` (feedback-directed pool, at most half the CPUs' worth of threads: 1 "
         "here), `hermit:max4` (the same, at most 4 threads), `static:N` (N threads "
         "once fewer than 8 MiB are free), `direct` (the faulting thread reclaims, like Linux). "
         "All-local is the same program with no limit, measured in the same run.", ""]
    for key, src_run in (res.get("kept_from_earlier_run") or {}).items():
        L += [f"The *{key}* part below comes from an earlier run of the same script: "
              f"`{src_run['command']}` on {str(src_run['date'])[:10]}, commit "
              f"{str(src_run['git_commit'])[:10]}.", ""]
    m = res.get("memcached") or {}
    if m:
        p = m["params"]
        rates = m["rates"]
        reps = m.get("reps", 1)
        L += ["### memcached, open-loop load at rising offered rates",
              "",
              f"{p['keys']} keys of {p['value_size']} B (footprint after load "
              f"{m['footprint_bytes'] / 2**20:.0f} MiB), Zipf s = 0.99, 95% GET, {p['secs']} s per "
              f"rate, 4 connections; latency from each request's scheduled send time. Every mode "
              f"ran {reps} times (whole passes over all modes, the order rotated each pass); the "
              f"p99 shown is the median over the passes. A rate counts as sustained when every "
              f"request was answered and the median p99 ≤ {us(target)} (all-local memcached "
              "itself reaches a p99 of a few ms at low load on this VM: thread wake-up latency); "
              "the rates sustained under two looser targets stand beside it, and the capacity: "
              f"the highest rate whose median p50 stays within {us(P50_LIMIT_US)} (where the "
              "server stops keeping up, which CPU steal moves far less than the tail). "
              "Every GET answer is checked byte for byte; a 1/7 sample of all keys is read back "
              "at the end of each run. A pass stops its ladder at the first rate past "
              "saturation (counted as missed at the higher rates).", "",
              "Below each latency table, what the pager did during the ladders (every pass and "
              "rate step, from `--stats-trace`): the highest fault-in rate of any step, the "
              "reclaim pool's busy fraction (busy time over wall time, all threads summed: 1.0 is "
              "one thread working all the time) on average and in the busiest 100 ms, the faults "
              "that had to wait for room (budget waits + direct reclaims) during the ladders, and "
              "over whole runs (loading included) the direct-wait ratio, the reclaim CPU time "
              "and each eviction step's time per page (wall time, so CPU contention counts).",
              ""]
        local = m["all_local"] if isinstance(m["all_local"], list) else [m["all_local"]]
        steal = [x.get("steal_pct") for r in local for x in r["rates"] if x.get("steal_pct") is not None]
        for ratio, runs in m["by_ratio"].items():
            groups = {"all-local": local, **by_mode(runs)}
            steal += [x.get("steal_pct") for r in runs for x in r["rates"]
                      if x.get("steal_pct") is not None]
            L += [f"#### {ratio}% local memory", ""]
            img = plot(res, ratio, groups, rates)
            if img:
                L += [f"![p99 against load at {ratio}%]({img})", ""]
            L += latency_table(groups, rates, target)
            sus = {mode: sustained_median(passes, rates, target) for mode, passes in groups.items()}
            L += ["", "| mode | peak faults/s | reclaim busy, mean | reclaim busy, busiest 100 ms | "
                  "faults waiting for room (ladders) | direct-wait ratio (whole runs) | reclaim "
                  "CPU per run | peak threads | µs per evicted page: protect / copy / send / drop |",
                  "|---|---|---|---|---|---|---|---|---|"]
            for mode, passes in by_mode(runs).items():
                pr = pressure(passes)
                rc = [r["reclaim"] for r in passes]
                dw = sum(x["direct_waits"] for x in rc)
                faults = sum(x["remote_faults"] for x in rc) or 1
                cells = (["—"] * 4 if pr is None else
                         [str(pr["faults_per_s"]), f"{pr['busy_mean']:.3f}",
                          f"{pr['busy_peak']:.2f}", str(pr["waits"])])
                L.append(f"| {mode} | " + " | ".join(cells) +
                         f" | {100 * dw / faults:.2f}% ({dw}) | "
                         f"{median([x['pool_cpu_s'] for x in rc]):.2f} s | "
                         f"{max(x['peak_threads_awake'] for x in rc)} | {steps(rc)} |")
            best_static = max((v for k, v in sus.items() if k.startswith("static")), default=0)
            s1, h = sus.get("static:1", 0), sus.get("hermit", 0)
            h4 = sus.get("hermit:max4")
            L += ["", f"Median over passes: hermit sustains {h} rps"
                  + (f" (hermit:max4 {h4})" if h4 is not None else "")
                  + f"; static:1 {s1}; best static {best_static}"
                  + (f" (hermit / static:1 = {h / s1:.2f}×)" if s1 else "") + ".", ""]
        if steal:
            L += [f"CPU steal (the hypervisor running someone else) during the rate steps: median "
                  f"{median(steal):.1f}%, worst step {max(steal):.1f}% (recorded per step in the "
                  "JSON). " + steal_effect(m, target), ""]
    pr = res.get("predict") or {}
    if pr:
        rates = pr["rates"]
        L += ["### Write prediction on and off (memcached, `hermit`)", "",
              f"The same ladder and parameters, {pr.get('reps', 1)} interleaved passes; `on` is "
              "the default (a page seen written is installed writable on its next "
              "read fetches, saving the write-protect fault its first write would take), "
              "`off` write-protects every read fetch and runs the predictor in shadow, counting "
              "how many would-be predictions the program then confirmed by writing. Counters are "
              "medians over the passes of whole runs (loading included).", ""]
        wp = [x["reclaim"].get("write_protect_faults") for runs in pr["by_ratio"].values()
              for x in runs]
        if wp and all(v == 0 for v in wp):
            L += ["Every run here took no write-protect fault: under asynchronous dirty tracking "
                  "(the default) a write costs no fault, so the predictor runs in shadow in both "
                  "variants and the two differ only by noise. The comparison means something "
                  "under `--dirty-tracking sync`.", ""]
        local = pr["all_local"]
        for ratio, runs in pr["by_ratio"].items():
            groups = {"all-local": local, **by_mode(runs)}
            L += [f"#### {ratio}% local memory", ""] + latency_table(groups, rates, target)
            L += ["", "| variant | remote faults | write-protect faults | installed writable "
                  "by prediction | dirty evictions | bytes written back | shadow precision |",
                  "|---|---|---|---|---|---|---|"]
            for mode, passes in by_mode(runs).items():
                rc = [r["reclaim"] for r in passes]
                wp = [x.get("write_prediction") or {} for x in rc]
                prec = [w["shadow_precision"] for w in wp if w.get("shadow_precision") is not None]
                L.append(f"| {mode} | {median([x['remote_faults'] for x in rc]):.0f} | "
                         f"{median([x['write_protect_faults'] for x in rc]):.0f} | "
                         f"{median([w.get('predicted', 0) for w in wp]):.0f} | "
                         f"{median([x['evicted_dirty'] for x in rc]):.0f} | "
                         f"{median([x['bytes_out'] for x in rc]) / 2**20:.0f} MiB | "
                         + (f"{100 * median(prec):.1f}%" if prec else "—") + " |")
            L.append("")
    ph = res.get("phases") or {}
    if ph:
        p = ph["params"]
        L += ["### Batch job with phases (allocation bursts, then scans)", "",
              f"`bench/phases_job.py {p['mib']} {p['rounds']}`: each round allocates "
              f"{p['mib'] // 2} MiB of 64 KiB chunks, scans everything twice, frees half. "
              f"All-local: {ph['all_local']['seconds']:.2f} s, peak RSS "
              f"{ph['footprint_bytes'] / 2**20:.0f} MiB. The checksum of every run equals "
              "all-local's (checked by the script).", "",
              "| local | mode | completion (s) | all-local / this | faults waiting on direct "
              "reclaim | reclaim-thread CPU (s) | direct-reclaim time (s) |",
              "|---|---|---|---|---|---|---|"]
        for ratio, runs in ph["by_ratio"].items():
            for r in runs:
                rc = r["reclaim"]
                L.append(f"| {ratio}% | {r['mode']} | {r['seconds']:.2f} | {r['vs_all_local']:.3f} | "
                         f"{100 * rc['direct_wait_ratio']:.2f}% | {rc['pool_cpu_s']:.2f} | "
                         f"{rc['direct_s']:.2f} |")
        L.append("")
    mi = res.get("micro") or []
    if mi:
        L += ["### Reclaim throughput per thread and the cost of each step", "",
              "`gleaner bench micro --pattern seq --local 25%` (a write pass, then read passes: "
              "dirty then clean evictions). Pages per second of reclaim-thread busy time, and "
              "each step's time per evicted page (protect: find the written victims with "
              "PAGEMAP_SCAN, or write-protect them under synchronous tracking; drop: take the "
              "batch into a pipe with vmsplice, one vectored MADV_DONTNEED, read the pipe back; "
              "send: compare with the far copies and store the written pages; read: no longer a "
              "separate step, always 0).", "",
              "| mode | pool pages/s per thread | dirty evictions/s | clean evictions/s | protect "
              "ns/page | read ns/page | send ns/page | drop ns/page |",
              "|---|---|---|---|---|---|---|---|"]
        # No clean evictions at all (every fetched page gives up its far copy, so each eviction
        # is a write): None, shown as "-".
        rate = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
        for r in mi:
            s = r["step_ns_per_page"]
            L.append(f"| {r['mode']} | {rate(r['pool_pages_per_s_per_thread'])} | "
                     f"{rate(r['dirty_evictions_per_s'])} | {rate(r['clean_evictions_per_s'])} | "
                     f"{s['protect']} | {s['read']} | {s['send']} | {s['drop']} |")
        L.append("")
    L.append(END)
    return "\n".join(L)


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "bench", "results", "reclaim.json")
    with open(src) as f:
        res = json.load(f)
    text = section(res, os.path.relpath(src, ROOT))
    write_section(text, BEGIN, END)
    print(f"rendered {src} into {DOC}")


if __name__ == "__main__":
    main()
