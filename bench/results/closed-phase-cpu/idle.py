#!/usr/bin/env python3
"""Reads `perf sched timehist -w` on stdin and sums CPU 0's idle time by the task that ended
each idle period, and by the period's length."""
import collections
import sys

idle, cnt, hist = collections.Counter(), collections.Counter(), collections.Counter()
prev_idle = None
for line in sys.stdin:
    if "[0000]" not in line or "awakened:" in line:
        continue
    parts = line.split()
    if len(parts) < 6:
        continue
    task, run = parts[2], float(parts[5])
    if task.startswith("<idle>"):
        prev_idle = run
        continue
    if prev_idle is not None:
        name = task.split("[")[0]
        idle[name] += prev_idle
        cnt[name] += 1
        b = "<20us" if prev_idle < 0.02 else "<100us" if prev_idle < 0.1 else "<500us" if prev_idle < 0.5 else ">=500us"
        hist[b] += prev_idle
    prev_idle = None
print("CPU 0 idle, ms, by the task that ran next:", {k: round(v, 1) for k, v in idle.items()})
print("periods:", dict(cnt))
print("CPU 0 idle, ms, by the period's length:", {k: round(v, 1) for k, v in hist.items()})
