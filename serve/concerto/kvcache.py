"""The paged KV cache: fixed-size blocks of token slots, handed out by a block allocator.

`BlockAllocator` is pure bookkeeping (the simulator uses it alone); `PagedKVCache` adds the
storage: per layer, one K and one V tensor of `num_blocks * block_size` token slots. A sequence
owns a block table (a list of block ids); its token at position p lives in slot
`table[p // block_size] * block_size + p % block_size`.
"""

from __future__ import annotations

import numpy as np


class OutOfBlocks(Exception):
    """The pool has fewer free blocks than asked for."""


class BlockAllocator:
    """Free-list allocator of KV blocks."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def used_fraction(self) -> float:
        return 1.0 - self.num_free / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def alloc(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfBlocks(f"{n} KV blocks asked for, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def free(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))


def slots_for(table: list[int], start: int, end: int, block_size: int) -> np.ndarray:
    """Slot indices of positions [start, end) of a sequence with block table `table`."""
    pos = np.arange(start, end)
    return np.asarray(table, dtype=np.int64)[pos // block_size] * block_size + pos % block_size


class PagedKVCache:
    """K and V storage for every layer, in blocks owned through a `BlockAllocator`."""

    def __init__(self, backend, n_layers: int, n_kv_heads: int, head_dim: int, num_blocks: int, block_size: int):
        self.backend = backend
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.block_size = block_size
        self.n_layers = n_layers
        self.kv_shape = (n_kv_heads, head_dim)
        slots = num_blocks * block_size
        self.k = [backend.zeros((slots, n_kv_heads, head_dim)) for _ in range(n_layers)]
        self.v = [backend.zeros((slots, n_kv_heads, head_dim)) for _ in range(n_layers)]

    @property
    def token_bytes(self) -> int:
        """Bytes of K and V of one token over all layers (float32)."""
        return self.n_layers * 2 * self.kv_shape[0] * self.kv_shape[1] * 4

    def read_tokens(self, table: list[int], start: int, end: int) -> np.ndarray:
        """KV of positions [start, end) as a numpy array (tokens, layers, 2, kv_heads, head_dim)."""
        idx = self.backend.index(slots_for(table, start, end, self.block_size))
        b = self.backend
        per_layer = [np.stack([b.to_numpy(self.k[l][idx]), b.to_numpy(self.v[l][idx])], axis=1) for l in range(self.n_layers)]
        return np.ascontiguousarray(np.stack(per_layer, axis=1), dtype=np.float32)

    def write_tokens(self, table: list[int], start: int, data: np.ndarray) -> None:
        """Stores `data` (as `read_tokens` returns it) at positions start.. of the sequence."""
        idx = self.backend.index(slots_for(table, start, start + data.shape[0], self.block_size))
        for l in range(self.n_layers):
            self.k[l][idx] = self.backend.asarray(data[:, l, 0])
            self.v[l][idx] = self.backend.asarray(data[:, l, 1])
