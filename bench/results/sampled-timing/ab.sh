#!/bin/bash
# usage: micro.sh OUTPREFIX BUILD... ; alternates builds, 3 rounds, random 50% pinned CPU 0
P=$1; shift
for r in 1 2 3 4; do for b in "$@"; do
 taskset -c 0 /tmp/ab/$b/gleaner bench micro --pattern random --size 256M --local 50% --floor-samples 0 --json > $P-$b-$r.json 2>/dev/null
 python3 - $P-$b-$r.json $b <<'PY'
import json,sys
d=json.load(open(sys.argv[1])); r=d['region']
rc=r['reclaim']; fb=r['fault_breakdown']
print(f"{sys.argv[2]:6} seen {d['remote_fault_app_visible']['mean_us']:.2f} p50 {d['remote_fault_app_visible']['p50_us']:.2f} handler {d['handler_service_mean_us']:.2f} lookup {fb['lookup_mean_us']:.2f} fetch {fb['fetch_mean_us']:.2f} install {fb['install_mean_us']:.2f} reclaim_us/page {rc['pool_cpu_ns']/max(1,rc['pool_pages'])/1000:.2f}")
PY
done; done
