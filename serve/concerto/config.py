"""Model configurations and the deterministic weights a model makes for itself."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-style decoder: RMSNorm, rotary positions, grouped-query attention, SwiGLU."""

    vocab_size: int = 256
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int = 2
    ffn_dim: int = 704
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    seed: int = 48

    def __post_init__(self):
        if self.dim % self.n_heads:
            raise ValueError("dim must be a multiple of n_heads")
        if self.n_heads % self.n_kv_heads:
            raise ValueError("n_heads must be a multiple of n_kv_heads (grouped-query attention)")
        if (self.dim // self.n_heads) % 2:
            raise ValueError("the head dimension must be even (rotary positions rotate pairs)")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)


# The test model: small enough that the whole test suite stays fast.
TINY = ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=256)
# The benchmark model on the CPU (about 3.3 M parameters).
SMALL = ModelConfig()

CONFIGS = {"tiny": TINY, "small": SMALL}


def make_weights(cfg: ModelConfig) -> dict:
    """Deterministic float32 weights from `cfg.seed` (no downloads), as numpy arrays.

    Linear weights are stored (in_features, out_features) so a layer is `x @ W`. Scales follow
    1/sqrt(fan_in) so activations stay O(1) through the layers.
    """
    rng = np.random.default_rng(cfg.seed)
    hd = cfg.head_dim

    def lin(n_in, n_out):
        return (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"embed": rng.standard_normal((cfg.vocab_size, cfg.dim)).astype(np.float32)}
    for layer in range(cfg.n_layers):
        p = f"layers.{layer}."
        w[p + "attn_norm"] = norm(cfg.dim)
        w[p + "wq"] = lin(cfg.dim, cfg.n_heads * hd)
        w[p + "wk"] = lin(cfg.dim, cfg.n_kv_heads * hd)
        w[p + "wv"] = lin(cfg.dim, cfg.n_kv_heads * hd)
        w[p + "wo"] = lin(cfg.n_heads * hd, cfg.dim)
        w[p + "ffn_norm"] = norm(cfg.dim)
        w[p + "w1"] = lin(cfg.dim, cfg.ffn_dim)  # gate
        w[p + "w3"] = lin(cfg.dim, cfg.ffn_dim)  # up
        w[p + "w2"] = lin(cfg.ffn_dim, cfg.dim)  # down
    w["final_norm"] = norm(cfg.dim)
    w["lm_head"] = lin(cfg.dim, cfg.vocab_size)
    return w


def rope_tables(cfg: ModelConfig):
    """cos and sin tables, (max_seq_len, head_dim), for the rotate-half form of RoPE."""
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    ang = np.outer(np.arange(cfg.max_seq_len, dtype=np.float64), inv)
    ang = np.concatenate([ang, ang], axis=1)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
