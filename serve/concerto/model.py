"""The decoder, executed one layer at a time over a batch of sequence chunks.

A step's input is a list of `SeqWork`: for each sequence, the tokens to process this step (a
prefill chunk, recomputed tokens, or the one token of a decode step) and where they sit. The
rows of all sequences are stacked into one matrix for the linear layers (continuous batching);
attention runs per sequence over its paged KV. Between layers the caller's safepoint may drop
sequences (layer-level preemption): their rows leave the batch and the remaining layers run
without them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import ModelConfig, make_weights, rope_tables
from .kvcache import PagedKVCache, slots_for


@dataclass
class SeqWork:
    """One sequence's share of a step: tokens[0] sits at position `start`."""

    key: object  # the request (or any hashable) this work belongs to
    tokens: list[int]
    start: int
    block_table: list[int]
    want_logits: bool = True  # whether the last row's next token is wanted

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


class Transformer:
    """Llama-style decoder weights on a backend, with the per-layer forward pass."""

    def __init__(self, cfg: ModelConfig, backend, weights: dict | None = None):
        self.cfg = cfg
        self.b = backend
        w = weights if weights is not None else make_weights(cfg)
        self.w = {k: backend.asarray(v) for k, v in w.items()}
        cos, sin = rope_tables(cfg)
        self.cos, self.sin = backend.asarray(cos), backend.asarray(sin)
        self.scale = 1.0 / float(np.sqrt(cfg.head_dim))
        self._ones = {}

    def ones_col(self, n):
        if n not in self._ones:
            self._ones[n] = self.b.ones((n, 1))
        return self._ones[n]

    def rmsnorm(self, x, weight):
        ms = self.b.matmul(x * x, self.ones_col(x.shape[-1])) * (1.0 / x.shape[-1])
        return x * self.b.rsqrt(ms + self.cfg.norm_eps) * weight

    def rope(self, x, pos_idx):
        """Rotates (tokens, heads, head_dim) by each token's position (rotate-half form)."""
        half = self.cfg.head_dim // 2
        cos = self.cos[pos_idx][:, None, :]
        sin = self.sin[pos_idx][:, None, :]
        rot = self.b.concat([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rot * sin

    def embed(self, tokens: list[int]):
        return self.w["embed"][self.b.index(tokens)]

    def layer(self, l: int, x, work: list[SeqWork], cache: PagedKVCache):
        """Layer `l` over stacked rows `x` (one row per token of `work`, in order)."""
        cfg, b, p = self.cfg, self.b, f"layers.{l}."
        T, H, KV, hd = x.shape[0], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        g = H // KV
        pos = np.concatenate([np.arange(s.start, s.end) for s in work])
        pos_idx = b.index(pos)
        h = self.rmsnorm(x, self.w[p + "attn_norm"])
        q = self.rope(b.matmul(h, self.w[p + "wq"]).reshape(T, H, hd), pos_idx)
        k = self.rope(b.matmul(h, self.w[p + "wk"]).reshape(T, KV, hd), pos_idx)
        v = b.matmul(h, self.w[p + "wv"]).reshape(T, KV, hd)
        write = b.index(np.concatenate([slots_for(s.block_table, s.start, s.end, cache.block_size) for s in work]))
        cache.k[l][write] = k
        cache.v[l][write] = v
        outs, r = [], 0
        for s in work:
            m = len(s.tokens)
            ctx = b.index(slots_for(s.block_table, 0, s.end, cache.block_size))
            outs.append(self.attend(q[r : r + m], cache.k[l][ctx], cache.v[l][ctx], s.start))
            r += m
        attn = b.concat(outs, axis=0).reshape(T, H * hd)
        x = x + b.matmul(attn, self.w[p + "wo"])
        h = self.rmsnorm(x, self.w[p + "ffn_norm"])
        gate = b.matmul(h, self.w[p + "w1"])
        up = b.matmul(h, self.w[p + "w3"])
        return x + b.matmul(gate * b.sigmoid(gate) * up, self.w[p + "w2"])

    def attend(self, q, K, V, start: int):
        """Causal grouped-query attention of m queries at positions start.. over L cached keys."""
        b, cfg = self.b, self.cfg
        m, H, hd = q.shape
        L, KV = K.shape[0], cfg.n_kv_heads
        g = H // KV
        # (m, H, hd) -> (KV, g*m, hd): the g query heads that share a KV head, stacked.
        qg = b.swap(q.reshape(m, KV, g, hd), 0, 1)  # (KV, m, g, hd)
        qg = b.swap(qg, 1, 2).reshape(KV, g * m, hd)
        kt = b.swap(b.swap(K, 0, 1), 1, 2)  # (KV, hd, L)
        scores = b.matmul(qg, kt) * self.scale  # (KV, g*m, L)
        qpos = np.tile(np.arange(start, start + m), g)  # row r of a group is query r % m
        mask = np.arange(L)[None, :] <= qpos[:, None]  # (g*m, L)
        scores = b.where(b.index(mask).bool() if b.name == "torch" else mask, scores, float("-inf"))
        e = b.exp(scores - b.max_last(scores))
        denom = b.matmul(e, self.ones_col(L))
        o = b.matmul(e, b.swap(V, 0, 1)) / denom  # (KV, g*m, hd)
        o = b.swap(o.reshape(KV, g, m, hd), 1, 2)  # (KV, m, g, hd)
        return b.swap(o, 0, 1).reshape(m, H, hd)

    def next_tokens(self, x_rows) -> np.ndarray:
        """Greedy next tokens of the given final hidden rows."""
        h = self.rmsnorm(x_rows, self.w["final_norm"])
        return self.b.argmax_last(self.b.matmul(h, self.w["lm_head"]))

    def logits(self, x_rows):
        h = self.rmsnorm(x_rows, self.w["final_norm"])
        return self.b.matmul(h, self.w["lm_head"])
