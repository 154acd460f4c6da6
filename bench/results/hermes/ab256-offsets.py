"""The 256 KiB malloc-and-touch cells of bench/hermes.py (anonymous and file-cache pressure),
glibc against this build's reserve and an older build's (its libgleaner_preload.so given as the
first argument, passed by GLEANER_PRELOAD), alternated: 2 rounds of 3 runs. Prints each run and,
last, one JSON object. Usage (root): python3 bench/results/hermes/ab256-offsets.py OLD.so"""
import os, sys, json, tempfile, subprocess, shutil
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, 'bench'))
import hermes as H
OLD = os.path.abspath(sys.argv[1])
tmp = tempfile.mkdtemp(prefix="ab256-")
binary = os.path.join(tmp, "alloc_latency")
subprocess.run(["cc", "-O2", "-o", binary, os.path.join(ROOT, "bench/hermes/alloc_latency.c")], check=True)
bigfile = H.big_file(tmp, 2048)
cg = H.Cgroup(H.LIMIT)
pre = [H.GLEANER, "run", "--far", "off", "--latency-critical", "-q", "--"]
res = {}
try:
    for rnd in range(2):
        for scen in ["anon", "file"]:
            ant = H.antagonist(cg, bigfile) if scen == "anon" else H.antagonist(cg, bigfile, anon_mb=0)
            try:
                for name, env in [("glibc", None), ("new", {}), ("old", {"GLEANER_PRELOAD": OLD})]:
                    for _ in range(3):
                        if name == "glibc":
                            r = H.alloc_run(binary, [], {}, 256 * 1024, 256 << 20, 100, cg)
                        else:
                            st = os.path.join(tmp, "st.json")
                            r = H.alloc_run(binary, H.with_stats(pre, st), env, 256 * 1024, 256 << 20, 100, cg)
                            r["misses"] = (H.reserve_counts(st) or {}).get("misses")
                        res.setdefault(f"{scen}_{name}", []).append({k: r.get(k) for k in ("mean_ns", "p99_ns", "misses")})
                        print(scen, name, res[f"{scen}_{name}"][-1], flush=True)
            finally:
                H.stop(ant)
finally:
    cg.remove()
    shutil.rmtree(tmp, ignore_errors=True)
print(json.dumps(res))
