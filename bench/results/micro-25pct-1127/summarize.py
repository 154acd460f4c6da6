"""Prints one line per run of run.sh and old-vs-new.sh (summary.txt): ns per access, the mean
fetch step of a remote fault, eviction rates and counts, remote faults."""
import glob
import json
import os

here = os.path.dirname(os.path.abspath(__file__))
for f in sorted(glob.glob(os.path.join(here, "*-[0-9].json"))):
    d = json.load(open(f))
    r = d["region"]
    ev = r["evictions"]
    print(f"{os.path.basename(f):34} {d['ns_per_op']:6.0f} ns/op  fetch {r['fault_breakdown']['fetch_mean_us']:4.1f} us"
          f"  dirty {d.get('dirty_evictions_per_s') or 0:7.0f}/s  clean {d.get('clean_evictions_per_s') or 0:7.0f}/s"
          f"  evicted clean {ev['clean']:6} dirty {ev['dirty']:6}  remote faults {r['faults']['remote']}")
