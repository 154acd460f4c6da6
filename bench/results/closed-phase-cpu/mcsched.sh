#!/bin/bash
# memcached cell under gleaner, a 1.5 s perf sched trace in the closed phase. usage: mcsched.sh BIN OUT [run args]
BIN=$1; OUT=$2; shift 2
MC=/work/main/bench/harness/build/mcload
PORT=$((30000 + RANDOM % 20000))
$BIN run -q --local-mem 174M --stats $OUT.stats.json "$@" -- taskset -c 0 /usr/bin/memcached -p $PORT -U 0 -l 127.0.0.1 -m 482 -t 2 -c 1024 -u root 2>/dev/null &
RUNPID=$!
sleep 1.5
taskset -c 1 $MC load 127.0.0.1 $PORT 300000 1024 > /dev/null
taskset -c 1 $MC open 127.0.0.1 $PORT 300000 1024 20000 5 95 0.99 4 1 >/dev/null
( sleep 3; perf sched record -a -o $OUT.sched -- sleep 1.5 >/dev/null 2>&1 ) &
PP=$!
C=$(taskset -c 1 $MC closed 127.0.0.1 $PORT 300000 1024 6 95 0.99 4 16 2 | tail -1 | python3 -c 'import json,sys;j=json.loads(sys.stdin.read());print(round(j["throughput_rps"]))')
wait $PP
MPID=$(pgrep -f "memcached -p $PORT" | tail -1)
kill $MPID; wait $RUNPID
echo "closed $C"
