"""A straightforward reference decoder, for tests: one sequence, no cache, float64, loops.

Every step recomputes the whole sequence with the textbook formulas, head by head. It shares
nothing with `model.py` but the weights (and the RoPE convention, rotate-half, which it writes
out itself).
"""

from __future__ import annotations

import numpy as np

from .config import ModelConfig, make_weights


class ReferenceDecoder:
    def __init__(self, cfg: ModelConfig, weights: dict | None = None):
        self.cfg = cfg
        w = weights if weights is not None else make_weights(cfg)
        self.w = {k: v.astype(np.float64) for k, v in w.items()}

    def _rmsnorm(self, x, weight):
        out = np.empty_like(x)
        for i, row in enumerate(x):
            rms = np.sqrt(np.mean(row * row) + self.cfg.norm_eps)
            out[i] = row / rms * weight
        return out

    def _rope(self, vec, pos):
        hd = vec.shape[-1]
        half = hd // 2
        out = np.empty_like(vec)
        for i in range(half):
            theta = pos / (self.cfg.rope_theta ** (2 * i / hd))
            c, s = np.cos(theta), np.sin(theta)
            a, b = vec[i], vec[i + half]
            out[i] = a * c - b * s
            out[i + half] = b * c + a * s
        return out

    def hidden_states(self, tokens: list[int]) -> list[np.ndarray]:
        """Hidden states after each layer, (len(tokens), dim) each."""
        cfg, w = self.cfg, self.w
        hd, H, KV = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
        n = len(tokens)
        x = np.stack([w["embed"][t] for t in tokens])
        states = []
        for l in range(cfg.n_layers):
            p = f"layers.{l}."
            h = self._rmsnorm(x, w[p + "attn_norm"])
            q = (h @ w[p + "wq"]).reshape(n, H, hd)
            k = (h @ w[p + "wk"]).reshape(n, KV, hd)
            v = (h @ w[p + "wv"]).reshape(n, KV, hd)
            for t in range(n):
                for hh in range(H):
                    q[t, hh] = self._rope(q[t, hh], t)
                for kh in range(KV):
                    k[t, kh] = self._rope(k[t, kh], t)
            attn = np.zeros((n, H, hd))
            for hh in range(H):
                kh = hh // (H // KV)  # grouped-query: consecutive query heads share a KV head
                for t in range(n):
                    scores = np.array([q[t, hh] @ k[j, kh] for j in range(t + 1)]) / np.sqrt(hd)
                    p_ = np.exp(scores - scores.max())
                    p_ /= p_.sum()
                    attn[t, hh] = sum(p_[j] * v[j, kh] for j in range(t + 1))
            x = x + attn.reshape(n, H * hd) @ w[p + "wo"]
            h = self._rmsnorm(x, w[p + "ffn_norm"])
            gate = h @ w[p + "w1"]
            silu = gate / (1.0 + np.exp(-gate))
            x = x + (silu * (h @ w[p + "w3"])) @ w[p + "w2"]
            states.append(x.copy())
        return states

    def logits(self, tokens: list[int]) -> np.ndarray:
        x = self.hidden_states(tokens)[-1]
        return self._rmsnorm(x, self.w["final_norm"]) @ self.w["lm_head"]

    def generate(self, prompt: list[int], n: int) -> list[int]:
        seq, out = list(prompt), []
        for _ in range(n):
            tok = int(np.argmax(self.logits(seq)[-1]))
            out.append(tok)
            seq.append(tok)
        return out
