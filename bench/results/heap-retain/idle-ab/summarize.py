import json,sys,glob
for f in sorted(glob.glob(sys.argv[1])):
    d=json.load(open(f))
    out=[]
    for wn,w in d['workloads'].items():
        loc=[r['wall_s'] for r in w['runs'] if r['system']=='all-local']
        for r in w['runs']:
            if r['system']=='gleaner':
                g=r['gleaner']
                out.append(f"{wn} {r['wall_s']:.2f}s (local {min(loc):.2f}) rf={g['remote_faults']} zf={g['zero_fill_faults']} ev={g['evicted_dirty']} in={g['bytes_in']>>20}M ok={r['ok']}")
    print(f.split('/')[-1], ' | '.join(out))
