#!/usr/bin/env python3
"""A cache of query results in front of sqlite, in soft memory (issue 46's third application).

    python3 python/sqlite_query_cache.py [--rows N] [--customers C] [--queries Q] [--zipf S]
        [--write-every W] [--check-every K] [--limit BYTES] [--node auto|SOCKET] [--verify]

The program builds an sqlite database (a file in a temporary directory: `orders`, N rows over C
customers and 365 days, an index on the customer) and answers Q report queries (one customer's
sales day by day, the customer drawn from a Zipf distribution of exponent S) through a
:class:`QueryCache`: a soft hash map from the query to its serialised result, whose reconstructor
runs the query. Under memory pressure the node daemon (``--node``) or a smaller grant takes the
cache's memory; the lost results are then misses that run their query again: the program slows
down instead of paging or being killed.

Results never go stale: every write to a table bumps that table's generation, which is part of
every key that reads it, so a result computed before the write is never found again (it ages out,
coldest first). With ``--write-every W`` one order in W queries is inserted. Every K-th query's
result (``--check-every``, 1 = every one) is compared with the query run directly; a difference is
counted in ``bad``.

Prints one JSON line: queries, hits, misses, queries per second with the cache and (over the
same queries, before the cached phase) without it, the pool's counters, and ``bad``. Exit status:
0 if every checked result was right, 3 if any was not, 2 on bad flags.
"""

import argparse
import bisect
import json
import marshal
import os
import random
import sqlite3
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gleaner_soft  # noqa: E402

# A result's first read buffer: most fit (a larger one is read again into a buffer its size).
RESULT_ROOM = 64 << 10
REPORT = ("SELECT day, COUNT(*), SUM(amount), MAX(amount) FROM orders "
          "WHERE customer = ? GROUP BY day ORDER BY day")


class QueryCache:
    """Query results of one sqlite connection, cached in soft memory.

    ``query(sql, params, tables)`` returns the rows ``sql`` gives (lists of values), from the
    cache when it holds them; ``tables`` names the tables the query reads, whose generations key
    the result. ``execute(sql, params, table)`` runs a write and bumps ``table``'s generation.
    """

    def __init__(self, db, pool):
        self.db = db
        self.generations = {}
        self.map = gleaner_soft.SoftMap(pool)

    def _key(self, sql, params, tables):
        gens = [[t, self.generations.get(t, 0)] for t in sorted(tables)]
        return json.dumps([sql, list(params), gens], separators=(",", ":")).encode()

    def rebuild(self, key):
        """The reconstructor: runs the query a key names."""
        sql, params, _gens = json.loads(key)
        return serialise(self.db.execute(sql, params).fetchall())

    def query(self, sql, params=(), tables=()):
        return marshal.loads(self.map.get(self._key(sql, params, tables), bufsize=RESULT_ROOM))

    def execute(self, sql, params, table):
        self.db.execute(sql, params)
        self.db.commit()
        self.generations[table] = self.generations.get(table, 0) + 1


def serialise(rows):
    """A result as bytes: `marshal` (values of sqlite's types only; fast both ways)."""
    return marshal.dumps([list(r) for r in rows])


def build(path, rows, customers, seed):
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer INTEGER, day INTEGER, "
               "amount REAL)")
    rng = random.Random(seed)
    db.executemany("INSERT INTO orders (customer, day, amount) VALUES (?, ?, ?)",
                   ((rng.randrange(customers), rng.randrange(365), round(rng.uniform(1, 500), 2))
                    for _ in range(rows)))
    db.execute("CREATE INDEX orders_customer ON orders (customer)")
    db.commit()
    return db


class Zipf:
    """Ranks 0..n-1 drawn with probability proportional to 1 / (rank + 1) ** s."""

    def __init__(self, n, s, rng):
        acc, self.cdf = 0.0, []
        for k in range(n):
            acc += 1.0 / (k + 1) ** s
            self.cdf.append(acc)
        self.rng = rng

    def draw(self):
        return min(bisect.bisect_left(self.cdf, self.rng.random() * self.cdf[-1]), len(self.cdf) - 1)


def size(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower()
    return int(t[:-1]) * units[t[-1]] if t and t[-1] in units else int(t)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--customers", type=int, default=2_000)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--zipf", type=float, default=0.9)
    ap.add_argument("--write-every", type=int, default=0, help="insert one order every W queries")
    ap.add_argument("--check-every", type=int, default=10, help="compare every K-th result")
    ap.add_argument("--limit", type=size, default=16 << 20, help="the pool's grant without a daemon")
    ap.add_argument("--node", help="register with the node daemon: auto or its socket")
    ap.add_argument("--verify", action="store_true", help="the runtime's debug mode")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    if min(args.rows, args.customers, args.queries, args.check_every) < 1 or args.write_every < 0:
        ap.error("--rows, --customers, --queries and --check-every must be positive")

    with tempfile.TemporaryDirectory(prefix="gleaner-sqlite-cache-") as tmp:
        db = build(os.path.join(tmp, "orders.db"), args.rows, args.customers, args.seed)
        rng = random.Random(args.seed + 1)
        zipf = Zipf(args.customers, args.zipf, rng)
        customers = [zipf.draw() for _ in range(args.queries)]

        t = time.monotonic()
        for c in customers[: args.queries // 4]:
            db.execute(REPORT, (c,)).fetchall()
        direct_qps = (args.queries // 4) / max(time.monotonic() - t, 1e-9)

        bad = 0
        with gleaner_soft.Pool(lambda key: cache.rebuild(key), name="sqlite-cache",
                               capacity=1 << 30, limit=args.limit, node=args.node,
                               verify=args.verify) as pool:
            cache = QueryCache(db, pool)
            t = time.monotonic()
            for i, c in enumerate(customers):
                if args.write_every and i % args.write_every == args.write_every - 1:
                    cache.execute("INSERT INTO orders (customer, day, amount) VALUES (?, ?, ?)",
                                  (c, rng.randrange(365), 1.0), "orders")
                got = cache.query(REPORT, (c,), ("orders",))
                if i % args.check_every == 0:
                    want = [list(r) for r in db.execute(REPORT, (c,)).fetchall()]
                    if got != want:
                        bad += 1
                        print(f"query {i} (customer {c}): a cached result differs from sqlite's",
                              file=sys.stderr)
            cached_qps = args.queries / max(time.monotonic() - t, 1e-9)
            stats = pool.stats()
        db.close()
    print(json.dumps({"queries": args.queries, "hits": stats["hits"], "misses": stats["misses"],
                      "cached_qps": round(cached_qps), "direct_qps": round(direct_qps),
                      "checked": (args.queries + args.check_every - 1) // args.check_every,
                      "bad": bad, "pool": stats}))
    return 3 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
