import json,glob
for f in sorted(glob.glob('h-*.json')):
    d=json.load(open(f))
    for w,wd in d['workloads'].items():
        for r in wd['runs']:
            m=r.get('metrics') or {}
            if r['system']=='gleaner':
                print(f"{f:<28} {m.get('throughput'):>9.0f} p99 {m.get('p99_us'):>6} faults {r.get('far_faults')} cpu {r.get('usage',{}).get('cpu_s')}")
            else:
                print(f"{'':<28} {r['system']} {m.get('throughput'):>9.0f}")
