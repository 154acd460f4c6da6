import json,sys,glob
for f in sorted(sys.argv[1:]):
    d=json.load(open(f))
    for name,wl in d['workloads'].items():
        al=[r['metrics']['throughput'] for r in wl['runs'] if r['system']=='all-local' and r.get('ok')]
        out=[]
        for r in wl['runs']:
            if r['system']=='all-local' or not r.get('ok'): continue
            m=r['metrics']
            out.append(f"{r['system']} {m['throughput']:.0f} ({m['throughput']/(sum(al)/len(al)):.3f} of local) p99 {m['p99_us']} cpu {r['usage']['cpu_s']}")
        print(f.split('/')[-1], name, 'local', [round(a) for a in al], '|', ' | '.join(out))
