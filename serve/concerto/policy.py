"""Scheduling decisions, pure: budgets, batch plans, victims, checkpoint selection.

Nothing here touches the engine, the clock or the cache: every function takes the requests'
current fields and returns a decision, so the policy is unit-tested on its own and shared by the
real scheduler and the simulator. Algorithms are the dissertation's (Qiao, dissertation 2024,
ch. 6, Algorithms 1-3) with the corrections noted in docs/concerto.md:

* Algorithm 3's early exit is taken when the estimate MEETS the TTFT objective (`<=`), and it
  returns (the printed `>` / `break` outside a loop contradict the prose).
* Algorithm 2's remaining budget GROWS when a request is removed (printed as `tau - tokens`).
* Algorithm 1 recomputes the budget every iteration.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .latency import BatchShape, LatencyModel

CONCERTO, NAIVE, ONLINE_ONLY, OFFLINE_ONLY = "concerto", "naive", "online-only", "offline-only"


@dataclass(frozen=True)
class SLO:
    """Online latency objectives, seconds: p99 time to first token and time per output token."""

    ttft: float
    tpot: float


@dataclass(frozen=True)
class SystemConfig:
    """One of the four systems compared. `budget`: SLO-derived token budget (Algorithm 1);
    `preempt`: preemption of offline work at scheduling (Algorithm 2) and in a running batch at
    layer safepoints (Algorithm 3); `checkpoint`: off, always or adaptive (6.4.4)."""

    name: str = CONCERTO
    budget: bool = True
    preempt: bool = True
    checkpoint: str = "adaptive"
    max_batch_tokens: int = 128
    max_batch_seqs: int = 64
    safety: float = 0.75  # aim at this fraction of an SLO (latency model error; future prefill steps)
    checkpoint_threshold: float = 0.5  # adaptive: start when this fraction of KV blocks is used

    @staticmethod
    def named(name: str, **kw) -> "SystemConfig":
        if name == CONCERTO:
            return SystemConfig(CONCERTO, **kw)
        if name == NAIVE:  # vLLM++: online-first priority, offline batched greedily, no preemption
            return SystemConfig(NAIVE, budget=False, preempt=False, checkpoint="off", **kw)
        if name in (ONLINE_ONLY, OFFLINE_ONLY):  # the same scheduler, fed one kind of request
            return SystemConfig(name, **kw)
        raise ValueError(f"unknown system {name!r}")


def tpot_allowance(online_decoding, tpot: float, now: float) -> float:
    """The longest next step that still lets every decoding online request finish with a mean
    time per output token within `tpot`, if every later step took as long (gleaner refinement:
    a request's TPOT is a mean over steps that include other requests' long prefill chunks, so
    holding each step to `tpot` alone does not hold the mean). Never above `tpot`, never below 0."""
    allow = tpot
    for r in online_decoding:
        left = max(r.max_tokens - len(r.output), 1)
        spent = now - r.first_token_time
        allow = min(allow, (tpot * (r.max_tokens - 1) - spent) / left)
    return max(allow, 0.0)


def step_target(slo: SLO | None, has_online_decode: bool, oldest_online_wait: float | None, safety: float,
                tpot_left: float | None = None) -> float | None:
    """The step latency the next batch must meet (calc_budget's objective, 6.4.5): the TPOT
    objective if the batch holds a decode-phase request while online work is present
    (`has_online_decode`), and the TTFT objective less what the oldest waiting online request
    has already waited; the smaller. None when no online request is present (offline batching
    mode: no budget). `tpot_left`: `tpot_allowance` of the decoding online requests."""
    if slo is None or (not has_online_decode and oldest_online_wait is None):
        return None
    targets = []
    if has_online_decode:
        targets.append(slo.tpot if tpot_left is None else min(slo.tpot, tpot_left))
    if oldest_online_wait is not None:
        targets.append(max(slo.ttft - oldest_online_wait, 0.0))
    return safety * min(targets)


@dataclass(frozen=True)
class Budget:
    """calc_budget's answer for reporting: most tokens of one chunk and most decode requests
    that a step may hold within `target` seconds."""

    target: float | None
    tokens: int
    seqs: int


def calc_budget(latency: LatencyModel, target: float | None, cfg: SystemConfig, context: int = 128) -> Budget:
    if target is None:
        return Budget(None, cfg.max_batch_tokens, cfg.max_batch_seqs)
    tokens = latency.max_tokens_within(BatchShape(), target, 0, cfg.max_batch_tokens, True)
    seqs = 0
    while seqs < cfg.max_batch_seqs and latency.estimate(BatchShape(seqs + 1, seqs + 1, (seqs + 1) * context, (seqs + 1) * context)) <= target:
        seqs += 1
    return Budget(target, tokens, seqs)


def chunk_shape(req, n: int, new_seq: bool = True) -> BatchShape:
    start = req.num_computed
    return BatchShape(n, 1 if new_seq else 0, start + n, n * (start + n))


@dataclass
class Plan:
    """A batch: (request, tokens) pairs, and the running offline requests to preempt."""

    items: list = field(default_factory=list)
    preempt: list = field(default_factory=list)
    shape: BatchShape = BatchShape()
    target: float | None = None
    blocks: int = 0  # KV blocks the plan needs beyond what its requests hold

    @property
    def tokens(self) -> int:
        return self.shape.tokens

    def add(self, req, n, blocks):
        self.items.append((req, n))
        self.shape = self.shape + chunk_shape(req, n)
        self.blocks += blocks


def blocks_needed(req, n: int, block_size: int) -> int:
    return max(0, -(-(req.num_computed + n) // block_size) - len(req.blocks))


def plan_batch(online_running, online_queue, offline_running, offline_queue, latency: LatencyModel,
               target: float | None, cfg: SystemConfig, free_blocks: int, block_size: int, restore_cost=None) -> Plan:
    """Algorithm 1 (one iteration) with Algorithm 2, as a pure plan.

    Online work goes first: running online requests, then queued ones in arrival order, in
    chunks limited only by the engine's batch limits (offline tokens never displace it). Then
    running offline requests, oldest admitted first, while the step stays within budget: the
    ones that do not fit (the most recently admitted) are preempted (Algorithm 2), unless the
    system does not preempt (naive), which keeps them all. Then queued offline requests fill
    what budget remains; with no online work in the batch the budget is lifted (offline
    batching mode) up to the engine's batch limits. A swapped request's restore (its KV copied
    back from the checkpoint store before the step, `restore_cost(req)` seconds) counts against
    the budget too: a restore that does not fit waits for a step that has room (the same rule
    caps swap-ins, 6.4.5). `free_blocks` counts KV blocks free or
    reclaimable from preempted requests; running offline requests' blocks are freed for online
    work if needed (Algorithm 2's memory condition).
    """
    plan = Plan(target=target)
    budgeted = cfg.budget and target is not None
    free = free_blocks

    def fits(shape, seqs_after):
        if shape.tokens > cfg.max_batch_tokens or seqs_after > cfg.max_batch_seqs:
            return False
        return not budgeted or latency.estimate(shape) <= target

    def chunk(req, room_shape, budget_applies=True):
        """Tokens of `req` to run this step given the batch so far (0: does not fit)."""
        limit = min(req.remaining, cfg.max_batch_tokens - room_shape.tokens)
        if limit <= 0 or room_shape.seqs + 1 > cfg.max_batch_seqs:
            return 0
        if not budgeted or not budget_applies:
            return limit
        if req.remaining == 1:
            return 1 if fits(room_shape + chunk_shape(req, 1), room_shape.seqs + 1) else 0
        return latency.max_tokens_within(room_shape, target, req.num_computed, limit, True)

    # Online first, as the online-only system would run it: the budget is what is left of the
    # step's target for offline tokens, it never shortens online chunks (from which the SLOs
    # were measured).
    offline_blocks = sum(len(r.blocks) for r in offline_running)
    for req in list(online_running) + list(online_queue):
        n = chunk(req, plan.shape, budget_applies=False)
        if n == 0:
            break
        need = blocks_needed(req, n, block_size)
        if need > free + offline_blocks:
            break
        free -= need
        plan.add(req, n, need)
    # Online work short of blocks takes them from running offline requests, most recently
    # admitted first (Algorithm 2's memory condition).
    offline_running = sorted(offline_running, key=lambda r: r.admitted)
    while free < 0 and offline_running and cfg.preempt:
        victim = offline_running.pop()
        plan.preempt.append(victim)
        free += len(victim.blocks)

    # Running offline requests, oldest admitted first; those that no longer fit the budget
    # (the most recently admitted) are preempted (Algorithm 2).
    for req in offline_running:
        if not cfg.preempt:
            n = min(req.remaining, max(cfg.max_batch_tokens - plan.tokens, 1))
            need = blocks_needed(req, n, block_size)
            free -= need
            plan.add(req, n, need)
            continue
        n = chunk(req, plan.shape)
        need = blocks_needed(req, n, block_size) if n else 0
        if n == 0 or need > free:
            plan.preempt.append(req)
            free += len(req.blocks)
            continue
        free -= need
        plan.add(req, n, need)

    # Queued offline requests fill the rest.
    restoring = 0.0
    for req in offline_queue:
        n = chunk(req, plan.shape)
        if n == 0:
            break
        cost = restore_cost(req) if restore_cost is not None else 0.0
        if budgeted and cost and latency.estimate(plan.shape + chunk_shape(req, n)) + restoring + cost > target:
            continue
        restoring += cost
        need = blocks_needed(req, n, block_size)
        if need > free:
            break
        free -= need
        plan.add(req, n, need)
    return plan


def victims_for_arrival(batch_items, online_queue, latency: LatencyModel, ttft: float, elapsed: float) -> list:
    """Algorithm 3: on an online arrival, which offline requests of the running batch to drop.

    `batch_items`: the running batch's (request, tokens); `elapsed`: time since it was scheduled.
    If the rest of the batch plus the queued online work meets the TTFT objective, nothing;
    else offline requests are removed, most recently admitted first, until it does (or none is
    left)."""

    def est(items):
        return latency.estimate(BatchShape.of((n, r.num_computed) for r, n in items))

    queued = [(r, r.remaining) for r in online_queue]
    items = list(batch_items)

    def meets():
        t_remain = max(est(items) - elapsed, 0.0)
        return t_remain + est(queued + items) <= ttft

    if meets():
        return []
    victims = []
    for req, n in sorted([it for it in items if not it[0].online], key=lambda it: -it[0].admitted):
        items.remove((req, n))
        victims.append(req)
        if meets():
            break
    return victims


class AdaptiveCheckpointer:
    """Which running offline requests to checkpoint incrementally after a step (6.4.4).

    `always`: all; `off`: none; `adaptive` (RED-style): none while less than `threshold` of the
    KV blocks are in use; above it, start with one request and add one more each step that
    usage keeps climbing. Most recently admitted first: those are the first Algorithm 2
    preempts."""

    def __init__(self, mode: str = "adaptive", threshold: float = 0.5):
        if mode not in ("off", "always", "adaptive"):
            raise ValueError("checkpoint mode must be off, always or adaptive")
        self.mode, self.threshold = mode, threshold
        self.count = 0
        self.last_used = 0.0

    def select(self, offline_running, used_fraction: float) -> list:
        ordered = sorted(offline_running, key=lambda r: -r.admitted)
        if self.mode == "off":
            return []
        if self.mode == "always":
            return ordered
        if used_fraction < self.threshold:
            self.count = 0
        elif self.count == 0:
            self.count = 1
        elif used_fraction > self.last_used:
            self.count += 1
        self.last_used = used_fraction
        # Requests already being checkpointed stay so (their copy must stay current).
        chosen = [r for r in ordered if r.ckpt is not None]
        for r in ordered:
            if len(chosen) >= max(self.count, len(chosen)):
                break
            if r.ckpt is None:
                chosen.append(r)
        return chosen
