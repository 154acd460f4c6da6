"""gleaner soft memory from Python: ctypes over libgleaner_soft.so (include/gleaner_soft.h).

    import gleaner_soft
    pool = gleaner_soft.Pool(lambda args: expensive(args), name="memo", limit=64 << 20)
    memo = gleaner_soft.SoftMap(pool)
    value = memo.get(b"key")        # a miss runs the reconstructor; later reads are copies

A pool given ``node="auto"`` (or a socket path) registers with the node daemon
(``gleaner node``), starting one if none answers; the daemon then grants it idle memory and may
take it back at any moment, after which reads rebuild what was lost. Reconstructors take and
return ``bytes``; one returning ``None`` makes the read raise ``LookupError``.

The library is found through ``$GLEANER_SOFT_LIB``, else next to this file's repository build
(``target/release``), else the loader's search path.
"""

import ctypes
import os

__all__ = ["Pool", "SoftPtr", "SoftMap", "Stats", "load"]

_RECON = ctypes.CFUNCTYPE(
    ctypes.c_ssize_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t
)


class _Config(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("capacity", ctypes.c_uint64),
        ("limit", ctypes.c_uint64),
        ("node_socket", ctypes.c_char_p),
        ("autostart", ctypes.c_int),
        ("weight", ctypes.c_double),
        ("floor", ctypes.c_uint64),
        ("ceiling", ctypes.c_uint64),
        ("verify", ctypes.c_int),
    ]


class Stats(ctypes.Structure):
    """A pool's counters (``gleaner_soft_stats``)."""

    _fields_ = [
        ("hits", ctypes.c_uint64),
        ("misses", ctypes.c_uint64),
        ("victim_hits", ctypes.c_uint64),
        ("rebuild_ns", ctypes.c_uint64),
        ("torn_caught", ctypes.c_uint64),
        ("verify_mismatches", ctypes.c_uint64),
        ("resident_bytes", ctypes.c_uint64),
        ("limit", ctypes.c_uint64),
    ]

    def as_dict(self):
        return {name: getattr(self, name) for name, _ in self._fields_}


_lib = None


def load(path=None):
    """Loads libgleaner_soft.so (once) and declares its functions."""
    global _lib
    if _lib is not None:
        return _lib
    candidates = [path, os.environ.get("GLEANER_SOFT_LIB")]
    here = os.path.dirname(os.path.abspath(__file__))
    candidates.append(os.path.join(here, "..", "target", "release", "libgleaner_soft.so"))
    candidates.append("libgleaner_soft.so")
    err = None
    for c in candidates:
        if not c:
            continue
        try:
            lib = ctypes.CDLL(c)
            break
        except OSError as e:
            err = e
    else:
        raise OSError(f"libgleaner_soft.so not found (set GLEANER_SOFT_LIB): {err}")
    P, S = ctypes.c_void_p, ctypes.c_size_t
    sig = {
        "gleaner_soft_config_init": (None, [ctypes.POINTER(_Config)]),
        "gleaner_soft_pool_create": (P, [ctypes.POINTER(_Config), _RECON, P]),
        "gleaner_soft_pool_destroy": (None, [P]),
        "gleaner_soft_pool_set_limit": (None, [P, ctypes.c_uint64]),
        "gleaner_soft_pool_stats": (ctypes.c_int, [P, ctypes.POINTER(Stats)]),
        "gleaner_soft_alloc": (P, [P]),
        "gleaner_soft_free": (None, [P]),
        "gleaner_soft_read": (ctypes.c_ssize_t, [P, ctypes.c_char_p, S, P, S]),
        "gleaner_soft_write": (ctypes.c_int, [P, ctypes.c_char_p, S]),
        "gleaner_soft_present": (ctypes.c_int, [P]),
        "gleaner_soft_map_create": (P, [P]),
        "gleaner_soft_map_destroy": (None, [P]),
        "gleaner_soft_map_get": (ctypes.c_ssize_t, [P, ctypes.c_char_p, S, P, S]),
        "gleaner_soft_map_put": (ctypes.c_int, [P, ctypes.c_char_p, S, ctypes.c_char_p, S]),
        "gleaner_soft_last_error": (ctypes.c_char_p, []),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    _lib = lib
    return lib


def _error(lib):
    return lib.gleaner_soft_last_error().decode(errors="replace")


def _read(fn, handle, args, bufsize):
    """Calls a read-like C function, growing the buffer until the value fits."""
    while True:
        buf = ctypes.create_string_buffer(bufsize)
        n = fn(handle, args, len(args), buf, bufsize)
        if n < 0:
            raise LookupError(_error(_lib))
        if n <= bufsize:
            return buf.raw[:n]
        bufsize = n


class Pool:
    """A soft-memory pool whose misses call ``reconstructor(args: bytes) -> bytes | None``."""

    def __init__(self, reconstructor, name="python", capacity=1 << 30, limit=64 << 20,
                 node=None, weight=1.0, floor=0, ceiling=0, verify=False):
        lib = load()
        cfg = _Config()
        lib.gleaner_soft_config_init(ctypes.byref(cfg))
        self._name = name.encode()
        cfg.name = self._name
        cfg.capacity, cfg.limit = capacity, limit
        if node is not None:
            self._node = b"" if node == "auto" else os.fsencode(node)
            cfg.node_socket = self._node
            cfg.autostart = 1
        cfg.weight, cfg.floor, cfg.ceiling, cfg.verify = weight, floor, ceiling, int(verify)
        self._user = reconstructor

        def trampoline(_ctx, args, args_len, out, cap):
            try:
                value = self._user(ctypes.string_at(args, args_len) if args_len else b"")
            except Exception:  # a reconstructor's exception is a failed rebuild, not a crash
                return -1
            if value is None:
                return -1
            value = bytes(value)
            if len(value) <= cap:
                ctypes.memmove(out, value, len(value))
            return len(value)

        self._recon = _RECON(trampoline)  # kept alive as long as the pool
        self._h = lib.gleaner_soft_pool_create(ctypes.byref(cfg), self._recon, None)
        if not self._h:
            raise OSError(_error(lib))
        self._children = []

    def set_limit(self, nbytes):
        """Sets the grant (a pool without a daemon)."""
        _lib.gleaner_soft_pool_set_limit(self._h, nbytes)

    def stats(self):
        """The pool's counters, as a dict."""
        s = Stats()
        _lib.gleaner_soft_pool_stats(self._h, ctypes.byref(s))
        return s.as_dict()

    def close(self):
        """Frees the pool and everything made from it."""
        for c in self._children:
            c.close()
        if self._h:
            _lib.gleaner_soft_pool_destroy(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SoftPtr:
    """A soft unique pointer: ``read(args)`` returns a copy, rebuilt from ``args`` on a miss."""

    def __init__(self, pool):
        self._h = _lib.gleaner_soft_alloc(pool._h)
        pool._children.append(self)

    def read(self, args=b"", bufsize=4096):
        return _read(_lib.gleaner_soft_read, self._h, bytes(args), bufsize)

    def write(self, value):
        return _lib.gleaner_soft_write(self._h, bytes(value), len(value)) == 1

    def present(self):
        return _lib.gleaner_soft_present(self._h) == 1

    def close(self):
        if self._h:
            _lib.gleaner_soft_free(self._h)
            self._h = None


class SoftMap:
    """A soft hash map: ``get(key)`` rebuilds with the key as the reconstructor's argument."""

    def __init__(self, pool):
        self._h = _lib.gleaner_soft_map_create(pool._h)
        pool._children.append(self)

    def get(self, key, bufsize=4096):
        return _read(_lib.gleaner_soft_map_get, self._h, bytes(key), bufsize)

    def put(self, key, value):
        return _lib.gleaner_soft_map_put(self._h, bytes(key), len(key), bytes(value), len(value)) == 1

    def close(self):
        if self._h:
            _lib.gleaner_soft_map_destroy(self._h)
            self._h = None
