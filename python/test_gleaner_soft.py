"""Tests of the Python binding (python/gleaner_soft.py) over the real libgleaner_soft.so.

Run by crates/soft-capi/tests/python.rs (which sets GLEANER_SOFT_LIB), or by hand:
    GLEANER_SOFT_LIB=target/release/libgleaner_soft.so python3 python/test_gleaner_soft.py
"""

import os
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gleaner_soft  # noqa: E402
import sqlite_query_cache  # noqa: E402


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

    def test_sqlite_query_cache_stays_right_through_writes_and_a_shrink(self):
        report, orders = sqlite_query_cache.REPORT, ("orders",)
        with tempfile.TemporaryDirectory() as tmp, \
                gleaner_soft.Pool(lambda key: cache.rebuild(key), name="sqlite-test",
                                  capacity=64 << 20, limit=8 << 20) as pool:
            db = sqlite_query_cache.build(os.path.join(tmp, "t.db"), 20_000, 100, seed=3)
            cache = sqlite_query_cache.QueryCache(db, pool)

            def direct(c):
                return [list(r) for r in db.execute(report, (c,)).fetchall()]

            for _ in range(3):
                for c in range(100):
                    self.assertEqual(cache.query(report, (c,), orders), direct(c))
            s = pool.stats()
            self.assertEqual((s["misses"], s["hits"]), (100, 200))

            # A write is seen at once: the table's generation keys every result that reads it.
            before = cache.query(report, (7,), orders)
            cache.execute("INSERT INTO orders (customer, day, amount) VALUES (?, ?, ?)",
                          (7, 3, 1234.5), "orders")
            after = cache.query(report, (7,), orders)
            self.assertNotEqual(after, before)
            self.assertEqual(after, direct(7))

            # The grant goes to nothing: the results are rebuilt, never lost or wrong.
            pool.set_limit(0)
            deadline = time.time() + 5
            while pool.stats()["resident_bytes"] > 64 << 10 and time.time() < deadline:
                time.sleep(0.01)
            self.assertLessEqual(pool.stats()["resident_bytes"], 64 << 10)
            misses = pool.stats()["misses"]
            for c in range(100):
                self.assertEqual(cache.query(report, (c,), orders), direct(c))
            self.assertGreaterEqual(pool.stats()["misses"], misses + 100)
            db.close()

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
