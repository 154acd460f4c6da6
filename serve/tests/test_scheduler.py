"""The scheduler: policy invariants, layer-level preemption, checkpoint/restore bit-exact, and a
checkpoint whose memnode dies failing its request loudly."""

import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from concerto.config import TINY  # noqa: E402
from concerto.engine import Engine  # noqa: E402
from concerto.executor import EngineExecutor, SimExecutor, VirtualClock  # noqa: E402
from concerto.latency import BatchShape, ProfiledLatency  # noqa: E402
from concerto.memnode import Memnode, find_memnode_bin  # noqa: E402
from concerto.policy import SLO, AdaptiveCheckpointer, SystemConfig, calc_budget, plan_batch, step_target, victims_for_arrival  # noqa: E402
from concerto.request import FAILED, FINISHED, OFFLINE, ONLINE, Request  # noqa: E402
from concerto.scheduler import Scheduler  # noqa: E402
from concerto.store import FarStore, HostStore, find_libgleaner  # noqa: E402

# A latency model with round numbers: 1 ms per step, 0.1 ms per token, 0.2 ms per sequence.
LAT = ProfiledLatency([1e-3, 1e-4, 2e-4, 0.0, 0.0], [], n_layers=2)


def req(kind, n_prompt, max_tokens=4, arrival=0.0, computed=0, output=(), admitted=-1):
    r = Request(prompt=list(range(1, n_prompt + 1)), max_tokens=max_tokens, kind=kind, arrival=arrival)
    r.num_computed, r.output, r.admitted = computed, list(output), admitted
    return r


class TestPolicy(unittest.TestCase):
    cfg = SystemConfig.named("concerto", max_batch_tokens=64, max_batch_seqs=8)

    def test_step_target(self):
        slo = SLO(ttft=0.1, tpot=0.01)
        self.assertIsNone(step_target(slo, False, None, 1.0))  # no online work: offline batching mode
        self.assertAlmostEqual(step_target(slo, True, None, 1.0), 0.01)
        self.assertAlmostEqual(step_target(slo, False, 0.04, 1.0), 0.06)  # TTFT less the wait so far
        self.assertAlmostEqual(step_target(slo, True, 0.04, 0.5), 0.005)

    def test_budget_respected_and_online_first(self):
        on = req(ONLINE, 20)
        offs = [req(OFFLINE, 30) for _ in range(4)]
        target = 0.006  # 1 ms + 0.2 ms/seq + 0.1 ms/token: room for 38 tokens in two sequences
        plan = plan_batch([], [on], [], offs, LAT, target, self.cfg, free_blocks=100, block_size=16)
        self.assertIs(plan.items[0][0], on)
        self.assertEqual(plan.items[0][1], 20)
        self.assertLessEqual(LAT.estimate(plan.shape), target)
        self.assertGreater(len(plan.items), 1)  # offline filled what the budget left
        self.assertLessEqual(plan.tokens, self.cfg.max_batch_tokens)

    def test_online_never_displaced_by_offline(self):
        on = req(ONLINE, 60)
        plan = plan_batch([], [on], [], [req(OFFLINE, 30)], LAT, 0.001, self.cfg, 100, 16)
        self.assertEqual(plan.items, [(on, 60)])  # over the target alone: no offline at all

    def test_offline_batching_mode_lifts_budget(self):
        offs = [req(OFFLINE, 30) for _ in range(4)]
        plan = plan_batch([], [], [], offs, LAT, None, self.cfg, 100, 16)
        self.assertEqual(plan.tokens, 64)  # the engine's batch limit, not an SLO

    def test_algorithm2_preempts_most_recent_offline(self):
        running = [req(OFFLINE, 8, computed=8, output=[1], admitted=i) for i in range(6)]
        on = req(ONLINE, 10)
        target = 1e-3 + 0.2e-3 * 3 + 0.1e-3 * 12 + 1e-6  # online chunk + two offline decodes
        plan = plan_batch([], [on], running, [], LAT, target, self.cfg, 100, 16)
        kept = [r for r, _ in plan.items if not r.online]
        self.assertEqual([r.admitted for r in kept], [0, 1])
        self.assertEqual(sorted(r.admitted for r in plan.preempt), [2, 3, 4, 5])
        self.assertLessEqual(LAT.estimate(plan.shape), target)

    def test_naive_never_preempts(self):
        naive = SystemConfig.named("naive", max_batch_tokens=64, max_batch_seqs=8)
        running = [req(OFFLINE, 8, computed=8, output=[1], admitted=i) for i in range(6)]
        plan = plan_batch([], [req(ONLINE, 10)], running, [], LAT, 1e-3, naive, 100, 16)
        self.assertEqual(plan.preempt, [])
        self.assertEqual(len(plan.items), 7)

    def test_algorithm3_victims(self):
        offs = [(req(OFFLINE, 40, admitted=i), 40) for i in range(3)]
        on = req(ONLINE, 10)
        # Loose objective: the estimate meets it, nobody is preempted (the corrected early exit).
        self.assertEqual(victims_for_arrival(offs, [on], LAT, ttft=1.0, elapsed=0.0), [])
        # Tight: victims go most recently admitted first, until the estimate meets it.
        v = victims_for_arrival(offs, [on], LAT, ttft=0.0135, elapsed=0.0)
        self.assertEqual([r.admitted for r in v], [2, 1])
        # Impossible: every offline request goes.
        self.assertEqual(len(victims_for_arrival(offs, [on], LAT, ttft=1e-6, elapsed=0.0)), 3)

    def test_tpot_allowance_keeps_the_mean(self):
        from concerto.policy import tpot_allowance

        r = req(ONLINE, 4, max_tokens=11, output=[1, 2, 3])
        r.first_token_time = 0.0
        # 10 intervals of 10 ms allowed; 50 ms spent on 2; 8 tokens left: 50 / 8 ms per step.
        self.assertAlmostEqual(tpot_allowance([r], 0.01, now=0.05), 0.05 / 8)
        self.assertAlmostEqual(tpot_allowance([r], 0.01, now=0.0), 0.01)  # never above the objective
        self.assertEqual(tpot_allowance([r], 0.01, now=1.0), 0.0)  # already late: no room for offline

    def test_restore_counts_against_the_budget(self):
        on = req(ONLINE, 10)
        swapped = req(OFFLINE, 20, computed=16)
        swapped.state = "swapped"
        fresh = req(OFFLINE, 20)
        target = 0.006
        plan = plan_batch([], [on], [], [swapped, fresh], LAT, target, self.cfg, 100, 16,
                          restore_cost=lambda r: 0.005 if r is swapped else 0.0)
        self.assertNotIn(swapped, [r for r, _ in plan.items])  # its 5 ms restore does not fit
        self.assertIn(fresh, [r for r, _ in plan.items])
        plan = plan_batch([], [], [], [swapped], LAT, None, self.cfg, 100, 16, restore_cost=lambda r: 0.005)
        self.assertIn(swapped, [r for r, _ in plan.items])  # offline batching mode: no budget

    def test_calc_budget(self):
        b = calc_budget(LAT, 0.005, self.cfg)
        self.assertEqual(b.tokens, 38)  # 1 + 0.2 + 0.1 * 38 = 5.0 ms
        self.assertLessEqual(LAT.estimate(BatchShape(b.seqs, b.seqs, 0, 0)), 0.005)

    def test_adaptive_checkpointing_ramps(self):
        c = AdaptiveCheckpointer("adaptive", 0.5)
        rs = [req(OFFLINE, 8, admitted=i) for i in range(5)]
        self.assertEqual(c.select(rs, 0.3), [])
        self.assertEqual([r.admitted for r in c.select(rs, 0.55)], [4])
        self.assertEqual(len(c.select(rs, 0.6)), 2)
        self.assertEqual(len(c.select(rs, 0.7)), 3)
        self.assertEqual(len(AdaptiveCheckpointer("always").select(rs, 0.0)), 5)


def engine_scheduler(system="concerto", store=None, slo=None, num_blocks=64, **kw):
    engine = Engine(TINY, num_blocks=num_blocks, block_size=8)
    clock = VirtualClock()
    ex = EngineExecutor(engine, clock, store)
    cfg = SystemConfig.named(system, **kw)
    return Scheduler(cfg, ex, clock, LAT, slo=slo, max_context=TINY.max_seq_len, log=lambda m: None), engine


def offline_reqs(n, seed=7, prompt=(20, 40), max_tokens=12):
    rng = np.random.default_rng(seed)
    return [Request(prompt=[int(t) for t in rng.integers(0, 256, int(rng.integers(*prompt)))], max_tokens=max_tokens,
                    kind=OFFLINE, rid=f"off-{i}") for i in range(n)]


class TestLayerPreemption(unittest.TestCase):
    def test_online_waits_at_most_one_layer_behind_offline(self):
        """An online arrival whose TTFT no offline work in the running batch leaves room for
        gets all of it dropped at the very next layer safepoint."""
        sched, engine = engine_scheduler(slo=SLO(ttft=1e-4, tpot=0.05), checkpoint="off")
        sched.record = True
        for r in offline_reqs(6, prompt=(30, 40)):
            sched.submit(r)
        online = Request(prompt=[5] * 10, max_tokens=3, kind=ONLINE, rid="on")
        sched.step()  # offline batching mode: a big offline batch
        arrived = {}

        def arrive(layer):  # the online request arrives while layer 0 runs
            if layer == 0 and "at" not in arrived:
                arrived["at"] = layer
                sched.submit(online)
            return orig(layer)

        orig, sched._safepoint = sched._safepoint, arrive
        sched.step()
        last = sched.trace[-1]
        self.assertEqual(last["layers"], 1, "the offline batch ran past the first safepoint")
        self.assertEqual(len(last["dropped"]), len(last["items"]))
        sched._safepoint = orig
        sched.step()
        self.assertEqual(sched.trace[-1]["items"][0][0], "on")  # next batch: the online request first
        self.assertEqual(sched.stats["preempted_at_safepoint"], len(last["dropped"]))

    def test_partial_preemption_meets_the_estimate(self):
        """With room for some offline work, Algorithm 3 drops the most recently admitted until
        the rest of the batch plus the online request is estimated to meet the objective."""
        sched, _ = engine_scheduler(slo=SLO(ttft=0.005, tpot=0.05), checkpoint="off")
        sched.record = True
        for r in offline_reqs(6, prompt=(30, 40)):
            sched.submit(r)
        sched.step()
        orig = sched._safepoint
        seen = {}

        def arrive(layer):
            sched.submit(Request(prompt=[5] * 10, max_tokens=3, kind=ONLINE))
            seen["current"] = list(sched.current)
            seen["elapsed"] = sched.clock.now() - sched.t_sched
            return orig(layer)

        sched._safepoint = arrive
        sched.step()
        rec = sched.trace[-1]
        self.assertTrue(rec["dropped"])
        kept = [(r, n) for r, n in seen["current"] if r.rid not in rec["dropped"]]
        dropped = [r for r, _ in seen["current"] if r.rid in rec["dropped"]]
        self.assertGreater(min(r.admitted for r in dropped), max(r.admitted for r, _ in kept))
        est = LAT.estimate(BatchShape.of((n, r.num_computed - n) for r, n in kept))
        on = BatchShape.of([(10, 0)])
        self.assertLessEqual(max(est - seen["elapsed"], 0) + LAT.estimate(BatchShape.of((n, r.num_computed - n) for r, n in kept) + on), 0.005 * sched.system.safety)

    def test_loose_slo_lets_the_batch_finish(self):
        sched, _ = engine_scheduler(slo=SLO(ttft=10.0, tpot=10.0), checkpoint="off")
        sched.record = True
        for r in offline_reqs(4):
            sched.submit(r)
        sched.step()
        orig = sched._safepoint
        sched._safepoint = lambda l: (sched.submit(Request(prompt=[1, 2], max_tokens=2, kind=ONLINE)) if l == 0 else None, orig(l))[1]
        sched.step()
        self.assertEqual(sched.trace[-1]["layers"], TINY.n_layers)
        self.assertEqual(sched.trace[-1]["dropped"], [])

    def test_budget_respected_in_every_step_with_online_present(self):
        """In the simulator: every step holding online work stays within the target budget
        (estimated), unless online work alone exceeds it."""
        clock = VirtualClock()
        ex = SimExecutor(LAT, clock, num_blocks=400, block_size=16)
        slo = SLO(ttft=0.05, tpot=0.006)
        sched = Scheduler(SystemConfig.named("concerto", max_batch_tokens=64), ex, clock, LAT, slo=slo, log=lambda m: None)
        sched.record = True
        rng = np.random.default_rng(3)
        onl = [Request(prompt=[1] * int(rng.integers(4, 30)), max_tokens=8, kind=ONLINE, arrival=float(t))
               for t in np.cumsum(rng.exponential(0.01, 40))]
        offl = [Request(prompt=[1] * 40, max_tokens=20, kind=OFFLINE) for _ in range(60)]
        sched.run_trace(onl + offl, stop=lambda s: all(r.done for r in onl))
        checked = 0
        for rec in sched.trace:
            on_tokens = sum(n for _, k, n in rec["items"] if k == ONLINE)
            off_tokens = sum(n for _, k, n in rec["items"] if k == OFFLINE)
            if on_tokens and off_tokens:
                checked += 1
                self.assertLessEqual(off_tokens + on_tokens, 64)
        self.assertGreater(checked, 5)
        self.assertTrue(all(r.state == FINISHED for r in onl))
        p99_tpot = np.percentile([r.tpot for r in onl if r.tpot], 99)
        self.assertLessEqual(p99_tpot, slo.tpot)


def run_offline(sched, reqs, preempt_at=None):
    """Runs offline `reqs` to completion; at step `preempt_at`, every running request is
    preempted and its KV blocks reclaimed (so it must come back from its checkpoint)."""
    for r in reqs:
        sched.submit(r)
    steps = 0
    while sched.step():
        steps += 1
        if steps == preempt_at:
            for r in list(sched.running):
                sched._preempt(r)
            for r in list(sched.offline_queue):
                if r.blocks:
                    sched._reclaim(r)
    return {r.rid: list(r.output) for r in reqs}


class TestCheckpointRestore(unittest.TestCase):
    def uninterrupted(self):
        sched, _ = engine_scheduler(checkpoint="off")
        return run_offline(sched, offline_reqs(5))

    def test_restore_is_bit_exact_host_store(self):
        want = self.uninterrupted()
        sched, engine = engine_scheduler(store=HostStore(256, 8, Engine(TINY, num_blocks=1).cache.token_bytes), checkpoint="always")
        reqs = offline_reqs(5)
        got = run_offline(sched, reqs, preempt_at=4)
        self.assertEqual(got, want)
        self.assertGreater(sched.stats["restores"], 0)
        self.assertEqual(sched.stats["reclaimed_discarded"], 0)
        self.assertEqual(sum(r.recomputed_tokens for r in reqs), 0)  # restored, not recomputed

    def test_restored_kv_is_byte_identical(self):
        store = HostStore(64, 8, Engine(TINY, num_blocks=1).cache.token_bytes)
        sched, engine = engine_scheduler(store=store, checkpoint="always")
        r = offline_reqs(1)[0]
        sched.submit(r)
        for _ in range(4):
            sched.step()
        before = engine.cache.read_tokens(r.blocks, 0, r.num_computed).tobytes()
        sched._preempt(r)
        sched._reclaim(r)
        sched.step()  # admits it again: restore, then one decode step
        self.assertEqual(r.restores, 1)
        self.assertEqual(engine.cache.read_tokens(r.blocks, 0, len(before) // engine.cache.token_bytes).tobytes(), before)

    def test_without_checkpoint_it_recomputes_same_tokens(self):
        want = self.uninterrupted()
        sched, _ = engine_scheduler(checkpoint="off")
        reqs = offline_reqs(5)
        self.assertEqual(run_offline(sched, reqs, preempt_at=4), want)
        self.assertGreater(sum(r.recomputed_tokens for r in reqs), 0)


FAR_READY = find_libgleaner() is not None and find_memnode_bin() is not None


@unittest.skipUnless(FAR_READY, "libgleaner.so or the memnode binary is not built (cargo build --release -p gleaner-capi -p gleaner-memnode): far-memory checkpoints NOT tested")
class TestFarMemoryCheckpoint(unittest.TestCase):
    def far_store(self, memnode, slots=512):
        tb = Engine(TINY, num_blocks=1).cache.token_bytes
        # A local budget far below the checkpoints' size: most of their pages live on the memnode.
        return FarStore(slots, 8, tb, memnode=memnode.addr, token_file=memnode.token_file, local_budget=320 * 1024)

    def test_restore_through_far_memory_is_bit_exact(self):
        want = TestCheckpointRestore.uninterrupted(self)
        with Memnode("64M", lease=1) as m:
            store = self.far_store(m)
            try:
                sched, _ = engine_scheduler(store=store, checkpoint="always")
                got = run_offline(sched, offline_reqs(5), preempt_at=4)
            finally:
                store.close()
        self.assertEqual(got, want)
        self.assertGreater(sched.stats["restores"], 0)
        self.assertGreater(store.bytes_read, 0)

    def test_memnode_killed_fails_that_request_loudly(self):
        with Memnode("64M", lease=1) as m:
            store = self.far_store(m)
            logs = []
            sched, _ = engine_scheduler(store=store, checkpoint="always", num_blocks=400)
            sched.log = logs.append
            # About 1.3 MiB of checkpointed KV, four times the keeper's local budget: most of
            # it lives only on the memnode.
            victims = [Request(prompt=[7 + i] * 200, max_tokens=30, kind=OFFLINE, rid=f"victim-{i}") for i in range(12)]
            for v in victims:
                sched.submit(v)
            while any(v.num_computed < 200 for v in victims):
                sched.step()
            self.assertTrue(all(v.ckpt_tokens >= 200 for v in victims))
            for v in victims:
                sched._preempt(v)
                sched._reclaim(v)  # their KV now lives only in the checkpoint store
            m.kill()
            other = Request(prompt=[9] * 12, max_tokens=5, kind=OFFLINE, rid="other")
            sched.submit(other)
            while sched.step():
                pass
            store.close()
        # A victim whose KV was still resident in the keeper may finish, with the right tokens;
        # the others fail, loudly, and none finishes on made-up KV.
        ref, _ = engine_scheduler(checkpoint="off", num_blocks=400)
        want = run_offline(ref, [Request(prompt=list(v.prompt), max_tokens=30, kind=OFFLINE, rid=v.rid) for v in victims])
        failed = [v for v in victims if v.state == FAILED]
        self.assertTrue(failed)
        for v in victims:
            if v.state == FAILED:
                self.assertIn("checkpoint lost", v.error)
                self.assertLess(len(v.output), v.max_tokens)
            else:
                self.assertEqual(v.output, want[v.rid], v.rid)
        self.assertTrue(any("exit status 86" in v.error for v in failed))  # gleaner stopped the keeper
        self.assertTrue(any("FAILED" in line for line in logs))
        self.assertEqual(other.state, FINISHED)  # the rest of the service goes on
        self.assertEqual(len(other.output), 5)


if __name__ == "__main__":
    unittest.main()
