"""Step-latency models: what one batch step costs, from the profiler or from hardware figures.

A batch step is summarised by its `BatchShape`: tokens computed, sequences in the batch, keys
read by attention (the sum of each sequence's context length) and query-key pairs (the sum over
sequences of chunk length times context length). Two models:

* `ProfiledLatency`: the engine's own measured step latencies on a grid of batch shapes
  (`profile_engine`), kept as a table and fitted by least squares to
  `t = a + b*tokens + c*seqs + d*keys + e*pairs` (coefficients kept non-negative) so that it
  predicts shapes between and beyond the grid points (the dissertation's offline profiler, 6.4.5).
* `RooflineLatency`: Llama-2 7B in FP16 on one A100-40G, from the published hardware figures
  (weights read once per step from HBM, or compute-bound past the ridge; KV reads; a fixed
  per-step overhead). It is a model, not a measurement, used to replay the paper's experiments
  at their scale in the simulator.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BatchShape:
    tokens: int = 0
    seqs: int = 0
    keys: int = 0
    pairs: int = 0

    @staticmethod
    def of(items) -> "BatchShape":
        """From (num_tokens, start_position) pairs: each chunk attends to start+num keys."""
        t = s = k = p = 0
        for n, start in items:
            if n <= 0:
                continue
            L = start + n
            t, s, k, p = t + n, s + 1, k + L, p + n * L
        return BatchShape(t, s, k, p)

    def __add__(self, o: "BatchShape") -> "BatchShape":
        return BatchShape(self.tokens + o.tokens, self.seqs + o.seqs, self.keys + o.keys, self.pairs + o.pairs)

    def features(self) -> list[float]:
        return [1.0, self.tokens, self.seqs, self.keys, self.pairs]


class LatencyModel:
    """Predicts a step's latency (seconds) from its shape."""

    n_layers: int = 1
    name = "model"

    def estimate(self, shape: BatchShape) -> float:
        raise NotImplementedError

    def max_tokens_within(self, base: BatchShape, target: float, start: int, limit: int, new_seq: bool) -> int:
        """The most tokens of one more chunk (at position `start`, a new sequence in the batch
        if `new_seq`) that keep the step of `base` plus the chunk within `target` seconds."""
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            extra = BatchShape(mid, 1 if new_seq else 0, start + mid, mid * (start + mid))
            if self.estimate(base + extra) <= target:
                lo = mid
            else:
                hi = mid - 1
        return lo


class ProfiledLatency(LatencyModel):
    """The engine's measured table, with a non-negative least-squares fit over it."""

    name = "profiled"

    def __init__(self, coef, table, n_layers: int, source: str = ""):
        self.coef = [float(c) for c in coef]
        self.table = table  # [[tokens, seqs, keys, pairs, seconds], ...]
        self.n_layers = n_layers
        self.source = source

    @classmethod
    def fit(cls, table, n_layers: int, source: str = "") -> "ProfiledLatency":
        X = np.array([BatchShape(*map(int, r[:4])).features() for r in table], dtype=np.float64)
        y = np.array([r[4] for r in table], dtype=np.float64)
        active = list(range(X.shape[1]))
        while True:  # drop features whose coefficient comes out negative, refit
            c, *_ = np.linalg.lstsq(X[:, active], y, rcond=None)
            neg = [active[i] for i, v in enumerate(c) if v < 0]
            if not neg:
                break
            active = [a for a in active if a not in neg]
        coef = np.zeros(X.shape[1])
        coef[active] = c
        return cls(coef, table, n_layers, source)

    def estimate(self, shape: BatchShape) -> float:
        return float(np.dot(self.coef, shape.features())) if shape.tokens else 0.0

    def fit_error(self) -> float:
        """Median relative error of the fit over the measured table."""
        errs = [abs(self.estimate(BatchShape(*map(int, r[:4]))) - r[4]) / r[4] for r in self.table]
        return float(np.median(errs))

    def to_json(self) -> dict:
        return {"kind": "profiled", "coef": self.coef, "table": self.table, "n_layers": self.n_layers, "source": self.source}

    @classmethod
    def from_json(cls, d: dict) -> "ProfiledLatency":
        return cls(d["coef"], d["table"], d["n_layers"], d.get("source", ""))


class RooflineLatency(LatencyModel):
    """Llama-2 7B FP16 on one A100-40G, from hardware figures (see the module doc)."""

    name = "llama2-7b-a100"

    def __init__(
        self,
        params=6.74e9,
        n_layers=32,
        hidden=4096,
        hbm_bytes_per_s=1.3e12,  # effective, of 1.555 TB/s peak
        flops_per_s=1.9e14,  # effective dense FP16, of 312 TFLOPS peak
        step_overhead_s=0.003,  # scheduler and launch overhead per step
        kv_bytes_per_token=2 * 32 * 4096 * 2,
        pcie_bytes_per_s=3.2e10,
    ):
        self.params, self.n_layers, self.hidden = params, n_layers, hidden
        self.bw, self.flops, self.overhead = hbm_bytes_per_s, flops_per_s, step_overhead_s
        self.kv_bytes_per_token = kv_bytes_per_token
        self.pcie = pcie_bytes_per_s

    def estimate(self, shape: BatchShape) -> float:
        if not shape.tokens:
            return 0.0
        weights = max(2 * self.params / self.bw, 2 * self.params * shape.tokens / self.flops)
        kv = shape.keys * self.kv_bytes_per_token / self.bw
        attn = shape.pairs * 4 * self.hidden * self.n_layers / self.flops
        return self.overhead + weights + kv + attn

    def to_json(self) -> dict:
        return {"kind": "roofline", "name": self.name, "n_layers": self.n_layers, "params": self.params,
                "hbm_bytes_per_s": self.bw, "flops_per_s": self.flops, "step_overhead_s": self.overhead,
                "kv_bytes_per_token": self.kv_bytes_per_token, "pcie_bytes_per_s": self.pcie}


def profile_engine(engine, reps: int = 3, max_tokens: int = 256, clock=time.thread_time) -> ProfiledLatency:
    """Measures step latency of `engine` over a grid of decode, prefill and mixed batches.

    Uses `clock` (the thread's CPU time by default: other processes on a shared machine do not
    inflate it). The KV contents are whatever the cache holds: latency does not depend on them.
    """
    from .model import SeqWork

    alloc = engine.cache.allocator
    max_ctx = engine.cfg.max_seq_len
    shapes = []
    for seqs in (1, 2, 4, 8, 16, 32):
        for ctx in (16, 128, min(384, max_ctx - 1)):
            shapes.append([(1, ctx)] * seqs)
    for m in (8, 32, 64, 128, max_tokens):
        for start in (0, 128):
            if start + m <= max_ctx:
                shapes.append([(m, start)])
    for m in (32, 128):
        shapes.append([(m, 0)] + [(1, 100)] * 8)
    table = []
    for items in shapes:
        need = sum(alloc.blocks_for(n + s) for n, s in items)
        if need > alloc.num_free:
            continue
        tables = [alloc.alloc(alloc.blocks_for(n + s)) for n, s in items]
        work = [SeqWork(i, [1] * n, s, t) for i, ((n, s), t) in enumerate(zip(items, tables))]
        engine.run_step(work)  # warm
        best = float("inf")
        for _ in range(reps):
            t0 = clock()
            engine.run_step(work)
            best = min(best, clock() - t0)
        for t in tables:
            alloc.free(t)
        sh = BatchShape.of(items)
        table.append([sh.tokens, sh.seqs, sh.keys, sh.pairs, best])
    return ProfiledLatency.fit(table, engine.n_layers, source=f"{engine.backend.name} engine, {json.dumps(engine.cfg.to_dict())}")


def load_latency(d: dict) -> LatencyModel:
    if d["kind"] == "profiled":
        return ProfiledLatency.from_json(d)
    kw = {k: v for k, v in d.items() if k not in ("kind", "name")}
    return RooflineLatency(**kw)


class CalibratedLatency(LatencyModel):
    """A latency model scaled by how the last steps actually compared with its estimates.

    The profile is measured on an idle engine with a synthetic grid; real batches (scattered
    KV, warm or cold caches) run somewhat differently, and the budget must hold for them. The
    factor follows the ratio actual / estimated of each completed step, rising fast (weight
    `up`) and falling slowly (weight `down`), so it tracks the upper range of the ratio rather
    than its mean; clipped to [0.5, 4]."""

    def __init__(self, base: LatencyModel, up: float = 0.3, down: float = 0.03):
        self.base, self.up, self.down, self.factor = base, up, down, 1.0
        self.n_layers = base.n_layers
        self.name = base.name

    def estimate(self, shape: BatchShape) -> float:
        return self.factor * self.base.estimate(shape)

    def observe(self, shape: BatchShape, seconds: float) -> None:
        est = self.base.estimate(shape)
        if est > 0 and seconds > 0:
            ratio = min(max(seconds / est, 0.5), 4.0)
            w = self.up if ratio > self.factor else self.down
            self.factor += w * (ratio - self.factor)
