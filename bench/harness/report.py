"""Plots (PNG, one per workload and metric: metric against local-memory ratio, one line per system)
and the harness section of bench/results/DETAILS.md, between the marker lines below (created at
the end of the file if absent; nothing outside them is ever rewritten)."""

import json
import os

from .common import DOC, PLOTS, RESULTS, ROOT, log

BEGIN = "<!-- harness:begin -->"
END = "<!-- harness:end -->"
COLORS = {"all-local": "black", "gleaner": "tab:blue", "gleaner-memnode": "tab:green", "linux-swap": "tab:red"}


def load(path):
    with open(path) as f:
        return json.load(f)


def _runs(w, system):
    return sorted((r for r in w["runs"] if r["system"] == system), key=lambda r: -(r.get("ratio") or 0))


# ---- plots ---------------------------------------------------------------------------------


def plots(res, outdir=PLOTS):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no plots (bash bench/harness/setup.sh installs it)")
        return []
    os.makedirs(outdir, exist_ok=True)
    made = []
    mode = res["mode"]
    for name, w in res["workloads"].items():
        metrics = [("throughput", f"throughput ({w['throughput_unit']})", False)]
        if w.get("has_latency"):
            metrics.append(("p99_us", "p99 latency (µs, log scale)", True))
        for key, label, logy in metrics:
            fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
            base = [r["metrics"][key] for r in _runs(w, "all-local")
                    if r.get("ok") and (r.get("metrics") or {}).get(key) is not None]
            if base:
                ax.axhline(sum(base) / len(base), color=COLORS["all-local"], ls="--", lw=1,
                           label="all-local (mean; band: its runs)")
                if len(base) > 1:
                    ax.axhspan(min(base), max(base), color="grey", alpha=0.15, lw=0)
            for system in w["systems"]:
                if system == "all-local":
                    continue
                pts = [(r["ratio"], r["metrics"][key]) for r in _runs(w, system)
                       if r.get("ok") and (r.get("metrics") or {}).get(key) is not None]
                fails = [r["ratio"] for r in _runs(w, system) if not r.get("ok") and not r.get("skipped")]
                if pts:
                    xs, ys = zip(*sorted(pts))
                    ax.plot(xs, ys, marker="o", color=COLORS.get(system), label=system)
                for x in fails:
                    ax.axvline(x, color=COLORS.get(system), ls=":", lw=1)
                    ax.annotate(f"{system} failed", (x, 0.02), xycoords=("data", "axes fraction"),
                                rotation=90, fontsize=7, color=COLORS.get(system))
            if logy:
                ax.set_yscale("log")
            elif key == "throughput":
                ax.set_ylim(bottom=0)
            ax.set_xlabel("local memory (% of the all-local footprint)")
            ax.set_ylabel(label)
            ax.set_xticks(w["ratios"])
            ax.set_title(f"{name} ({mode})")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            fig.tight_layout()
            path = os.path.join(outdir, f"{mode}-{name}-{key.replace('_us', '')}.png")
            fig.savefig(path)
            plt.close(fig)
            made.append(path)
    return made


# ---- the section ---------------------------------------------------------------------------


def _mib(b):
    return "-" if b is None else f"{b / (1 << 20):.0f}"


def _num(v, fmt="{:.0f}"):
    if v is None:
        return "-"
    try:
        return fmt.format(v)
    except (ValueError, TypeError):
        return str(v)


def _x(v):
    return "-" if v is None else f"{v:.2f}×"


def _rel(path):
    return os.path.relpath(path, ROOT)


def _cell_line(w, r):
    m = r.get("metrics") or {}
    ratio = "-" if r["ratio"] is None else f"{r['ratio']}%"
    if r.get("skipped"):
        status = "skipped: " + r.get("error", "")
    elif not r.get("ok"):
        status = "**FAILED**: " + (r.get("error") or "").split(";")[0][:160].replace("|", "/").replace("\n", " ")
    else:
        status = "ok"
    if r.get("note"):
        status += " (" + r["note"].split(";")[0] + ")"
    if r.get("leftover_processes"):
        status += f" (left {len(r['leftover_processes'])} process(es) running)"
    if r.get("first_try"):
        status += " (second try: the first was OOM-killed in its cgroup)"
    cols = [r["system"] + (f" (rep {r['rep'] + 1})" if "rep" in r else ""), ratio, _mib(r.get("budget_bytes")),
            _num(m.get("throughput"), "{:.1f}" if (m.get("throughput") or 0) < 100 else "{:.0f}"),
            f"**{_x(r.get('vs_all_local'))}**", _x(r.get("vs_linux_swap"))]
    if w.get("has_latency"):
        lb = "≥" if m.get("unanswered") else ""
        cols += [lb + _num(m.get("p50_us")), lb + _num(m.get("p99_us")), _x(r.get("p99_vs_linux_swap"))]
    zf = (r.get("gleaner") or {}).get("zero_fill_faults")
    cols += [_num(r.get("far_faults")), _num(zf), _mib(r.get("bytes_moved")), _num(r.get("cpu_total_s"), "{:.1f}"),
             _mib(r.get("peak_rss_bytes")), status]
    return "| " + " | ".join(cols) + " |"


def section(res, path, extra=None):
    m = res["machine"]
    L = [BEGIN, "", "## Real workloads under gleaner and under Linux swap (the harness)", ""]
    L.append(f"Generated by `python3 -m bench.harness render` from `{_rel(path)}`"
             + (f" (smoke run: `{_rel(extra)}`)" if extra else "")
             + "; every number is in that file, which also holds each run's exact command, its "
             "far-memory or swap counters and its stderr on failure. Only this section, between the "
             "`harness:begin`/`harness:end` markers, is generated.")
    L.append("")
    L.append(f"Machine: {m['cpus']} vCPUs ({m['cpu_model']}), {m['mem_gib']} GiB RAM, {m['os']}, Linux "
             f"{m['kernel']}, virtualization: {m['virtualization']} (systemd-detect-virt); load average {m['loadavg_at_start']:.2f} at the start "
             "(the machine is shared with other work: numbers are noisy, compare ratios within a run). "
             f"Run {res['date']}, {res.get('duration_s', '?')} s, gleaner at `{res['git_commit'][:12]}`.")
    L.append("")
    ls = res["linux_swap"]
    L.append("Systems: **all-local** (the program alone, run at the start and at the end of each "
             "workload: the spread between the two is shown as noise); **gleaner** "
             f"(`{res['gleaner_launch']}`, the embedded memnode on a Unix socket); **gleaner-memnode** "
             "(the same against a `gleaner memnode` process started by the harness, Unix socket); "
             f"**linux-swap** (the program in a memory cgroup {ls['cgroup']} limited to the budget, swap on "
             f"a zram device the harness adds and removes; vm.swappiness {ls['swappiness']}, page-cluster "
             f"{ls['page_cluster']}). All memnodes are on the same machine.")
    L.append("")
    L.append("Budget = ratio × footprint, the footprint being the all-local run's peak RSS (program text "
             "and runtime included). It is not the same limit for both: gleaner's budget governs only the "
             "managed heap and anonymous mappings (text, libraries, stacks stay resident on top of it: see "
             "the peak RSS column), while the cgroup limit covers everything charged to the cgroup "
             "(anonymous memory, page cache, kernel memory), so at the same ratio Linux swap has less room. "
             "Far faults: gleaner's remote faults / the cgroup's major faults; zero-fill faults: first touches "
             "of managed pages that gleaner serves through userfaultfd (the kernel serves them itself "
             "for all-local and linux-swap). Bytes moved: gleaner's "
             "bytes in + out / swap-in + swap-out pages × 4 KiB. CPU: user+sys of the run's process tree "
             "(for gleaner-memnode plus the memnode's, for linux-swap plus kswapd's); for servers it "
             "includes preloading. × all-local and × linux swap are throughput ratios (higher is better); "
             "p99 × swap is a latency ratio (lower is better). One run per cell.")
    L.append("")
    ws = res["workloads"]
    # Targets.
    mc = ws.get("memcached")
    if mc:
        L.append("### Target: memcached at 50% local memory, gleaner against Linux swap (same run)")
        L.append("")
        L.append("| system | throughput req/s (closed loop) | × linux swap | open-loop p50 µs | p99 µs | p99.9 µs | p99 × linux swap | open-loop req/s achieved / offered |")
        L.append("|---|---|---|---|---|---|---|---|")
        for r in mc["runs"]:
            if r.get("ratio") != 50 and r["system"] != "all-local":
                continue
            mm = r.get("metrics") or {}
            if not r.get("ok"):
                L.append(f"| {r['system']} | **FAILED**: {(r.get('error') or '')[:120]} | | | | | | |")
                continue
            L.append("| {} | {} | {} | {} | {} | {} | {} | {} / {} |".format(
                r["system"] + (f" (rep {r['rep'] + 1})" if "rep" in r else ""), _num(mm.get("throughput")),
                _x(r.get("vs_linux_swap")), ("≥" if mm.get("unanswered") else "") + _num(mm.get("p50_us")),
                ("≥" if mm.get("unanswered") else "") + _num(mm.get("p99_us")),
                ("≥" if mm.get("unanswered") else "") + _num(mm.get("p999_us")), _x(r.get("p99_vs_linux_swap")), _num(mm.get("open_throughput")),
                _num(mm.get("offered_rps"))))
        L.append("")
    L.append("### Target: the lowest local-memory ratio that keeps ≥ 80% of all-local throughput")
    L.append("")
    L.append("Every ratio from 100% down to this one keeps at least 80% of the mean all-local "
             "throughput; *none* means already below 80% (or failed) at the highest ratio tried.")
    L.append("")
    systems = ["gleaner", "gleaner-memnode", "linux-swap"]
    L.append("| workload | ratios tried | " + " | ".join(systems) + " | all-local spread |")
    L.append("|---|---|" + "---|" * len(systems) + "---|")
    for name, w in ws.items():
        t = w.get("lowest_ratio_within_80pct", {})
        cells = []
        for s in systems:
            if s not in w["systems"]:
                cells.append("n/a")
            else:
                v = t.get(s)
                cells.append("none" if v is None else f"**{v}%**")
        L.append(f"| {name} | {', '.join(str(x) + '%' for x in w['ratios'])} | " + " | ".join(cells)
                 + f" | {_num((w.get('all_local_spread') or 0) * 100, '{:.0f}')}% |")
    L.append("")
    # Per workload.
    for name, w in ws.items():
        L.append(f"### {name}")
        L.append("")
        L.append(w["description"] + ".")
        L.append("")
        L.append("Parameters: " + ", ".join(f"{k} {v}" for k, v in w["params"].items())
                 + f"; footprint {_mib(w.get('footprint_bytes'))} MiB ({w.get('footprint_source', '-')}).")
        if w.get("error"):
            L.append("")
            L.append(f"**{w['error']}**")
        L.append("")
        hdr = ["system", "local", "budget MiB", f"throughput ({w['throughput_unit']})", "× all-local", "× linux swap"]
        if w.get("has_latency"):
            hdr += ["p50 µs", "p99 µs", "p99 × swap"]
        hdr += ["far faults", "zero-fill faults", "moved MiB", "CPU s", "peak RSS MiB", "status"]
        L.append("| " + " | ".join(hdr) + " |")
        L.append("|" + "---|" * len(hdr))
        for r in w["runs"]:
            L.append(_cell_line(w, r))
        L.append("")
        for key in ["throughput"] + (["p99"] if w.get("has_latency") else []):
            p = os.path.join(PLOTS, f"{res['mode']}-{name}-{key}.png")
            if os.path.exists(p):
                L.append(f"![{name} {key}]({os.path.relpath(p, os.path.dirname(DOC))})")
        L.append("")
        L.append("Commands (the 50% runs; every run's command is in the JSON):")
        L.append("")
        shown = set()
        for r in w["runs"]:
            if r["system"] in shown or not r.get("command"):
                continue
            if r["system"] != "all-local" and r.get("ratio") not in (50, None):
                continue
            shown.add(r["system"])
            cmd = r["command"].replace(ROOT + "/", "")
            note = ""
            if r["system"] == "linux-swap":
                cg = (r.get("swap") or {}).get("cgroup") or {}
                z = r.get("zram") or {}
                note = (f" in a memory cgroup ({res['linux_swap']['cgroup']}) limited to {cg.get('limit_bytes')} "
                        f"bytes (the child joins it before exec), swap on {z.get('device', 'zram')} "
                        f"({_mib(z.get('disksize_bytes'))} MiB, {z.get('comp_algorithm', '?')})")
            L.append(f"* {r['system']}: `{cmd}`{note}")
        if w.get("memnode_command"):
            L.append(f"* the separate memnode: `{w['memnode_command'].replace(ROOT + '/', '')}`")
        L.append("")
    fails = [(name, r) for name, w in ws.items() for r in w["runs"] if not r.get("ok") and not r.get("skipped")]
    L.append("### Failures")
    L.append("")
    if not fails:
        L.append("None: every run completed and its data was verified.")
    for name, r in fails:
        err = (r.get("error") or "").replace("\n", " ")
        L.append(f"* {name}, {r['system']}, {r.get('ratio')}%: {err[:600]}")
        if r.get("command"):
            L.append(f"  Command: `{r['command'].replace(ROOT + '/', '')}`")
    L.append("")
    L.append(f"Reproduce: `cargo build --release && bash bench/harness/setup.sh && {res['command']}` "
             "(`make bench` / `make bench-quick`); plots: `bench/results/harness-plots/`.")
    L.append("")
    L.append(END)
    return "\n".join(L) + "\n"


def write_section(text, doc=DOC):
    """Replaces what lies between the markers (appending markers at the end if absent)."""
    try:
        with open(doc) as f:
            cur = f.read()
    except FileNotFoundError:
        cur = ""
    b, e = cur.find(BEGIN), cur.find(END)
    if b != -1 and e != -1 and e > b:
        new = cur[:b] + text.rstrip("\n") + cur[e + len(END):]
        if not new.endswith("\n"):
            new += "\n"
    else:
        new = cur.rstrip("\n") + ("\n\n" if cur else "") + text
    with open(doc, "w") as f:
        f.write(new)
    return doc


def render(primary=None, doc=DOC, make_plots=True):
    full = os.path.join(RESULTS, "harness-full.json")
    quick = os.path.join(RESULTS, "harness-quick.json")
    path = os.path.abspath(primary) if primary else (full if os.path.exists(full) else quick)
    if not os.path.exists(path):
        raise SystemExit(f"{path} is missing: run `make bench` or `make bench-quick` first")
    res = load(path)
    made = []
    if make_plots:
        made = plots(res)
        if path != quick and os.path.exists(quick):
            made += plots(load(quick))
    extra = quick if (path != quick and os.path.exists(quick)) else None
    write_section(section(res, path, extra), doc)
    log(f"wrote the harness section of {doc} from {path}; {len(made)} plots in {PLOTS}")
    return doc
