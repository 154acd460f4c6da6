"""Tensor backends: one model code path over numpy (CPU) and PyTorch (CUDA).

The model (`model.py`) and the paged KV cache (`kvcache.py`) call only the methods below and the
operators both array types share (`+`, `*`, `@`, slicing, `reshape`). `select_backend("auto")`
picks PyTorch when `torch` imports and sees a CUDA device, else numpy.

Batch invariance: a row's result must not depend on which other rows share the batch, or a
preempted-and-resumed request could decode differently from an uninterrupted one. BLAS computes a
one-row product with a matrix-vector kernel whose summation order differs from the matrix-matrix
kernel's, so `matmul` pads a one-row left operand to two rows. Row sums go through `matmul` too
(a product with a ones vector), whose accumulation over trailing zeros is exact, rather than
`sum`, whose pairwise order depends on the length.
"""

from __future__ import annotations

import numpy as np


class NumpyBackend:
    """float32 numpy on the CPU."""

    name = "numpy"

    def __init__(self):
        self.dtype = np.float32

    def asarray(self, a):
        """A backend tensor holding `a` (a numpy array or nested list), in float32 if floating."""
        a = np.asarray(a)
        return a.astype(self.dtype) if a.dtype.kind == "f" else a

    def to_numpy(self, t) -> np.ndarray:
        return np.asarray(t)

    def zeros(self, shape):
        return np.zeros(shape, dtype=self.dtype)

    def ones(self, shape):
        return np.ones(shape, dtype=self.dtype)

    def index(self, ids):
        """An integer index tensor."""
        return np.asarray(ids, dtype=np.int64)

    def matmul(self, a, b):
        """`a @ b` over the last two axes, batch-invariant in `a`'s rows (see the module doc)."""
        if a.shape[-2] == 1:
            pad = np.concatenate([a, a], axis=-2)
            return np.matmul(pad, b)[..., :1, :]
        return np.matmul(a, b)

    def exp(self, x):
        return np.exp(x)

    def rsqrt(self, x):
        return 1.0 / np.sqrt(x)

    def max_last(self, x):
        return x.max(axis=-1, keepdims=True)

    def sigmoid(self, x):
        return 1.0 / (1.0 + np.exp(-x))

    def swap(self, x, a, b):
        return np.swapaxes(x, a, b)

    def concat(self, xs, axis):
        return np.concatenate(xs, axis=axis)

    def where(self, cond, a, b):
        return np.where(cond, a, b)

    def argmax_last(self, x) -> np.ndarray:
        return np.asarray(x).argmax(axis=-1)

    def copy(self, x):
        return np.array(x, copy=True)


class TorchBackend:
    """float32 PyTorch on a CUDA device (or `device` given)."""

    name = "torch"

    def __init__(self, device="cuda"):
        import torch  # imported here: absent on most CPU machines

        self.torch = torch
        self.device = torch.device(device)
        self.dtype = torch.float32
        # Same arithmetic on every call: no TF32 shortcuts in matmul.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def asarray(self, a):
        if isinstance(a, self.torch.Tensor):
            return a.to(self.device)
        a = np.asarray(a)
        t = self.torch.from_numpy(np.ascontiguousarray(a)).to(self.device)
        return t.to(self.dtype) if a.dtype.kind == "f" else t

    def to_numpy(self, t) -> np.ndarray:
        return t.detach().cpu().numpy() if isinstance(t, self.torch.Tensor) else np.asarray(t)

    def zeros(self, shape):
        return self.torch.zeros(shape, dtype=self.dtype, device=self.device)

    def ones(self, shape):
        return self.torch.ones(shape, dtype=self.dtype, device=self.device)

    def index(self, ids):
        return self.torch.as_tensor(np.asarray(ids, dtype=np.int64), device=self.device)

    def matmul(self, a, b):
        if a.shape[-2] == 1:
            pad = self.torch.cat([a, a], dim=-2)
            return self.torch.matmul(pad, b)[..., :1, :]
        return self.torch.matmul(a, b)

    def exp(self, x):
        return self.torch.exp(x)

    def rsqrt(self, x):
        return self.torch.rsqrt(x)

    def max_last(self, x):
        return x.amax(dim=-1, keepdim=True)

    def sigmoid(self, x):
        return self.torch.sigmoid(x)

    def swap(self, x, a, b):
        return x.transpose(a, b)

    def concat(self, xs, axis):
        return self.torch.cat(xs, dim=axis)

    def where(self, cond, a, b):
        cond = self.asarray(cond) if not isinstance(cond, self.torch.Tensor) else cond
        return self.torch.where(cond, a, b)

    def argmax_last(self, x) -> np.ndarray:
        return x.argmax(dim=-1).cpu().numpy()

    def copy(self, x):
        return x.clone()


def torch_cuda_available() -> bool:
    """Whether PyTorch imports here and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def select_backend(name: str = "auto"):
    """`numpy`, `torch` (CUDA), or `auto` (torch when CUDA is usable, else numpy)."""
    if name == "auto":
        name = "torch" if torch_cuda_available() else "numpy"
    if name == "numpy":
        return NumpyBackend()
    if name == "torch":
        if not torch_cuda_available():
            raise RuntimeError("backend 'torch' asked for, but torch with a CUDA device is not available here")
        return TorchBackend()
    raise ValueError(f"unknown backend {name!r} (numpy, torch or auto)")
