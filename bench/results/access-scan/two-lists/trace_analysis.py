#!/usr/bin/env python3
"""What a memcached fault trace says about the far faults: first touches against refaults,
whether each refaulted page had been reported written by the access scan since its previous
fault, neighbouring pages faulting together, the time between a page's faults, and how the
faults spread over pages. Needs numpy.

    GLEANER_HARNESS_ARGS="--trace /tmp/mc-%p.trace" python3 -m bench.harness run --size full \
        --workloads memcached --systems gleaner --ratios 50 --pin --out /tmp/run.json
    python3 bench/results/access-scan/two-lists/trace_analysis.py /tmp/mc-PID.trace

The trace format is `gleaner_policy::trace` (a 32-byte header, then 24-byte records: time in
ns, page, thread id, kind; kinds 0 and 1 are missing-page faults, 6 a scan's report).
"""
import sys, struct, collections
import numpy as np
path = sys.argv[1]
data = open(path,'rb').read()
hdr = data[:32]
base = struct.unpack_from('<Q', hdr, 24)[0]
rec = np.frombuffer(data[32:32+((len(data)-32)//24)*24], dtype=np.dtype([('t','<u8'),('page','<u8'),('tid','<u4'),('kind','u1'),('pad','V3')]))
print("records", len(rec), "base", hex(base))
kinds = collections.Counter(rec['kind'].tolist())
print("kinds", dict(kinds))
t0 = rec['t'][0]
# demand faults
dem = rec[(rec['kind']==0)|(rec['kind']==1)]
seen = set(); first=0; re=0
last_fault = {}
refs_since = collections.Counter()
ref_before = 0; noref_before = 0
adj = 0
recent = {}  # page -> time of last demand fault
gaps = []
refault_times = []
for r in rec:
    k = r['kind']; p = int(r['page']); t = int(r['t'])
    if k == 6:
        refs_since[p] += 1
        continue
    if k not in (0,1):
        continue
    if p in seen:
        re += 1
        refault_times.append(t)
        if refs_since[p] > 0: ref_before += 1
        else: noref_before += 1
        gaps.append(t - last_fault[p])
        if (recent.get(p-1, -10**12) > t - 2_000_000) or (recent.get(p+1,-10**12) > t-2_000_000):
            adj += 1
    else:
        seen.add(p); first += 1
    refs_since[p] = 0
    last_fault[p] = t
    recent[p] = t
print("first touches", first, "refaults", re)
print("refaults of pages referenced (written) since their last fault", ref_before, "never", noref_before)
print("refaults with a neighbour page faulted within 2 ms before", adj)
g = np.array(gaps)/1e9
if len(g):
    print("time between a page's faults (s): p10 %.2f p50 %.2f p90 %.2f" % tuple(np.percentile(g,[10,50,90])))
# per-page refault counts distribution
cnt = collections.Counter()
for r in dem: cnt[int(r['page'])]+=1
c = np.array(sorted(cnt.values(), reverse=True))
tot = c.sum()
for frac in (0.01,0.05,0.1,0.2,0.5):
    n = max(1,int(len(c)*frac)); print(f"top {frac*100:.0f}% pages ({n}) take {c[:n].sum()/tot*100:.1f}% of faults")
# page address clustering: find runs
pages = np.array(sorted(cnt.keys()))
runs=[]; s=pages[0]; prev=pages[0]
for p in pages[1:]:
    if p!=prev+1: runs.append((s,prev)); s=p
    prev=p
runs.append((s,prev))
big = sorted(runs, key=lambda r: r[1]-r[0], reverse=True)[:8]
for a,b in big:
    f = sum(cnt[p] for p in range(a,b+1))
    print(f"run {a}-{b} ({b-a+1} pages): {f} faults, {f/(b-a+1):.1f}/page")
