"""Checkpoint stores: where preempted offline requests' KV is kept (the "host" side of 6.4.4).

A store hands out fixed-size slots, one per KV block of `block_size` tokens; a token's KV (all
layers, K and V) is `token_bytes` contiguous bytes at `slot * slot_bytes + offset * token_bytes`.
A request's record is its list of slots, parallel to its block table (the dissertation's
gpu-block -> host-block mapping in the page table's extension field).

* `HostStore`: a bytearray in this process.
* `FarStore`: a gleaner far-memory region (the C API, libgleaner.so) held by a keeper process
  (`keeper.py`), so the KV can live on a memnode. If the keeper dies (its memnode lost: gleaner
  stops it with exit status 86), every operation raises `CheckpointLost` with what it said.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from .keeper import HEADER

REPO_ROOT = Path(__file__).resolve().parents[2]


class CheckpointLost(Exception):
    """A checkpoint's data cannot be read back: the request it belongs to must fail."""


class _Slots:
    def __init__(self, num_slots: int, slot_bytes: int, token_bytes: int):
        self.num_slots, self.slot_bytes, self.token_bytes = num_slots, slot_bytes, token_bytes
        self._free = list(range(num_slots - 1, -1, -1))

    def alloc(self) -> int:
        if not self._free:
            raise CheckpointLost(f"checkpoint store full ({self.num_slots} slots)")
        return self._free.pop()

    def release(self, record: list[int]) -> None:
        self._free.extend(record)
        record.clear()

    @property
    def used(self) -> int:
        return self.num_slots - len(self._free)


class KVStore:
    """Slot bookkeeping and the token-range I/O shared by both stores."""

    name = "store"

    def __init__(self, num_slots: int, block_size: int, token_bytes: int):
        self.block_size = block_size
        self.slots = _Slots(num_slots, block_size * token_bytes, token_bytes)
        self.bytes_written = 0
        self.bytes_read = 0

    # Raw byte I/O, by subclasses.
    def _write(self, offset: int, data: bytes) -> None:
        raise NotImplementedError

    def _read(self, offset: int, n: int) -> bytes:
        raise NotImplementedError

    def put(self, record: list[int], start: int, data: np.ndarray) -> None:
        """Stores the KV of tokens start..start+len(data) (numpy, one row per token)."""
        tb, bs = self.slots.token_bytes, self.block_size
        raw = np.ascontiguousarray(data).tobytes()
        if len(raw) != len(data) * tb:
            raise ValueError("token rows of the wrong size for this store")
        pos = 0
        while pos < len(data):
            t = start + pos
            b, off = divmod(t, bs)
            while len(record) <= b:
                record.append(self.slots.alloc())
            n = min(bs - off, len(data) - pos)
            self._write(record[b] * self.slots.slot_bytes + off * tb, raw[pos * tb : (pos + n) * tb])
            self.bytes_written += n * tb
            pos += n

    def get(self, record: list[int], n_tokens: int, row_shape: tuple) -> np.ndarray:
        """The KV of tokens 0..n_tokens, as put() was given it."""
        tb, bs = self.slots.token_bytes, self.block_size
        parts = []
        for b in range(-(-n_tokens // bs)):
            n = min(bs, n_tokens - b * bs)
            parts.append(self._read(record[b] * self.slots.slot_bytes, n * tb))
            self.bytes_read += n * tb
        return np.frombuffer(b"".join(parts), dtype=np.float32).reshape((n_tokens,) + tuple(row_shape))

    def release(self, record: list[int]) -> None:
        self.slots.release(record)

    def close(self) -> None:
        pass


class HostStore(KVStore):
    """Checkpoints in this process's memory."""

    name = "host"

    def __init__(self, num_slots: int, block_size: int, token_bytes: int):
        super().__init__(num_slots, block_size, token_bytes)
        self.mem = bytearray(num_slots * self.slots.slot_bytes)

    def _write(self, offset, data):
        self.mem[offset : offset + len(data)] = data

    def _read(self, offset, n):
        return bytes(self.mem[offset : offset + n])


def find_libgleaner() -> Path | None:
    """$GLEANER_LIB, else the repository's target/release/libgleaner.so (None if absent)."""
    p = os.environ.get("GLEANER_LIB")
    cands = [Path(p)] if p else [REPO_ROOT / "target" / "release" / "libgleaner.so"]
    return next((c for c in cands if c.is_file()), None)


class FarStore(KVStore):
    """Checkpoints in a gleaner far-memory region, held by a keeper process."""

    name = "far"

    def __init__(self, num_slots: int, block_size: int, token_bytes: int, memnode: str | None = None,
                 token_file: str | None = None, local_budget: int | None = None, lib: str | None = None):
        super().__init__(num_slots, block_size, token_bytes)
        lib = lib or find_libgleaner()
        if lib is None:
            raise FileNotFoundError("libgleaner.so not found: build it (cargo build --release -p gleaner-capi) or set GLEANER_LIB")
        size = num_slots * self.slots.slot_bytes
        budget = local_budget if local_budget is not None else max(size // 4, 1 << 20)
        self._stderr = tempfile.TemporaryFile()
        cmd = [sys.executable, "-m", "concerto.keeper", "--lib", str(lib), "--size", str(size), "--budget", str(budget)]
        if memnode:
            cmd += ["--memnode", memnode]
        if token_file:
            cmd += ["--token-file", token_file]
        env = dict(os.environ)
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env)
        line = self.proc.stdout.readline().decode().strip()
        if not line.startswith("READY"):
            self.proc.kill()
            self.proc.wait()
            raise CheckpointLost(f"checkpoint keeper did not start: {line or self._why()}")
        self.dead: str | None = None
        self.memnode = memnode

    def _why(self) -> str:
        code = self.proc.poll()
        self._stderr.seek(0)
        tail = self._stderr.read().decode(errors="replace").strip().splitlines()[-3:]
        status = f"exit status {code}" if code is not None else "still running"
        return f"keeper {status}: {' | '.join(tail) or '(no message)'}"

    def _fail(self) -> None:
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.dead = "far-memory checkpoint lost (memnode {}): {}".format(self.memnode or "embedded", self._why())
        raise CheckpointLost(self.dead)

    def _call(self, op: bytes, offset: int, n: int, payload: bytes = b"", reply: int = 0) -> bytes:
        if self.dead:
            raise CheckpointLost(self.dead)
        try:
            self.proc.stdin.write(HEADER.pack(op, offset, n) + payload)
            self.proc.stdin.flush()
            status = self.proc.stdout.read(1)
            if status == b"K":
                data = self.proc.stdout.read(reply) if reply else b""
                if len(data) == reply:
                    return data
            elif status == b"E":
                (m,) = struct.unpack("<Q", self.proc.stdout.read(8))
                raise CheckpointLost("checkpoint keeper: " + self.proc.stdout.read(m).decode(errors="replace"))
        except (BrokenPipeError, OSError, struct.error):
            pass
        self._fail()

    def _write(self, offset, data):
        self._call(b"W", offset, len(data), data)

    def _read(self, offset, n):
        return self._call(b"R", offset, n, reply=n)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self._stderr):
            try:
                f.close()
            except OSError:
                pass
