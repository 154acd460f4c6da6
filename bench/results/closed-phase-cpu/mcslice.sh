#!/bin/bash
# memcached cell; SLICE_US (if set) applied to gleaner-recl0 after start. usage: mcslice.sh BIN
BIN=$1; shift
MC=/work/main/bench/harness/build/mcload
PORT=$((30000 + RANDOM % 20000))
$BIN run -q --local-mem 174M "$@" -- taskset -c 0 /usr/bin/memcached -p $PORT -U 0 -l 127.0.0.1 -m 482 -t 2 -c 1024 -u root 2>/dev/null &
RUNPID=$!
sleep 1.5
MPID=$(pgrep -f "memcached -p $PORT" | tail -1)
if [ -n "$SLICE_US" ]; then for t in /proc/$MPID/task/*; do [ "$(cat $t/comm)" = gleaner-recl0 ] && /tmp/slice/setslice $(basename $t) $SLICE_US 0; done; fi
taskset -c 1 $MC load 127.0.0.1 $PORT 300000 1024 > /dev/null
O=$(taskset -c 1 $MC open 127.0.0.1 $PORT 300000 1024 20000 10 95 0.99 4 1 | tail -1 | python3 -c 'import json,sys;j=json.loads(sys.stdin.read());l=j["latency_us"];print(l["p50"],l["p99"],l["p999"])')
C=$(taskset -c 1 $MC closed 127.0.0.1 $PORT 300000 1024 5 95 0.99 4 16 2 | tail -1 | python3 -c 'import json,sys;j=json.loads(sys.stdin.read());print(round(j["throughput_rps"]))')
kill $MPID; wait $RUNPID
echo "slice=${SLICE_US:-default} open p50/p99/p999 $O closed $C"
