"""sqlite in memory, as a new user would try it: 400k rows with a text payload in a `:memory:`
database, an index, then a group-by and indexed lookups twice. Prints the same
`checksum HEX over N objects in S s` line as the demo job, so the benchmarks can run it alike."""
import hashlib
import random
import sqlite3
import sys
import time

n = int(sys.argv[1]) if len(sys.argv) > 1 else 400_000
start = time.monotonic()
db = sqlite3.connect(":memory:")
db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, grp INTEGER, name TEXT, payload TEXT)")
rng = random.Random(7)
db.executemany(
    "INSERT INTO t VALUES (?, ?, ?, ?)",
    ((i, rng.randrange(1000), f"name-{i}", hashlib.sha256(str(i).encode()).hexdigest() * 4)
     for i in range(n)))
db.execute("CREATE INDEX t_name ON t (name)")
h = hashlib.sha256()
for _ in range(2):
    for grp, count, total in db.execute(
            "SELECT grp, COUNT(*), SUM(LENGTH(payload)) FROM t GROUP BY grp ORDER BY grp"):
        h.update(f"{grp}:{count}:{total}".encode())
    for i in range(0, n, 7):
        (payload,) = db.execute("SELECT payload FROM t WHERE name = ?", (f"name-{i}",)).fetchone()
        h.update(payload[:8].encode())
print(f"checksum {h.hexdigest()[:16]} over {n} objects in {time.monotonic() - start:.2f} s")
