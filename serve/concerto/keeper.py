"""The checkpoint keeper: a process holding one gleaner far-memory region, serving reads and
writes of it over a pipe.

Why a separate process: gleaner stops a process whose far memory can no longer be served (exit
status 86, include/gleaner.h) rather than hand it zero-filled pages. Holding the region here
confines that stop to the keeper; the serving process sees the pipe close, fails the requests
whose KV only the keeper held, and goes on serving the rest.

Protocol (binary, on stdin/stdout): a request is one op byte, an offset and a length (two
little-endian u64); `W` is followed by `length` bytes to store at `offset`, `R` asks for
`length` bytes at `offset`, `S` for the region's stats (JSON). The answer is `K` (then, for
`R` and `S`, the bytes; `S` prefixes its length as a u64) or `E`, a u64 length and a message.
On start the keeper prints one line: `READY <size>` or `ERROR <message>`.

Run: python3 -m concerto.keeper --lib PATH --size BYTES --budget BYTES [--memnode ADDR]
[--token-file FILE]
"""

from __future__ import annotations

import argparse
import ctypes
import struct
import sys

HEADER = struct.Struct("<cQQ")


def load_lib(path: str):
    lib = ctypes.CDLL(path)
    lib.gleaner_region_create.restype = ctypes.c_void_p
    lib.gleaner_region_create.argtypes = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_char_p]
    lib.gleaner_region_addr.restype = ctypes.c_void_p
    lib.gleaner_region_addr.argtypes = [ctypes.c_void_p]
    lib.gleaner_region_size.restype = ctypes.c_size_t
    lib.gleaner_region_size.argtypes = [ctypes.c_void_p]
    lib.gleaner_region_destroy.argtypes = [ctypes.c_void_p]
    lib.gleaner_region_stats_json.restype = ctypes.c_void_p
    lib.gleaner_region_stats_json.argtypes = [ctypes.c_void_p]
    lib.gleaner_string_free.argtypes = [ctypes.c_void_p]
    lib.gleaner_last_error.restype = ctypes.c_char_p
    return lib


def read_exact(f, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="path of libgleaner.so")
    ap.add_argument("--size", type=int, required=True, help="region size in bytes")
    ap.add_argument("--budget", type=int, required=True, help="bytes of the region resident at once")
    ap.add_argument("--memnode", default=None, help="memnode address (HOST:PORT, unix:PATH or a comma list)")
    ap.add_argument("--token-file", default=None)
    a = ap.parse_args(argv)
    out, inp = sys.stdout.buffer, sys.stdin.buffer
    try:
        lib = load_lib(a.lib)
    except OSError as e:
        out.write(f"ERROR cannot load {a.lib}: {e}\n".encode())
        out.flush()
        return 1
    region = lib.gleaner_region_create(a.size, a.budget, a.memnode.encode() if a.memnode else None,
                                       a.token_file.encode() if a.token_file else None)
    if not region:
        err = lib.gleaner_last_error()
        out.write(f"ERROR gleaner_region_create: {err.decode() if err else 'unknown error'}\n".encode())
        out.flush()
        return 1
    base = lib.gleaner_region_addr(region)
    size = lib.gleaner_region_size(region)
    out.write(f"READY {size}\n".encode())
    out.flush()

    def error(msg: str):
        m = msg.encode()
        out.write(b"E" + struct.pack("<Q", len(m)) + m)

    try:
        while True:
            try:
                op, off, n = HEADER.unpack(read_exact(inp, HEADER.size))
            except EOFError:
                break
            if op in (b"W", b"R") and off + n > size:
                if op == b"W":
                    read_exact(inp, n)
                error(f"range {off}+{n} beyond the region's {size} bytes")
            elif op == b"W":
                data = read_exact(inp, n)
                ctypes.memmove(base + off, data, n)
                out.write(b"K")
            elif op == b"R":
                out.write(b"K" + ctypes.string_at(base + off, n))
            elif op == b"S":
                p = lib.gleaner_region_stats_json(region)
                s = ctypes.string_at(p) if p else b"{}"
                if p:
                    lib.gleaner_string_free(p)
                out.write(b"K" + struct.pack("<Q", len(s)) + s)
            else:
                error(f"unknown op {op!r}")
            out.flush()
    finally:
        lib.gleaner_region_destroy(region)
    return 0


if __name__ == "__main__":
    sys.exit(main())
