#!/usr/bin/env python3
"""A batch job with changing phases, for the reclaim benchmark: allocation bursts, then scans.

    phases_job.py MIB ROUNDS

Each round: a burst allocates MIB/2 MiB of new 64 KiB chunks with pseudo-random content (plus
the chunks kept from the previous round, the heap holds about MIB MiB), then two scan phases read
every chunk (CRC32), then every other chunk is freed. Prints one JSON line: the checksum of all
scans (deterministic: the same for any memory system) and the peak RSS.
"""
import json
import random
import resource
import sys
import zlib

CHUNK = 64 * 1024


def main():
    mib, rounds = int(sys.argv[1]), int(sys.argv[2])
    per_burst = (mib * 1024 * 1024 // 2) // CHUNK
    rng = random.Random(42)
    chunks = []
    checksum = 0
    for r in range(rounds):
        chunks.extend(rng.randbytes(CHUNK) for _ in range(per_burst))   # allocation burst
        for _ in range(2):                                                 # scans
            for c in chunks:
                checksum = zlib.crc32(c, checksum)
        chunks = chunks[1::2]                                              # free half
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"checksum": checksum, "rounds": rounds, "mib": mib, "peak_rss_bytes": peak}))


if __name__ == "__main__":
    main()
