"""Clocks and executors: what runs a batch step for the scheduler, and what time it is.

* `WallClock`: real time (the HTTP server).
* `VirtualClock`: time that advances only when told to. Trace replay on the real engine
  advances it by the engine thread's CPU time per layer (`EngineExecutor`), so the schedule and
  the latencies are those of the real computation, undisturbed by other processes sharing the
  machine; idle gaps jump to the next arrival. The simulator advances it by the latency model.
* `EngineExecutor`: the real engine; KV checkpoints go to a `KVStore`.
* `SimExecutor`: the discrete-event simulator's stand-in: a step costs what the latency model
  predicts, split evenly over the layers; checkpoint restores cost their bytes over PCIe.
"""

from __future__ import annotations

import time

from .engine import StepOutcome
from .kvcache import BlockAllocator
from .latency import BatchShape, LatencyModel


class WallClock:
    virtual = False

    def now(self) -> float:
        return time.monotonic()

    def charge(self, dt: float) -> None:
        pass  # real time passes by itself


class VirtualClock:
    virtual = True

    def __init__(self, t: float = 0.0):
        self.t = t

    def now(self) -> float:
        return self.t

    def charge(self, dt: float) -> None:
        self.t += max(dt, 0.0)

    def advance_to(self, t: float) -> None:
        self.t = max(self.t, t)


class EngineExecutor:
    """Runs steps on the real engine; `store` (optional) keeps checkpoints."""

    def __init__(self, engine, clock, store=None):
        self.engine = engine
        self.clock = clock
        self.store = store
        self.allocator = engine.cache.allocator
        self.n_layers = engine.n_layers
        self.busy = 0.0  # engine time spent in steps
        self.restore_s_per_token = 5e-6  # updated from the restores done

    def run(self, work, safepoint) -> StepOutcome:
        last = [time.thread_time()]
        t0 = last[0]

        def observer(layer, x, w):
            now = time.thread_time()
            self.clock.charge(now - last[0])
            last[0] = now

        out = self.engine.run_step(work, safepoint=safepoint, observer=observer)
        now = time.thread_time()
        self.clock.charge(now - last[0])  # sampling the last row's token
        self.busy += now - t0
        return out

    def save(self, req, start: int, end: int) -> None:
        """Checkpoints the KV of positions [start, end) of `req` (incremental, 6.4.4)."""
        data = self.engine.cache.read_tokens(req.blocks, start, end)
        self.store.put(req.ckpt, start, data.reshape(end - start, -1))

    def load(self, req) -> None:
        """Restores `req.ckpt_tokens` tokens of KV from the store into `req.blocks`."""
        t0 = time.monotonic()
        c = self.engine.cache
        row = (c.n_layers, 2) + c.kv_shape
        c.write_tokens(req.blocks, 0, self.store.get(req.ckpt, req.ckpt_tokens, row))
        dt = time.monotonic() - t0
        self.clock.charge(dt)  # a synchronous restore stalls the engine
        self.busy += dt
        if req.ckpt_tokens:
            self.restore_s_per_token += 0.2 * (dt / req.ckpt_tokens - self.restore_s_per_token)

    def release(self, req) -> None:
        if self.store is not None and req.ckpt is not None:
            self.store.release(req.ckpt)


class SimExecutor:
    """A step costs `latency.estimate(shape)`, charged layer by layer to a `VirtualClock`."""

    def __init__(self, latency: LatencyModel, clock: VirtualClock, num_blocks: int, block_size: int, vocab: int = 32000):
        self.latency = latency
        self.clock = clock
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.n_layers = latency.n_layers
        self.store = True  # checkpoints are bookkeeping only
        self.vocab = vocab
        self.busy = 0.0
        self.kv_bytes_per_token = getattr(latency, "kv_bytes_per_token", 0)
        self.pcie = getattr(latency, "pcie", 3.2e10)
        self.restore_s_per_token = self.kv_bytes_per_token / self.pcie

    def run(self, work, safepoint) -> StepOutcome:
        out = StepOutcome()
        work = list(work)
        for layer in range(self.n_layers):
            shape = BatchShape.of((len(s.tokens), s.start) for s in work)
            dt = self.latency.estimate(shape) / self.n_layers
            self.clock.charge(dt)
            self.busy += dt
            out.layers_run = layer + 1
            if layer < self.n_layers - 1:
                drop = safepoint(layer)
                if drop:
                    out.dropped += [s.key for s in work if s.key in drop]
                    work = [s for s in work if s.key not in drop]
                    if not work:
                        return out
        for s in work:
            out.completed.append(s.key)
            if s.want_logits:
                out.next_token[s.key] = (s.end * 7919) % self.vocab  # content is irrelevant here
        return out

    def save(self, req, start: int, end: int) -> None:
        pass  # asynchronous copy, overlapped with compute (6.4.4)

    def load(self, req) -> None:
        dt = req.ckpt_tokens * self.kv_bytes_per_token / self.pcie
        self.clock.charge(dt)
        self.busy += dt

    def release(self, req) -> None:
        pass
