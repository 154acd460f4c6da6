#!/bin/bash
# usage: run.sh LABEL EVICT XFREQ
G=${G:-/work/main/target/release/gleaner}
st=/tmp/jt/st-$1-$$.json
s=$(date +%s.%N)
GLEANER_X_FREQ="$3" $G run --local-mem 261M --evict $2 --stats $st -- taskset -c 0 /usr/bin/java -Xms512m -Xmx512m -XX:+UseSerialGC -XX:-UsePerfData -cp /tmp/jt/classes FarHeap 300000 > /tmp/jt/out-$$.txt 2>&1
e=$(date +%s.%N)
python3 - "$1" "$st" "$s" "$e" <<'PY'
import json,sys
d=json.load(open(sys.argv[2])); t=d['total']
f=t.get('faults',{})
print(f"{sys.argv[1]:14s} wall {float(sys.argv[4])-float(sys.argv[3]):6.2f} remote {f.get('remote')} out {t['evictions']['dirty']+t['evictions']['clean']} ev_wait {f.get('waited_on_eviction')}")
PY
