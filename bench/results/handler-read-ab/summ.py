import json,glob,sys,statistics
rows={}
for f in sorted(glob.glob('micro-*.json')):
    _,pat,b,rep=f[:-5].split('-')
    d=json.load(open(f))
    v=d['remote_fault_app_visible']
    rows.setdefault((pat,b),[]).append((d['ns_per_op'],v.get('mean_us'),v.get('p50_us'),v.get('p99_us'),d['checksum_ok'], d['region']['fault_breakdown'].get('handlers_wait_in')))
for k,v in sorted(rows.items()):
    print(k, ' | '.join(f"{a:.0f} ns/op mean {m:.1f} p50 {p:.1f} p99 {q:.1f} {ok} {w}" for a,m,p,q,ok,w in v))
