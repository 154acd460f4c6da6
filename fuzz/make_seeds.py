#!/usr/bin/env python3
"""Writes one valid frame of every message kind to fuzz/seeds/decode_frame/, so the fuzzer starts
from inputs that pass the header checks and reach each payload decoder (see crates/proto)."""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds", "decode_frame")
PAGE = 4096
VERSION = 4  # PROTOCOL_VERSION
MAX_BLOB = PAGE + 64  # MAX_BLOB_SIZE


def frame(kind, payload, req=1):
    return struct.pack("<HBBII", 0x4C47, VERSION, kind, req, len(payload)) + payload


def text(s):
    b = s.encode()
    return struct.pack("<I", len(b)) + b


def batch(lengths):
    """A page batch: u32 count, then per entry u64 id, u64 version, u32 len, len bytes (1 <= len <= MAX_BLOB)."""
    out = struct.pack("<I", len(lengths))
    for i, n in enumerate(lengths):
        assert 1 <= n <= MAX_BLOB
        out += struct.pack("<QQI", i, i + 1, n) + bytes([i & 0xFF]) * n
    return out


seeds = {
    "challenge": frame(1, b"\x01" * 32),
    "auth": frame(2, b"\x02" * 32 + struct.pack("<Q", 7) + b"\x03" * 16 + b"\x04" * 32 + text("pager")),
    "welcome": frame(3, struct.pack("<Q", 7) + b"\x05" * 16 + b"\x06" * 32 + struct.pack("<QQ", 1 << 32, 10000)),
    "read": frame(4, struct.pack("<I", 3) + struct.pack("<QQQ", 1, 2, 3)),
    "pages": frame(5, batch([PAGE, 37])),
    "write": frame(6, batch([1, 300, MAX_BLOB])),
    "ack": frame(7, struct.pack("<I", 5)),
    "free": frame(8, struct.pack("<I", 2) + struct.pack("<QI", 0, 10) + struct.pack("<QI", 99, 1)),
    "ping": frame(9, b""),
    "pong": frame(10, b""),
    "stats_request": frame(11, b""),
    "stats": frame(12, text('{"used_bytes":1}')),
    "goodbye": frame(13, b""),
    "error": frame(14, struct.pack("<H", 3) + text("memnode full")),
    "grant_request": frame(15, struct.pack("<Q", 16384)),
    "grant": frame(16, struct.pack("<IQ", 0, 16384)),
    "drain": frame(17, b""),
    "fork": frame(18, b""),
    "forked": frame(19, struct.pack("<Q", 7) + bytes(range(16))),
    "prefetch": frame(20, struct.pack("<I", 1500) + struct.pack("<I", 2) + struct.pack("<QQ", 5, 6)),
    "forget": frame(21, struct.pack("<I", 2) + struct.pack("<QQ", 5, 50) + struct.pack("<QQ", 6, 61)),
    "two_frames": frame(9, b"") + frame(4, struct.pack("<I", 1) + struct.pack("<Q", 9), req=2),
}
os.makedirs(OUT, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(OUT, name + ".bin"), "wb") as f:
        f.write(data)
print(f"wrote {len(seeds)} seeds to {OUT}")
