"""The engine: the model and its paged KV cache, running one batch step layer by layer.

Between layers it calls the scheduler's safepoint (layer-level preemption, dissertation 6.4.3):
the safepoint returns the keys of sequences to drop, whose rows then leave the batch. A dropped
sequence's KV writes of this step sit beyond its committed length and are simply overwritten
when it runs again; nothing else needs undoing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .backend import select_backend
from .config import ModelConfig
from .kvcache import PagedKVCache
from .model import SeqWork, Transformer


@dataclass
class StepOutcome:
    next_token: dict = field(default_factory=dict)  # key -> greedy next token (want_logits rows)
    dropped: list = field(default_factory=list)  # keys dropped at a safepoint
    layers_run: int = 0
    completed: list = field(default_factory=list)  # keys whose work ran through every layer


class Engine:
    """A model instance with its KV cache; `run_step` executes one continuous-batching step."""

    def __init__(self, cfg: ModelConfig, backend="numpy", num_blocks: int = 256, block_size: int = 16):
        self.cfg = cfg
        self.backend = select_backend(backend) if isinstance(backend, str) else backend
        self.model = Transformer(cfg, self.backend)
        self.cache = PagedKVCache(self.backend, cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, num_blocks, block_size)

    def reset_cache(self) -> None:
        """Frees every KV block (between independent runs sharing one engine)."""
        c = self.cache
        c.allocator = type(c.allocator)(c.allocator.num_blocks, c.allocator.block_size)

    @property
    def n_layers(self) -> int:
        return self.cfg.n_layers

    def run_step(self, work: list[SeqWork], safepoint=None, observer=None) -> StepOutcome:
        """Runs `work` through every layer; `safepoint(layer)` after each layer but the last may
        return keys to drop. `observer(layer, x, work)` sees the hidden rows (for tests)."""
        out = StepOutcome()
        if not work:
            return out
        for s in work:
            if s.end > self.cfg.max_seq_len:
                raise ValueError(f"position {s.end} beyond the model's context of {self.cfg.max_seq_len}")
        work = list(work)
        x = self.model.embed([t for s in work for t in s.tokens])
        for l in range(self.cfg.n_layers):
            x = self.model.layer(l, x, work, self.cache)
            out.layers_run = l + 1
            if observer is not None:
                observer(l, x, work)
            if safepoint is not None and l < self.cfg.n_layers - 1:
                drop = safepoint(l)
                if drop:
                    x, work = self._drop(x, work, drop, out)
                    if not work:
                        return out
        rows, keys, r = [], [], 0
        for s in work:
            r += len(s.tokens)
            out.completed.append(s.key)
            if s.want_logits:
                rows.append(r - 1)
                keys.append(s.key)
        if rows:
            toks = self.model.next_tokens(x[self.backend.index(rows)])
            out.next_token = {k: int(t) for k, t in zip(keys, toks)}
        return out

    def _drop(self, x, work, drop, out):
        keep_rows, kept, r = [], [], 0
        for s in work:
            m = len(s.tokens)
            if s.key in drop:
                out.dropped.append(s.key)
            else:
                keep_rows.extend(range(r, r + m))
                kept.append(s)
            r += m
        if not kept:
            return x, kept
        return x[self.backend.index(keep_rows)], kept


class StepTimer:
    """Engine-time clock: CPU time of the calling thread, so that other processes on a shared
    machine do not stretch measured step latencies (used by trace replay and the profiler)."""

    @staticmethod
    def now() -> float:
        return time.thread_time()
