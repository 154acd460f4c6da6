"""The quick-start demo job: an ordinary Python program that builds a few hundred megabytes of
objects and checksums them twice. It knows nothing about gleaner."""
import hashlib
import sys
import time

n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
start = time.monotonic()
table = {}
for i in range(n):
    table[i] = (hashlib.sha256(str(i).encode()).digest() * 64, [i, str(i), float(i)])
h = hashlib.sha256()
for _ in range(2):
    for i in range(n):
        blob, rest = table[i]
        h.update(blob)
        h.update(repr(rest).encode())
print(f"checksum {h.hexdigest()[:16]} over {n} objects in {time.monotonic() - start:.2f} s")
