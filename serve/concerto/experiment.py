"""The four systems in one run, on the real engine or in the simulator, and their metrics.

`run_system` replays one workload (online gamma arrivals plus an offline backlog) through one
system on a virtual clock and summarises it. `compare` runs online-only first (its p99 TTFT and
TPOT x 1.25 become the SLOs), then offline-only, naive priority co-serving and Concerto, all on
the same workload, and computes the ratios the targets name.
"""

from __future__ import annotations

import time

import numpy as np

from .executor import EngineExecutor, SimExecutor, VirtualClock
from .latency import CalibratedLatency
from .policy import CONCERTO, NAIVE, OFFLINE_ONLY, ONLINE_ONLY, SLO, SystemConfig
from .request import FAILED, OFFLINE, ONLINE
from .scheduler import Scheduler
from .workload import gamma_arrivals, make_requests, on_off_arrivals


def p99(xs):
    return float(np.percentile(xs, 99)) if xs else None


def build_workload(w: dict, online: bool, offline: bool):
    """Fresh request objects for workload spec `w` (same seeds: same prompts in every run)."""
    rng = np.random.default_rng(w["seed"])
    if "phases" in w:
        times = on_off_arrivals(w["rate"], w["cv"], w["phases"], rng)
    else:
        times = gamma_arrivals(w["rate"], w["cv"], w["duration"], rng)
    onl = make_requests(times, ONLINE, w["on_prompt"], w["on_tokens"], rng, w.get("vocab", 256)) if online else []
    rng_off = np.random.default_rng(w["seed"] + 1000)
    offl = make_requests([0.0] * w["offline_n"], OFFLINE, w["off_prompt"], w["off_tokens"], rng_off, w.get("vocab", 256)) if offline else []
    for i, r in enumerate(offl):
        r.rid = f"offline-{i}"
    return onl, offl


def run_system(name: str, w: dict, make_executor, latency, slo: SLO | None, sys_kw: dict, max_context=None) -> dict:
    online = name != OFFLINE_ONLY
    offline = name != ONLINE_ONLY
    onl, offl = build_workload(w, online, offline)
    clock = VirtualClock()
    ex = make_executor(clock)
    lat = CalibratedLatency(latency)
    sched = Scheduler(SystemConfig.named(name, **sys_kw), ex, clock, lat, slo=slo, max_context=max_context)
    horizon = w["duration"]
    t0 = time.monotonic()
    sched.run_trace(onl + offl, stop=lambda s: s.clock.now() >= horizon and all(r.done for r in onl))
    wall = time.monotonic() - t0
    done_on = [r for r in onl if r.done and r.state != FAILED]
    on_tokens = sum(sum(1 for t in r.token_times if t <= horizon) for r in onl)
    off_tokens = sum(sum(1 for t in r.token_times if t <= horizon) for r in offl)
    ttfts = [r.ttft for r in done_on]
    tpots = [r.tpot for r in done_on if r.tpot is not None]
    res = {
        "system": name,
        "online_requests": len(onl),
        "online_finished": len(done_on),
        "p99_ttft_s": p99(ttfts),
        "p99_tpot_s": p99(tpots),
        "mean_ttft_s": float(np.mean(ttfts)) if ttfts else None,
        "online_tok_per_s": on_tokens / horizon,
        "offline_tok_per_s": off_tokens / horizon,
        "total_tok_per_s": (on_tokens + off_tokens) / horizon,
        "busy_fraction": min(ex.busy / max(clock.now(), 1e-9), 1.0),
        "busy_s": ex.busy,
        "virtual_s": clock.now(),
        "wall_s": wall,
        "steps": sched.steps,
        "latency_calibration": lat.factor,
        "offline_failed": sum(1 for r in offl if r.state == FAILED),
        "offline_preempted_requests": sum(1 for r in offl if r.preemptions),
        "offline_restored_requests": sum(1 for r in offl if r.restores),
        "stats": dict(sched.stats),
    }
    if slo is not None and ttfts:
        res["slo_met"] = res["p99_ttft_s"] <= slo.ttft and (res["p99_tpot_s"] or 0) <= slo.tpot
        res["ttft_attainment"] = float(np.mean([t <= slo.ttft for t in ttfts]))
        res["tpot_attainment"] = float(np.mean([t <= slo.tpot for t in tpots])) if tpots else None
    res["_offline_outputs"] = {r.rid: list(r.output) for r in offl if r.state != FAILED and len(r.output) == r.max_tokens}
    res["_offline_touched"] = {r.rid for r in offl if r.preemptions}
    res["_offline_restored"] = {r.rid for r in offl if r.restores}
    return res


def compare(w: dict, make_executor, latency, sys_kw: dict, slo_factor: float = 1.25, max_context=None, log=print) -> dict:
    """Online-only, offline-only, naive and Concerto on workload `w`; SLOs from online-only."""
    out = {}
    base = run_system(ONLINE_ONLY, w, make_executor, latency, None, sys_kw, max_context)
    slo = SLO(base["p99_ttft_s"] * slo_factor, base["p99_tpot_s"] * slo_factor)
    log(f"  online-only: p99 TTFT {base['p99_ttft_s']*1e3:.1f} ms, p99 TPOT {base['p99_tpot_s']*1e3:.2f} ms, busy {base['busy_fraction']:.2f} -> SLO {slo.ttft*1e3:.1f} / {slo.tpot*1e3:.2f} ms")
    out[ONLINE_ONLY] = base
    for name in (OFFLINE_ONLY, NAIVE, CONCERTO):
        r = run_system(name, w, make_executor, latency, slo if name != OFFLINE_ONLY else None, sys_kw, max_context)
        if name != OFFLINE_ONLY:
            r["slo_met"] = r["p99_ttft_s"] <= slo.ttft and r["p99_tpot_s"] <= slo.tpot
        out[name] = r
        ttft = f"{r['p99_ttft_s']*1e3:.1f} ms" if r["p99_ttft_s"] is not None else "-"
        tpot = f"{r['p99_tpot_s']*1e3:.2f} ms" if r["p99_tpot_s"] is not None else "-"
        log(f"  {name}: p99 TTFT {ttft}, p99 TPOT {tpot}, offline {r['offline_tok_per_s']:.0f} tok/s, total {r['total_tok_per_s']:.0f} tok/s (wall {r['wall_s']:.1f} s)")
    off, con, nai = out[OFFLINE_ONLY], out[CONCERTO], out[NAIVE]
    spare = off["offline_tok_per_s"] * (1.0 - base["busy_fraction"])
    ref = off["_offline_outputs"]
    common = [k for k in con["_offline_outputs"] if k in ref]
    touched = [k for k in common if k in con["_offline_touched"]]
    restored = [k for k in common if k in con["_offline_restored"] or k in off["_offline_restored"]]
    summary = {
        "slo": {"ttft_s": slo.ttft, "tpot_s": slo.tpot, "factor": slo_factor},
        "slo_met": bool(con["slo_met"]),
        "naive_slo_met": bool(nai["slo_met"]),
        "spare_capacity_tok_per_s": spare,
        "offline_fraction": con["offline_tok_per_s"] / spare if spare > 0 else None,
        "offline_fraction_of_naive": con["offline_tok_per_s"] / nai["offline_tok_per_s"] if nai["offline_tok_per_s"] else None,
        "total_fraction_of_naive": con["total_tok_per_s"] / nai["total_tok_per_s"] if nai["total_tok_per_s"] else None,
        "p99_ttft_vs_online_only": con["p99_ttft_s"] / base["p99_ttft_s"],
        "p99_tpot_vs_online_only": con["p99_tpot_s"] / base["p99_tpot_s"],
        "naive_p99_ttft_vs_online_only": nai["p99_ttft_s"] / base["p99_ttft_s"],
        "naive_p99_tpot_vs_online_only": nai["p99_tpot_s"] / base["p99_tpot_s"],
        "outputs_compared": len(common),
        "outputs_compared_preempted": len(touched),
        "outputs_compared_restored": len(restored),  # restored from a checkpoint in either run
        "outputs_identical": bool(common) and all(con["_offline_outputs"][k] == ref[k] for k in common),
    }
    for r in out.values():
        r.pop("_offline_outputs", None)
        r.pop("_offline_touched", None)
        r.pop("_offline_restored", None)
    return {"systems": out, "summary": summary}


def engine_executor_factory(engine, store_factory=None):
    def make(clock):
        engine.reset_cache()
        return EngineExecutor(engine, clock, store_factory() if store_factory else None)
    return make


def sim_executor_factory(latency, num_blocks, block_size):
    return lambda clock: SimExecutor(latency, clock, num_blocks, block_size)
