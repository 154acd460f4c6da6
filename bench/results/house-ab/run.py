#!/usr/bin/env python3
"""Same-run A/B for issue 50 (the house regrouped): `gleaner bench micro` and the quick-start demo
job, built from the commit before the regroup (BASE) and after it (NEW), alternated run by run.

    python3 bench/results/house-ab/run.py BASE_DIR NEW_DIR [REPEATS [OUT]]

BASE_DIR and NEW_DIR are checkouts with release builds (target/release/gleaner and the preload
library). Writes OUT (results.json by default) beside this script and prints the ratios NEW/BASE
(medians).
"""
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PATTERNS = ["seq", "random"]


def micro(tree, pattern):
    cmd = [os.path.join(tree, "target/release/gleaner"), "bench", "micro", "--pattern", pattern,
           "--size", "512M", "--local", "25%", "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    r = json.loads(out)
    assert r["checksum_ok"], f"{tree}: {pattern}: checksum mismatch"
    return {"ns_per_op": r["ns_per_op"], "ns_per_op_all_local": r["ns_per_op_all_local"],
            "slowdown_vs_all_local": r["slowdown_vs_all_local"]}


def demo(tree):
    cmd = [os.path.join(tree, "target/release/gleaner"), "run", "--local-mem", "64M", "--",
           sys.executable, os.path.join(tree, "scripts/demo_job.py"), "50000"]
    t = time.monotonic()
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return time.monotonic() - t


def main():
    base, new = sys.argv[1], sys.argv[2]
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    out_name = sys.argv[4] if len(sys.argv) > 4 else "results.json"
    runs = {"base": [], "new": []}
    for r in range(repeats):
        order = [("base", base), ("new", new)] if r % 2 == 0 else [("new", new), ("base", base)]
        for name, tree in order:
            row = {p: micro(tree, p) for p in PATTERNS}
            row["demo_s"] = demo(tree)
            runs[name].append(row)
            print(name, r, json.dumps(row), file=sys.stderr, flush=True)
    med = lambda name, f: statistics.median(f(x) for x in runs[name])  # noqa: E731
    ratios = {f"micro_{p}_ns_per_op": med("new", lambda x: x[p]["ns_per_op"]) /
              med("base", lambda x: x[p]["ns_per_op"]) for p in PATTERNS}
    ratios["demo_s"] = med("new", lambda x: x["demo_s"]) / med("base", lambda x: x["demo_s"])
    out = {"command": " ".join(["python3", "bench/results/house-ab/run.py"] + sys.argv[1:]),
           "base": base, "new": new, "repeats": repeats, "runs": runs,
           "ratio_new_over_base_medians": ratios}
    with open(os.path.join(HERE, out_name), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(ratios))


if __name__ == "__main__":
    main()
