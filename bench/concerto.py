#!/usr/bin/env python3
"""Concerto benchmark: online-only, offline-only, naive priority co-serving and Concerto in one
run, on the CPU engine (real model, real KV checkpoints through gleaner far memory on a real
memnode when built) and in the simulator at the paper's scale (Llama-2 7B on an A100, modelled).

    python3 bench/concerto.py --quick      # a few minutes; prints one JSON object last
    python3 bench/concerto.py              # longer runs, rate sweep

SLOs are online-only's p99 TTFT and TPOT x 1.25, measured in the same run. Time on the engine is
the engine thread's CPU time (numpy limited to one thread: OMP/OPENBLAS_NUM_THREADS=1), so
other processes on a shared machine do not distort latencies; see docs/concerto.md.

The last line printed is a JSON object with slo_met, naive_slo_met, offline_fraction and
outputs_identical (the engine run), plus the simulator's headline ratios. The full results go
to bench/results/concerto/<name>.json.
"""

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "serve"))

from concerto.backend import select_backend, torch_cuda_available  # noqa: E402
from concerto.config import CONFIGS  # noqa: E402
from concerto.engine import Engine  # noqa: E402
from concerto.experiment import compare, engine_executor_factory, sim_executor_factory  # noqa: E402
from concerto.latency import RooflineLatency, profile_engine  # noqa: E402
from concerto.memnode import Memnode, find_memnode_bin  # noqa: E402
from concerto.store import FarStore, HostStore, find_libgleaner  # noqa: E402


def engine_workload(duration, rate):
    return {"seed": 11, "rate": rate, "cv": 1.0, "duration": duration, "on_prompt": (32, 96), "on_tokens": (16, 48),
            "offline_n": 4000, "off_prompt": (64, 192), "off_tokens": (16, 64)}


def sim_workload(duration, rate, cv=1.0, phases=None):
    w = {"seed": 21, "rate": rate, "cv": cv, "duration": duration, "on_prompt": 1024, "on_tokens": 128,
         "offline_n": 3000, "off_prompt": (512, 1024), "off_tokens": (128, 256), "vocab": 32000}
    if phases:
        w["phases"] = phases
    return w


def run_engine(args, log):
    backend = select_backend(args.backend)
    cfg = CONFIGS[args.model]
    engine = Engine(cfg, backend=backend, num_blocks=args.kv_blocks, block_size=16)
    log(f"engine: {args.model} model {cfg.to_dict()}, backend {backend.name}, {args.kv_blocks} KV blocks of 16 tokens")
    lat = profile_engine(engine, reps=3)
    log(f"profiled step latency: coef {[f'{c:.3g}' for c in lat.coef]} (median fit error {lat.fit_error():.0%})")
    memnode, stores = None, []
    if find_libgleaner() and find_memnode_bin():
        memnode = Memnode("1G")
        store_kind = f"far memory (gleaner region, memnode {memnode.addr})"

        def store_factory():
            s = FarStore(8192, 16, engine.cache.token_bytes, memnode=memnode.addr, token_file=memnode.token_file,
                         local_budget=4 << 20)
            stores.append(s)
            return s
    else:
        store_kind = "host memory (libgleaner.so or the memnode binary not built: far memory NOT used)"
        log("WARNING: " + store_kind)

        def store_factory():
            return HostStore(8192, 16, engine.cache.token_bytes)
    log(f"checkpoint store: {store_kind}")
    w = engine_workload(args.duration, args.rate)
    sys_kw = {"max_batch_tokens": 128, "max_batch_seqs": 64}
    try:
        res = compare(w, engine_executor_factory(engine, store_factory), lat, sys_kw, max_context=cfg.max_seq_len, log=log)
    finally:
        for s in stores:
            s.close()
        if memnode:
            memnode.stop()
    res.update({"workload": w, "system_config": sys_kw, "latency_model": lat.to_json(), "checkpoint_store": store_kind,
                "backend": backend.name, "model": cfg.to_dict()})
    return res


def run_sim(args, log):
    lat = RooflineLatency()
    kv_blocks = int((40e9 * 0.9 - 13.5e9) / lat.kv_bytes_per_token / 16)
    make = sim_executor_factory(lat, kv_blocks, 16)
    sys_kw = {"max_batch_tokens": 2048, "max_batch_seqs": 256}
    out = {"latency_model": lat.to_json(), "kv_blocks": kv_blocks, "system_config": sys_kw}
    d = args.sim_duration
    log(f"simulator: Llama-2 7B FP16 on A100-40G (roofline model), {kv_blocks} KV blocks; gamma 2 req/s CV 1, {d:.0f} s")
    out["gamma"] = compare(sim_workload(d, 2.0), make, lat, sys_kw, log=log)
    third = d / 3
    log(f"simulator: ON/OFF load ({third:.0f} s on at 3 req/s, {third:.0f} s off, {third:.0f} s on)")
    out["on_off"] = compare(sim_workload(d, 3.0, phases=[(third, True), (third, False), (third, True)]), make, lat, sys_kw, log=log)
    out["rate_sweep"] = {}
    for rate in args.sweep:
        log(f"simulator: rate sweep, {rate} req/s")
        out["rate_sweep"][str(rate)] = compare(sim_workload(d, rate), make, lat, sys_kw, log=log)
    for res in [out["gamma"], out["on_off"]] + list(out["rate_sweep"].values()):
        res["summary"]["outputs_identical"] = None  # the simulator makes no real tokens
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short runs (a few minutes in all)")
    ap.add_argument("--duration", type=float, help="seconds of engine time per system on the CPU engine")
    ap.add_argument("--rate", type=float, default=14.0, help="online requests per second on the CPU engine")
    ap.add_argument("--model", default="small", choices=sorted(CONFIGS))
    ap.add_argument("--backend", default="auto", help="numpy, torch (CUDA) or auto")
    ap.add_argument("--kv-blocks", type=int, default=320, help="KV blocks of 16 tokens (default 320: offline batching fills them, as it fills a GPU)")
    ap.add_argument("--sim-duration", type=float, help="simulated seconds per run")
    ap.add_argument("--no-sim", action="store_true", help="skip the simulator")
    ap.add_argument("--no-engine", action="store_true", help="skip the CPU engine (simulator only; no slo_met line)")
    ap.add_argument("--out", help="results file (default bench/results/concerto/{quick,full}.json)")
    args = ap.parse_args()
    args.duration = args.duration or (20.0 if args.quick else 60.0)
    args.sim_duration = args.sim_duration or (150.0 if args.quick else 600.0)
    args.sweep = [1.0, 3.0] if args.quick else [1.0, 2.0, 3.0, 4.0]

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    t0 = time.monotonic()
    results = {"command": " ".join(["python3", "bench/concerto.py"] + sys.argv[1:]),
               "commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
               "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
                        "numpy_threads": os.environ.get("OPENBLAS_NUM_THREADS"), "torch_cuda": torch_cuda_available()},
               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if not torch_cuda_available():
        log("NOTE: torch with CUDA is not available here: the PyTorch backend was NOT run; the engine runs on numpy")
    if not args.no_engine:
        results["engine"] = run_engine(args, log)
    if not args.no_sim:
        results["sim"] = run_sim(args, log)
    results["elapsed_s"] = time.monotonic() - t0
    out = Path(args.out).absolute() if args.out else ROOT / "bench" / "results" / "concerto" / ("quick.json" if args.quick else "full.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    line = {}
    if "engine" in results:
        es = results["engine"]["summary"]
        line = {"slo_met": es["slo_met"], "naive_slo_met": es["naive_slo_met"], "offline_fraction": es["offline_fraction"],
                "outputs_identical": es["outputs_identical"], "outputs_compared": es["outputs_compared"],
                "outputs_compared_preempted": es["outputs_compared_preempted"],
                "outputs_compared_restored": es["outputs_compared_restored"], "backend": results["engine"]["backend"]}
    line["results"] = str(out.relative_to(ROOT)) if out.resolve().is_relative_to(ROOT) else str(out)
    if "sim" in results:
        g = results["sim"]["gamma"]["summary"]
        line.update({"sim_slo_met": g["slo_met"], "sim_total_fraction_of_naive": g["total_fraction_of_naive"],
                     "sim_p99_ttft_vs_online_only": g["p99_ttft_vs_online_only"]})
    print(json.dumps(line))


if __name__ == "__main__":
    main()
