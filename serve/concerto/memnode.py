"""Starting a real gleaner memnode process (for tests, the benchmark and `--memnode spawn`)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from .store import REPO_ROOT


def find_memnode_bin() -> list[str] | None:
    """The command that runs a memnode: $GLEANER_MEMNODE_BIN, else target/release/gleaner-memnode,
    else target/release/gleaner with its `memnode` subcommand (None if none is built)."""
    env = os.environ.get("GLEANER_MEMNODE_BIN")
    if env:
        return [env]
    rel = REPO_ROOT / "target" / "release"
    if (rel / "gleaner-memnode").is_file():
        return [str(rel / "gleaner-memnode")]
    if (rel / "gleaner").is_file():
        return [str(rel / "gleaner"), "memnode"]
    return None


class Memnode:
    """A memnode on a loopback port, stopped by `stop()` (or `kill()` to simulate its loss)."""

    def __init__(self, capacity: str = "256M", lease: int = 10):
        cmd = find_memnode_bin()
        if cmd is None:
            raise FileNotFoundError("no memnode binary: build it (cargo build --release -p gleaner-memnode)")
        self.dir = tempfile.TemporaryDirectory(prefix="concerto-memnode-")
        self.token_file = str(Path(self.dir.name) / "token")
        self.proc = subprocess.Popen(
            cmd + ["--listen", "127.0.0.1:0", "--capacity", capacity, "--token-file", self.token_file,
                   "--lease", str(lease), "--exit-on-stdin-eof"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        line = self.proc.stdout.readline().decode().strip()
        if not line.startswith("listening on "):
            self.kill()
            raise RuntimeError(f"memnode did not start: {line!r}")
        self.addr = line.split()[-1]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_pipes()
        self.dir.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
        self.dir.cleanup()
