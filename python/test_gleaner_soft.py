"""Tests of the Python binding (python/gleaner_soft.py) over the real libgleaner_soft.so.

Run by crates/soft-capi/tests/python.rs (which sets GLEANER_SOFT_LIB), or by hand:
    GLEANER_SOFT_LIB=target/release/libgleaner_soft.so python3 python/test_gleaner_soft.py
"""

import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gleaner_soft  # noqa: E402


def value_of(args):
    return (args * 1000)[:5000] if args else None


class BindingTest(unittest.TestCase):
    def test_map_and_pointer_hits_misses_and_shrink(self):
        calls = []

        def recon(args):
            calls.append(args)
            return value_of(args)

        with gleaner_soft.Pool(recon, name="py", capacity=64 << 20, limit=8 << 20, verify=True) as pool:
            m = gleaner_soft.SoftMap(pool)
            for _ in range(2):
                for i in range(300):
                    k = b"k%d" % i
                    self.assertEqual(m.get(k), value_of(k))
            s = pool.stats()
            self.assertEqual(s["misses"], 300)
            self.assertEqual(s["hits"], 300)
            self.assertEqual(len(calls), 300 + 300)  # verify mode re-ran it on every hit
            self.assertEqual(s["verify_mismatches"], 0)

            p = gleaner_soft.SoftPtr(pool)
            self.assertFalse(p.present())
            self.assertTrue(p.write(b"x" * 10000))  # longer than the first buffer
            self.assertEqual(p.read(b"ignored"), b"x" * 10000)

            # The grant goes to nothing: memory comes back, and reads rebuild.
            pool.set_limit(0)
            deadline = time.time() + 5
            while pool.stats()["resident_bytes"] > 64 << 10 and time.time() < deadline:
                time.sleep(0.01)
            self.assertLessEqual(pool.stats()["resident_bytes"], 64 << 10)
            self.assertFalse(p.present())
            self.assertEqual(p.read(b"ab"), value_of(b"ab"))

    def test_a_failing_reconstructor_raises_lookup_error(self):
        def recon(args):
            raise ValueError("no")

        with gleaner_soft.Pool(recon, capacity=8 << 20) as pool:
            with self.assertRaises(LookupError):
                gleaner_soft.SoftMap(pool).get(b"k")
            with self.assertRaises(LookupError):
                gleaner_soft.SoftPtr(pool).read(b"")


if __name__ == "__main__":
    unittest.main(verbosity=2)
