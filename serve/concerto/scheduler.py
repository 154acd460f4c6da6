"""The unified preemptive scheduler: the mechanism around the policy in `policy.py`.

One `Scheduler` serves both kinds of requests over one executor (the real engine or the
simulator's). Each `step()` is one iteration of Algorithm 1: plan the batch (online first,
offline within the SLO budget, Algorithm 2 preemptions), allocate KV blocks (reclaiming those of
preempted requests: checkpointed ones become SWAPPED, the others are discarded and recomputed),
restore swapped requests' KV from the checkpoint store, run the step with a safepoint between
layers, commit the tokens, and incrementally checkpoint the chosen offline requests.

An online arrival (`submit`) runs Algorithm 3 at once: if the running batch would make it miss
its TTFT objective, offline victims are marked, and the engine drops them at its next layer
safepoint. In trace replay (`run_trace`) arrivals are delivered at the safepoints and between
steps, at their virtual times.
"""

from __future__ import annotations

import heapq
import sys
import threading
from collections import deque

from .latency import BatchShape
from .model import SeqWork
from .policy import SLO, AdaptiveCheckpointer, SystemConfig, blocks_needed, plan_batch, step_target, tpot_allowance, victims_for_arrival
from .request import FAILED, FINISHED, PREEMPTED, RUNNING, SWAPPED, WAITING, Request
from .store import CheckpointLost


class Scheduler:
    def __init__(self, system: SystemConfig, executor, clock, latency, slo: SLO | None = None, max_context: int | None = None, log=None):
        self.system = system
        self.ex = executor
        self.clock = clock
        self.latency = latency
        self.slo = slo
        self.max_context = max_context
        self.log = log or (lambda msg: print(f"concerto: {msg}", file=sys.stderr))
        self.alloc = executor.allocator
        self.checkpointer = AdaptiveCheckpointer(system.checkpoint if executor.store else "off", system.checkpoint_threshold)
        self.lock = threading.RLock()
        self.wake = threading.Condition(self.lock)
        self.online_queue: deque[Request] = deque()
        self.offline_queue: deque[Request] = deque()
        self.running: list[Request] = []
        self.pending_victims: set = set()
        self.current: list = []  # (request, tokens) of the step in flight
        self.t_sched = 0.0
        self._admitted = 0
        self._arrivals: list = []  # heap of (time, seq, request), trace replay
        self._seq = 0
        self.finished: list[Request] = []
        self.steps = 0
        self.stats = {"preempted_at_safepoint": 0, "preempted_at_schedule": 0, "reclaimed_swapped": 0,
                      "reclaimed_discarded": 0, "restores": 0, "checkpoint_tokens": 0, "failed": 0}
        self.trace: list = []  # optional per-step records (set self.record = True)
        self.record = False

    # ---- arrivals --------------------------------------------------------------------------

    def submit(self, req: Request) -> Request:
        """Queues a request now (thread-safe); online arrivals run Algorithm 3."""
        limit = self.max_context
        if limit is not None and len(req.prompt) + req.max_tokens > limit:
            raise ValueError(f"prompt of {len(req.prompt)} tokens plus max_tokens {req.max_tokens} exceeds the model's context of {limit} tokens")
        with self.lock:
            if not self.clock.virtual:
                req.arrival = self.clock.now()
            if req.online:
                self._on_recv_online(req)
            else:
                self.offline_queue.append(req)
            self.wake.notify_all()
        return req

    def _on_recv_online(self, req: Request) -> None:
        self.online_queue.append(req)
        if not (self.system.preempt and self.slo and self.current):
            return
        elapsed = self.clock.now() - self.t_sched
        live = [(r, n) for r, n in self.current if r not in self.pending_victims]
        victims = victims_for_arrival(live, self.online_queue, self.latency, self.slo.ttft * self.system.safety, elapsed)
        self.pending_victims.update(victims)

    def add_arrivals(self, requests) -> None:
        """Trace replay: requests are delivered when the virtual clock reaches `arrival`."""
        for r in requests:
            heapq.heappush(self._arrivals, (r.arrival, self._seq, r))
            self._seq += 1

    def _deliver_due(self) -> None:
        while self._arrivals and self._arrivals[0][0] <= self.clock.now():
            _, _, r = heapq.heappop(self._arrivals)
            self.submit(r)

    def _safepoint(self, layer: int):
        self._deliver_due()
        with self.lock:
            drop = {r for r, _ in self.current if r in self.pending_victims}
            self.pending_victims -= drop
            return drop

    # ---- one iteration of Algorithm 1 ------------------------------------------------------

    def step(self) -> bool:
        """Plans and runs one batch step; False when there was nothing to run."""
        self._deliver_due()
        with self.lock:
            items = self._plan_and_prepare()
            if not items:
                return False
            self.current = items
            self.t_sched = self.clock.now()
            self.pending_victims.clear()
        work = [SeqWork(r, r.seq[r.num_computed : r.num_computed + n], r.num_computed, r.blocks,
                        want_logits=r.num_computed + n == r.seq_len) for r, n in items]
        t0 = self.clock.now()
        out = self.ex.run(work, self._safepoint)
        with self.lock:
            now = self.clock.now()
            n_of = dict((id(r), n) for r, n in items)
            for r in out.completed:
                r.num_computed += n_of[id(r)]
                if r in out.next_token:
                    self._emit(r, out.next_token[r], now)
            for r in out.dropped:
                self.stats["preempted_at_safepoint"] += 1
                self._preempt(r)
            if out.layers_run == self.ex.n_layers and hasattr(self.latency, "observe"):
                self.latency.observe(BatchShape.of((n, r.num_computed - n) for r, n in items if r in out.completed), now - t0)
            if self.record:
                self.trace.append({"t0": t0, "t1": now, "layers": out.layers_run,
                                   "items": [(r.rid, r.kind, n) for r, n in items],
                                   "dropped": [r.rid for r in out.dropped]})
            self.current = []
            self.steps += 1
            self._checkpoint()
            self.wake.notify_all()
        return True

    def _plan_and_prepare(self) -> list:
        online_running = [r for r in self.running if r.online]
        offline_running = [r for r in self.running if not r.online]
        now = self.clock.now()
        waiting = [r.arrival for r in list(self.online_queue) + online_running if r.first_token_time is None]
        decoding = [r for r in online_running if r.first_token_time is not None]
        target = step_target(self.slo if self.system.budget else None,
                             bool(online_running or self.online_queue) and any(r.output for r in self.running),
                             (now - min(waiting)) if waiting else None,
                             self.system.safety,
                             tpot_allowance(decoding, self.slo.tpot, now) if (self.slo and decoding) else None)
        reclaimable = sum(len(r.blocks) for r in self.offline_queue if r.state == PREEMPTED)
        plan = plan_batch(online_running, list(self.online_queue), offline_running, list(self.offline_queue),
                          self.latency, target, self.system, self.alloc.num_free + reclaimable, self.alloc.block_size,
                          restore_cost=lambda r: r.ckpt_tokens * self.ex.restore_s_per_token if r.state == SWAPPED else 0.0)
        for r in plan.preempt:
            self.stats["preempted_at_schedule"] += 1
            self._preempt(r)
        items = []
        for r, n in plan.items:
            if not self._ensure_blocks(r, n):
                if r.state == RUNNING and not r.online:
                    self._preempt(r)
                continue
            if r.state != RUNNING:
                if not self._admit(r):
                    continue
            items.append((r, n))
        return items

    def _ensure_blocks(self, r: Request, n: int) -> bool:
        need = blocks_needed(r, n, self.alloc.block_size)
        while self.alloc.num_free < need:
            victim = next((q for q in reversed(self.offline_queue) if q.state == PREEMPTED and q is not r and q.blocks), None)
            if victim is None:
                return False
            self._reclaim(victim)
        if need:
            r.blocks.extend(self.alloc.alloc(need))
        return True

    def _admit(self, r: Request) -> bool:
        """Moves a queued request into the running set, restoring its checkpoint if swapped."""
        if r.state == SWAPPED:
            try:
                self.ex.load(r)
                r.restores += 1
                self.stats["restores"] += 1
            except CheckpointLost as e:
                self._fail(r, str(e))
                return False
        (self.online_queue if r.online else self.offline_queue).remove(r)
        r.state = RUNNING
        r.admitted = self._admitted
        self._admitted += 1
        self.running.append(r)
        return True

    # ---- state changes ---------------------------------------------------------------------

    def _emit(self, r: Request, tok: int, now: float) -> None:
        r.output.append(tok)
        r.token_times.append(now)
        if r.first_token_time is None:
            r.first_token_time = now
        if len(r.output) >= r.max_tokens:
            self._finish(r, FINISHED, now)

    def _finish(self, r: Request, state: str, now: float) -> None:
        if r in self.running:
            self.running.remove(r)
        for q in (self.online_queue, self.offline_queue):
            if r in q:
                q.remove(r)
        self.alloc.free(r.blocks)
        r.blocks = []
        self.ex.release(r)
        r.ckpt = None
        r.state = state
        r.finish_time = now
        self.finished.append(r)
        ev = getattr(r, "event", None)
        if ev is not None:
            ev.set()

    def _fail(self, r: Request, why: str) -> None:
        r.error = why
        self.stats["failed"] += 1
        self.log(f"request {r.rid} FAILED: {why}")
        self._finish(r, FAILED, self.clock.now())

    def _preempt(self, r: Request) -> None:
        """Out of the running set, KV kept in the cache for now; first in line to resume."""
        if r in self.running:
            self.running.remove(r)
        r.state = PREEMPTED
        r.preemptions += 1
        self.offline_queue.appendleft(r)

    def _reclaim(self, r: Request) -> None:
        """Frees a preempted request's KV blocks: it resumes from its checkpoint (the tokens
        checkpointed so far; the rest recomputed) or, without one, by recomputing."""
        self.alloc.free(r.blocks)
        r.blocks = []
        if r.ckpt is not None and r.ckpt_tokens > 0:
            r.recomputed_tokens += r.num_computed - r.ckpt_tokens
            r.num_computed = r.ckpt_tokens
            r.state = SWAPPED
            self.stats["reclaimed_swapped"] += 1
        else:
            r.recomputed_tokens += r.num_computed
            r.num_computed = 0
            r.state = WAITING
            self.stats["reclaimed_discarded"] += 1

    def _checkpoint(self) -> None:
        """Incremental checkpointing after the step: the new KV of the chosen offline requests."""
        if not self.ex.store:
            return
        offline = [r for r in self.running if not r.online]
        for r in self.checkpointer.select(offline, self.alloc.used_fraction):
            if r.ckpt is None:
                r.ckpt, r.ckpt_tokens = [], 0
            if r.num_computed > r.ckpt_tokens:
                try:
                    self.ex.save(r, r.ckpt_tokens, r.num_computed)
                except CheckpointLost as e:
                    self._store_lost(str(e))
                    return
                self.stats["checkpoint_tokens"] += r.num_computed - r.ckpt_tokens
                r.ckpt_tokens = r.num_computed

    def _store_lost(self, why: str) -> None:
        """The checkpoint store is gone: requests whose KV only it held fail; the others drop
        their (now useless) checkpoints and go on; checkpointing stops."""
        self.log(f"checkpoint store lost, checkpointing stops: {why}")
        for r in list(self.offline_queue) + list(self.running):
            if r.state == SWAPPED:
                self._fail(r, why)
            else:
                r.ckpt, r.ckpt_tokens = None, 0
        self.checkpointer.mode = "off"

    # ---- drivers ---------------------------------------------------------------------------

    def run_trace(self, requests, stop=None) -> None:
        """Replays `requests` at their arrival times on the virtual clock. Stops when all online
        requests are done and nothing runnable is left, or when `stop(self)` says so."""
        self.add_arrivals(requests)
        while True:
            if stop is not None and stop(self):
                break
            if self.step():
                continue
            if self._arrivals:
                self.clock.advance_to(self._arrivals[0][0])
                continue
            break  # nothing runnable and nothing left to arrive

    def serve_forever(self, stop_event: threading.Event) -> None:
        """Wall-clock serving loop (the HTTP server's engine thread)."""
        while not stop_event.is_set():
            if not self.step():
                with self.lock:
                    if not (self.online_queue or self.offline_queue or self.running):
                        self.wake.wait(timeout=0.05)
