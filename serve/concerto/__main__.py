"""concerto: co-serving online and offline LLM requests on one engine (gleaner, issue 48).

Subcommands:
  serve      OpenAI-style HTTP endpoint (POST /v1/completions, POST /v1/batches, GET /health)
  batch      offline batch file: JSONL requests in, JSONL results out
  generate   greedy completion of one prompt (text or token ids)
  profile    measure the engine's step-latency table (JSON)
  simulate   the four systems in the discrete-event simulator (Llama-2 7B on an A100, modelled)

Run `python3 -m concerto <subcommand> --help` (with serve/ on PYTHONPATH, or from serve/).
The model is a small Llama-style decoder with weights it makes itself (no downloads); its output
is deterministic gibberish, which is all a scheduler needs.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):  # before numpy loads: one BLAS thread
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from .config import CONFIGS  # noqa: E402
from .engine import Engine  # noqa: E402
from .executor import EngineExecutor, WallClock  # noqa: E402
from .latency import RooflineLatency, profile_engine  # noqa: E402
from .policy import SLO, SystemConfig  # noqa: E402


def add_engine_args(p):
    p.add_argument("--model", default="small", choices=sorted(CONFIGS), help="model size (default small: 4 layers, dim 256)")
    p.add_argument("--backend", default="auto", help="numpy, torch (needs CUDA) or auto (default: torch if CUDA works, else numpy)")
    p.add_argument("--kv-blocks", type=int, default=1024, help="KV cache blocks of 16 tokens (default 1024)")


def add_sched_args(p):
    p.add_argument("--system", default="concerto", choices=["concerto", "naive"], help="scheduler (default concerto)")
    p.add_argument("--slo-ttft-ms", type=float, default=250.0, help="online p99 TTFT objective (default 250 ms)")
    p.add_argument("--slo-tpot-ms", type=float, default=50.0, help="online p99 TPOT objective (default 50 ms)")
    p.add_argument("--memnode", default="none",
                   help="where preempted offline requests' KV checkpoints go: none (host memory), spawn (start a "
                        "local gleaner memnode), or a memnode address HOST:PORT (with --token-file)")
    p.add_argument("--token-file", default=None, help="the memnode's token file")
    p.add_argument("--checkpoint", default="adaptive", choices=["off", "always", "adaptive"])


def build(args, clock):
    engine = Engine(CONFIGS[args.model], backend=args.backend, num_blocks=args.kv_blocks, block_size=16)
    latency = profile_engine(engine, reps=2)
    store, memnode = make_store(args, engine)
    ex = EngineExecutor(engine, clock, store)
    from .latency import CalibratedLatency
    from .scheduler import Scheduler

    system = SystemConfig.named(args.system, checkpoint=args.checkpoint)
    slo = SLO(args.slo_ttft_ms / 1e3, args.slo_tpot_ms / 1e3)
    return Scheduler(system, ex, clock, CalibratedLatency(latency), slo=slo, max_context=engine.cfg.max_seq_len), engine, store, memnode


def make_store(args, engine):
    from .store import FarStore, HostStore

    tb = engine.cache.token_bytes
    if args.memnode == "none":
        return HostStore(4096, 16, tb), None
    memnode = None
    addr, token = args.memnode, args.token_file
    if args.memnode == "spawn":
        from .memnode import Memnode

        memnode = Memnode("1G")
        addr, token = memnode.addr, memnode.token_file
    return FarStore(4096, 16, tb, memnode=addr, token_file=token), memnode


def cmd_serve(args):
    from .server import Service, serve_http

    sched, engine, store, memnode = build(args, WallClock())
    svc = Service(sched, f"concerto-{args.model}", engine.cfg.vocab_size).start()
    httpd = serve_http(svc, args.host, args.port)
    print(f"concerto: serving {args.model} on http://{httpd.server_address[0]}:{httpd.server_address[1]} "
          f"(backend {engine.backend.name}, system {args.system}, checkpoints in {store.name} memory)", file=sys.stderr, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        httpd.shutdown()
        svc.shutdown()
        store.close()
        if memnode:
            memnode.stop()


def cmd_batch(args):
    from .executor import VirtualClock
    from .server import BadRequest, run_batch_file

    sched, engine, store, memnode = build(args, VirtualClock())
    inp = sys.stdin if args.input == "-" else open(args.input)
    out = sys.stdout if args.output == "-" else open(args.output, "w")
    try:
        for rec in run_batch_file(sched, inp, engine.cfg.vocab_size, args.max_tokens):
            out.write(json.dumps(rec) + "\n")
    except BadRequest as e:
        print(f"concerto batch: {e}", file=sys.stderr)
        return 2
    finally:
        store.close()
        if memnode:
            memnode.stop()
    return 0


def cmd_generate(args):
    from .model import SeqWork
    from .server import decode_tokens, encode_text

    engine = Engine(CONFIGS[args.model], backend=args.backend, num_blocks=args.kv_blocks, block_size=16)
    prompt = [int(t) for t in args.prompt.split(",")] if args.tokens else encode_text(args.prompt)
    if len(prompt) + args.max_tokens > engine.cfg.max_seq_len:
        print(f"concerto: prompt plus max_tokens exceeds the context of {engine.cfg.max_seq_len}", file=sys.stderr)
        return 2
    alloc = engine.cache.allocator
    table = alloc.alloc(alloc.blocks_for(len(prompt) + args.max_tokens))
    out = [engine.run_step([SeqWork(0, prompt, 0, table)]).next_token[0]]
    while len(out) < args.max_tokens:
        out.append(engine.run_step([SeqWork(0, [out[-1]], len(prompt) + len(out) - 1, table)]).next_token[0])
    print(json.dumps({"tokens": out, "text": decode_tokens(out)}))
    return 0


def cmd_profile(args):
    engine = Engine(CONFIGS[args.model], backend=args.backend, num_blocks=args.kv_blocks, block_size=16)
    lat = profile_engine(engine, reps=3)
    print(json.dumps(lat.to_json(), indent=1))
    return 0


def cmd_simulate(args):
    from .experiment import compare, sim_executor_factory

    lat = RooflineLatency()
    kv_blocks = int((40e9 * 0.9 - 13.5e9) / lat.kv_bytes_per_token / 16)
    w = {"seed": args.seed, "rate": args.rate, "cv": args.cv, "duration": args.duration, "on_prompt": 1024, "on_tokens": 128,
         "offline_n": 3000, "off_prompt": (512, 1024), "off_tokens": (128, 256), "vocab": 32000}
    res = compare(w, sim_executor_factory(lat, kv_blocks, 16), lat, {"max_batch_tokens": 2048, "max_batch_seqs": 256},
                  log=lambda m: print(m, file=sys.stderr))
    print(json.dumps(res["summary"], indent=1))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m concerto", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("serve", help="OpenAI-style HTTP endpoint")
    add_engine_args(p)
    add_sched_args(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.set_defaults(fn=cmd_serve)
    p = sub.add_parser("batch", help="offline JSONL batch: one {\"prompt\", \"max_tokens\", \"id\"} per line")
    add_engine_args(p)
    add_sched_args(p)
    p.add_argument("--input", default="-", help="JSONL requests (default stdin)")
    p.add_argument("--output", default="-", help="JSONL results, input order (default stdout)")
    p.add_argument("--max-tokens", type=int, default=16, help="default max_tokens per request")
    p.set_defaults(fn=cmd_batch)
    p = sub.add_parser("generate", help="greedy completion of one prompt")
    add_engine_args(p)
    p.add_argument("prompt", help="text, or comma-separated token ids with --tokens")
    p.add_argument("--tokens", action="store_true")
    p.add_argument("--max-tokens", type=int, default=16)
    p.set_defaults(fn=cmd_generate)
    p = sub.add_parser("profile", help="measure the step-latency table")
    add_engine_args(p)
    p.set_defaults(fn=cmd_profile)
    p = sub.add_parser("simulate", help="simulator at the paper's scale (modelled Llama-2 7B on A100)")
    p.add_argument("--rate", type=float, default=2.0)
    p.add_argument("--cv", type=float, default=1.0)
    p.add_argument("--duration", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=21)
    p.set_defaults(fn=cmd_simulate)
    args = ap.parse_args(argv)
    return args.fn(args) or 0


if __name__ == "__main__":
    sys.exit(main())
