"""memcached's closed-loop phase cut into N consecutive 5 s windows, far faults per window.

The harness's memcached cell (`bench/harness/workloads.py`, full size) with its closed phase
replaced by N back-to-back 5 s closed phases (load-generator seeds 2, 3, ...), each with its own
far-fault count (gleaner's remote faults, or the cgroup's major faults under Linux swap) and
throughput; everything else (load, open phase, verification, pinning, budgets) is the harness's.

    python3 bench/results/access-scan/steady/series.py N run --size full --workloads memcached \
        --systems gleaner,linux-swap --ratios 50 --pin --out OUT.json --no-render --no-progress
    python3 bench/results/access-scan/steady/series.py --show OUT.json [...]
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../.."))


def show(paths):
    """Prints each run's windows: far faults per 1,000 requests and requests/s."""
    for path in paths:
        d = json.load(open(path))
        for r in d["workloads"]["memcached"]["runs"]:
            if r["system"] == "all-local" or not r.get("ok"):
                continue
            pf = r["phase_far_faults"]
            wins = [v for k, v in pf.items() if k.startswith("closed")]
            faults = sum(v["far_faults"] for v in wins)
            reqs = sum(v["requests"] for v in wins)
            print(f"{os.path.basename(path)} {r['system']}: open {pf['open']['per_1000_requests']}; "
                  f"windows {[v['per_1000_requests'] for v in wins]}; "
                  f"all windows {1000 * faults / reqs:.1f} per 1,000 over {reqs} requests; "
                  f"requests/s {[round(x) for x in r['metrics']['series']]}")


def run(n):
    import shlex

    from bench.harness import __main__ as harness
    from bench.harness import workloads as W

    # The results file names this script, not the harness, as what produced it.
    harness.cmd_line = lambda: ("python3 bench/results/access-scan/steady/series.py " + str(n) + " "
                                + " ".join(shlex.quote(a) for a in sys.argv[1:]))

    harness_params = W.Memcached.params
    # The timeout and the results' parameters see the whole closed time.
    W.Memcached.params = lambda self: {**harness_params(self), "closed_s": 5 * n}

    def clients(self, port, rec):
        p = harness_params(self)
        base, mark, err = self.load_and_open(port, rec, p)
        if err:
            return err
        ph = rec["phases"]
        for i in range(n):
            ph[f"closed{i}"], err = self._mc(["closed"] + base + [5, p["get_pct"], p["zipf_s"],
                                                                  p["conns"], p["depth"], 2 + i], 125)
            if err:
                return err
            mark = self.phase_far_faults(rec, f"closed{i}", mark, ph[f"closed{i}"]["completed"])
        rec["metrics"].update({"throughput": ph["closed0"]["throughput_rps"],
                               "series": [ph[f"closed{i}"]["throughput_rps"] for i in range(n)]})
        return None

    W.Memcached.clients = clients
    return harness.main()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--show":
        show(sys.argv[2:])
    else:
        n = int(sys.argv.pop(1))
        sys.exit(run(n))
