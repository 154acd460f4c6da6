"""PageRank on a synthetic power-law graph (the harness's graph-analytics workload), numpy only.

    python3 pagerank_job.py NODES EDGES ITERATIONS [SEED]

The graph: edge sources uniform, destinations drawn from a power law (in-degree ~ Zipf-like),
node ids scattered by a fixed permutation. Edges are kept as two int32 arrays (8 bytes per edge)
and streamed in chunks every iteration (gather of source ranks, scatter-add to destinations).
Prints one JSON line with times, a checksum of the ranks, the top-10 nodes and the peak RSS.
"""
import json
import resource
import sys
import time

t0 = time.monotonic()
import numpy as np  # noqa: E402

n, m, iters = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
seed = int(sys.argv[4]) if len(sys.argv) > 4 else 11
CHUNK = 1 << 22
rng = np.random.default_rng(seed)
src = np.empty(m, dtype=np.int32)
dst = np.empty(m, dtype=np.int32)
mul = 2654435761 % n
while np.gcd(mul, n) != 1:
    mul += 1
for s in range(0, m, CHUNK):
    e = min(m, s + CHUNK)
    src[s:e] = rng.integers(0, n, e - s, dtype=np.int32)
    # power-law ranks: P(rank <= r) ~ (r/n)^(1/2.2): a few nodes get most in-edges
    r = (n * rng.random(e - s) ** 2.2).astype(np.int64)
    dst[s:e] = ((r * mul + 12345) % n).astype(np.int32)
outdeg = np.bincount(src, minlength=n).astype(np.float64)
inv_out = np.zeros(n)
nz = outdeg > 0
inv_out[nz] = 1.0 / outdeg[nz]
dangling = ~nz
t_gen = time.monotonic()
d = 0.85
pr = np.full(n, 1.0 / n)
for it in range(iters):
    contrib = pr * inv_out
    acc = np.zeros(n)
    for s in range(0, m, CHUNK):
        e = min(m, s + CHUNK)
        acc += np.bincount(dst[s:e], weights=contrib[src[s:e]], minlength=n)
    pr = (1 - d) / n + d * (acc + pr[dangling].sum() / n)
t_iter = time.monotonic()
top = np.argsort(-pr)[:10]
print(json.dumps({
    "nodes": n, "edges": m, "iterations": iters,
    "gen_s": round(t_gen - t0, 3), "iterate_s": round(t_iter - t_gen, 3),
    "total_s": round(time.monotonic() - t0, 3),
    "checksum": round(float(pr.sum()), 9), "top10": [int(x) for x in top],
    "top10_rank_sum": round(float(pr[top].sum()), 12),
    "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
}), flush=True)
