"""Load generators: gamma-process arrivals (rate, CV), ON/OFF phases, offline backlogs."""

from __future__ import annotations

import numpy as np

from .request import OFFLINE, ONLINE, Request


def gamma_arrivals(rate: float, cv: float, duration: float, rng: np.random.Generator, start: float = 0.0) -> list[float]:
    """Arrival times of a gamma renewal process with mean `rate` per second and coefficient
    of variation `cv` of the inter-arrival times (cv 1: Poisson), over [start, start+duration)."""
    if rate <= 0:
        return []
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate * shape)
    t, out = start, []
    while True:
        t += rng.gamma(shape, scale)
        if t >= start + duration:
            return out
        out.append(t)


def on_off_arrivals(rate: float, cv: float, phases: list[tuple[float, bool]], rng) -> list[float]:
    """Arrivals over consecutive (duration, on) phases: `rate` while on, none while off."""
    out, t = [], 0.0
    for dur, on in phases:
        if on:
            out += gamma_arrivals(rate, cv, dur, rng, start=t)
        t += dur
    return out


def make_requests(times, kind: str, prompt_len, max_tokens, rng, vocab: int = 256) -> list[Request]:
    """Requests arriving at `times`; lengths are ints or (low, high) ranges drawn uniformly."""

    def draw(x):
        return int(rng.integers(x[0], x[1] + 1)) if isinstance(x, (tuple, list)) else int(x)

    return [Request(prompt=[int(v) for v in rng.integers(0, vocab, draw(prompt_len))], max_tokens=draw(max_tokens),
                    kind=kind, arrival=float(t)) for t in times]


def online_trace(rate, cv, duration, prompt_len, max_tokens, seed=0, vocab=256):
    rng = np.random.default_rng(seed)
    return make_requests(gamma_arrivals(rate, cv, duration, rng), ONLINE, prompt_len, max_tokens, rng, vocab)


def offline_backlog(n, prompt_len, max_tokens, seed=1, vocab=256):
    """`n` offline requests all available at time 0 (a batch file's worth)."""
    rng = np.random.default_rng(seed)
    return make_requests([0.0] * n, OFFLINE, prompt_len, max_tokens, rng, vocab)
