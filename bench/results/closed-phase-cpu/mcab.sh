#!/bin/bash
# memcached cell under gleaner: load, open 20k/s 10 s, closed 5 s. usage: mcab.sh BIN MCLOAD [run args]
BIN=$1; MC=$2; shift 2
PORT=$((30000 + RANDOM % 20000))
$BIN run -q --local-mem 174M --stats /tmp/prof/last.stats.json "$@" -- taskset -c 0 /usr/bin/memcached -p $PORT -U 0 -l 127.0.0.1 -m 482 -t 2 -c 1024 -u root 2>/dev/null &
RUNPID=$!
sleep 1.5
taskset -c 1 $MC load 127.0.0.1 $PORT 300000 1024 > /dev/null
O=$(taskset -c 1 $MC open 127.0.0.1 $PORT 300000 1024 20000 10 95 0.99 4 1 | tail -1 | python3 -c 'import json,sys;j=json.loads(sys.stdin.read());l=j["latency_us"];print(l["p50"],l["p99"],l["p999"])')
C=$(taskset -c 1 $MC closed 127.0.0.1 $PORT 300000 1024 5 95 0.99 4 16 2 | tail -1 | python3 -c 'import json,sys;j=json.loads(sys.stdin.read());print(round(j["throughput_rps"]), j["hits"] if "hits" in j else "")')
MPID=$(pgrep -f "memcached -p $PORT" | tail -1)
kill $MPID; wait $RUNPID
echo "open p50/p99/p999 $O closed $C $(python3 -c "import json;d=json.load(open(\"/tmp/prof/last.stats.json\"))[\"total\"];print(\"remote\",d[\"faults\"][\"remote\"],\"pf_used\",d[\"prefetch\"][\"used\"],\"issued\",d[\"prefetch\"][\"issued\"],\"evicted\",d[\"reclaim\"][\"pool_pages\"])")"
