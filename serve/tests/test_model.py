"""Model numerics: every layer of the engine against the straightforward reference decoder."""

import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from concerto.backend import NumpyBackend, torch_cuda_available  # noqa: E402
from concerto.config import TINY, make_weights  # noqa: E402
from concerto.engine import Engine  # noqa: E402
from concerto.kvcache import BlockAllocator, OutOfBlocks, slots_for  # noqa: E402
from concerto.model import SeqWork  # noqa: E402
from concerto.reference import ReferenceDecoder  # noqa: E402

PROMPT = [int(t) for t in np.random.default_rng(5).integers(0, 256, 19)]


def prefill_states(engine, prompt, chunks, key="s"):
    """Runs `prompt` through the engine in `chunks`; returns per-layer hidden rows of all tokens."""
    alloc = engine.cache.allocator
    table = alloc.alloc(alloc.blocks_for(len(prompt) + 8))
    rows = {l: [] for l in range(engine.cfg.n_layers)}
    pos, out = 0, None
    for c in chunks:
        out = engine.run_step([SeqWork(key, prompt[pos : pos + c], pos, table)],
                              observer=lambda l, x, w: rows[l].append(engine.backend.to_numpy(x)))
        pos += c
    return {l: np.concatenate(v) for l, v in rows.items()}, out, table


class TestNumerics(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ref = ReferenceDecoder(TINY)
        cls.ref_states = cls.ref.hidden_states(PROMPT)

    def test_each_layer_matches_reference(self):
        engine = Engine(TINY, num_blocks=32, block_size=8)
        states, out, _ = prefill_states(engine, PROMPT, [len(PROMPT)])
        for l in range(TINY.n_layers):
            np.testing.assert_allclose(states[l], self.ref_states[l], rtol=1e-4, atol=1e-4, err_msg=f"layer {l}")
        self.assertEqual(out.next_token["s"], int(np.argmax(self.ref.logits(PROMPT)[-1])))

    def test_chunked_prefill_matches_reference(self):
        engine = Engine(TINY, num_blocks=32, block_size=4)  # chunks straddle block boundaries
        states, _, _ = prefill_states(engine, PROMPT, [5, 1, 9, 4])
        for l in range(TINY.n_layers):
            np.testing.assert_allclose(states[l], self.ref_states[l], rtol=1e-4, atol=1e-4, err_msg=f"layer {l}")

    def test_greedy_decode_matches_reference(self):
        engine = Engine(TINY, num_blocks=32, block_size=8)
        _, out, table = prefill_states(engine, PROMPT, [len(PROMPT)])
        toks = [out.next_token["s"]]
        for i in range(7):
            toks.append(engine.run_step([SeqWork("s", [toks[-1]], len(PROMPT) + i, table)]).next_token["s"])
        self.assertEqual(toks, self.ref.generate(PROMPT, 8))

    def test_batching_keeps_each_sequence_result(self):
        """A sequence decodes the same tokens alone and batched with others (continuous batching)."""
        engine = Engine(TINY, num_blocks=64, block_size=8)
        alloc = engine.cache.allocator
        other = [3, 1, 4, 1, 5, 9, 2, 6]
        ta, tb = alloc.alloc(4), alloc.alloc(4)
        out = engine.run_step([SeqWork("a", PROMPT, 0, ta), SeqWork("b", other, 0, tb)])
        self.assertEqual(out.next_token["a"], self.ref.generate(PROMPT, 1)[0])
        self.assertEqual(out.next_token["b"], self.ref.generate(other, 1)[0])

    def test_rope_and_gqa_shapes(self):
        w = make_weights(TINY)
        self.assertEqual(w["layers.0.wk"].shape, (TINY.dim, TINY.n_kv_heads * TINY.head_dim))
        self.assertEqual(w["layers.0.wq"].shape, (TINY.dim, TINY.n_heads * TINY.head_dim))
        self.assertEqual(make_weights(TINY)["embed"].tobytes(), w["embed"].tobytes())  # deterministic

    def test_context_limit_is_an_error(self):
        engine = Engine(TINY, num_blocks=64, block_size=8)
        table = engine.cache.allocator.alloc(40)
        with self.assertRaisesRegex(ValueError, "context"):
            engine.run_step([SeqWork("s", [1] * 10, TINY.max_seq_len - 5, table)])


class TestPagedCache(unittest.TestCase):
    def test_allocator(self):
        a = BlockAllocator(4, 16)
        x = a.alloc(3)
        self.assertEqual(a.num_free, 1)
        with self.assertRaises(OutOfBlocks):
            a.alloc(2)
        a.free(x)
        self.assertEqual(a.num_free, 4)
        self.assertEqual(a.blocks_for(17), 2)

    def test_slots_follow_block_table(self):
        self.assertEqual(list(slots_for([7, 2], 2, 6, 4)), [30, 31, 8, 9])

    def test_read_write_tokens_roundtrip(self):
        engine = Engine(TINY, num_blocks=16, block_size=4)
        _, _, table = prefill_states(engine, PROMPT, [len(PROMPT)])
        data = engine.cache.read_tokens(table, 0, len(PROMPT))
        t2 = engine.cache.allocator.alloc(len(table))
        engine.cache.write_tokens(t2, 0, data)
        self.assertEqual(engine.cache.read_tokens(t2, 0, len(PROMPT)).tobytes(), data.tobytes())


@unittest.skipUnless(torch_cuda_available(), "torch with CUDA is not installed here: the PyTorch backend was NOT checked")
class TestTorchBackend(unittest.TestCase):
    def test_torch_matches_numpy(self):
        from concerto.backend import TorchBackend

        a = Engine(TINY, backend=NumpyBackend(), num_blocks=32, block_size=8)
        b = Engine(TINY, backend=TorchBackend(), num_blocks=32, block_size=8)
        sa, oa, _ = prefill_states(a, PROMPT, [7, 12])
        sb, ob, _ = prefill_states(b, PROMPT, [7, 12])
        for l in range(TINY.n_layers):
            np.testing.assert_allclose(sb[l], sa[l], rtol=1e-4, atol=1e-4)
        self.assertEqual(oa.next_token, ob.next_token)


if __name__ == "__main__":
    unittest.main()
