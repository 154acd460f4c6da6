"""Requests and their life cycle.

A request's sequence is its prompt followed by the tokens generated so far. `num_computed`
counts the leading tokens whose KV is committed in the cache; every step computes some of
`seq[num_computed:]`, and a step that reaches the end of the sequence yields the next token. So
a prefill chunk, a decode step and the recomputation of a discarded request are the same thing.

States:
  WAITING    queued, never run (or run and then discarded: KV nowhere, num_computed == 0)
  RUNNING    in the running set, scheduled every step
  PREEMPTED  taken out of the running set; its KV blocks are still in the cache
  SWAPPED    its blocks were reclaimed; its KV up to `ckpt_tokens` lives in the checkpoint store
  FINISHED / FAILED
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

ONLINE = "online"
OFFLINE = "offline"

WAITING, RUNNING, PREEMPTED, SWAPPED, FINISHED, FAILED = "waiting", "running", "preempted", "swapped", "finished", "failed"

_ids = itertools.count()


@dataclass(eq=False)
class Request:
    prompt: list[int]
    max_tokens: int
    kind: str = ONLINE
    arrival: float = 0.0
    rid: str = ""
    output: list[int] = field(default_factory=list)
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)
    state: str = WAITING
    admitted: int = -1  # order of admission to the running set (for "most recently admitted")
    ckpt: object = None  # the checkpoint store's record of this request, if any
    ckpt_tokens: int = 0  # leading tokens whose KV is in the checkpoint store
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None
    error: str | None = None
    preemptions: int = 0
    restores: int = 0
    recomputed_tokens: int = 0

    def __post_init__(self):
        if not self.rid:
            self.rid = f"{self.kind[:3]}-{next(_ids)}"
        if self.kind not in (ONLINE, OFFLINE):
            raise ValueError(f"kind must be {ONLINE!r} or {OFFLINE!r}")
        if not self.prompt:
            raise ValueError("the prompt must hold at least one token")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")

    @property
    def online(self) -> bool:
        return self.kind == ONLINE

    @property
    def seq(self) -> list[int]:
        return self.prompt + self.output

    @property
    def seq_len(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def remaining(self) -> int:
        """Tokens still to compute before the next token comes out."""
        return self.seq_len - self.num_computed

    @property
    def in_decode(self) -> bool:
        """Past its prompt: each step computes one token and yields the next."""
        return bool(self.output) and self.remaining == 1

    @property
    def done(self) -> bool:
        return self.state in (FINISHED, FAILED)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (None with fewer than two tokens)."""
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)
