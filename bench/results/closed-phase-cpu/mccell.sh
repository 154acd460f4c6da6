#!/bin/bash
# A harness-like memcached cell under gleaner, by hand: 300k keys of 1 KiB at 174 MiB local,
# the server pinned to CPU 0 and mcload to CPU 1; loads the keys, runs the open loop (20k req/s)
# and the closed loop, and prints the open-loop p50/p99/p999 (µs) and the closed-loop req/s.
# (The runs of this folder used one script per mode with these same steps.)
#
# usage: mccell.sh MODE BIN [gleaner run args]
#   ab     nothing more (MCLOAD=path picks another mcload build)
#   slice  SLICE_US=N gives the reclaim thread an N µs scheduler slice (setslice.c, built here)
#   prof   OUT=prefix: perf record -a -g of both CPUs through an 8 s closed loop
#   sched  OUT=prefix: perf sched record -a of 1.5 s in the closed loop
#   threads OUT=prefix: each server thread's name, minor and major faults, user and system
#          ticks (/proc/PID/task/*/stat) before and after an 8 s closed loop (OUT.t0, OUT.t1)
MODE=$1; BIN=$2; shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
MC=${MCLOAD:-$HERE/../../harness/build/mcload}
OUT=${OUT:-/tmp/mccell}
PORT=$((30000 + RANDOM % 20000))
"$BIN" run -q --local-mem 174M --stats "$OUT.stats.json" "$@" -- taskset -c 0 /usr/bin/memcached \
    -p $PORT -U 0 -l 127.0.0.1 -m 482 -t 2 -c 1024 -u root 2>/dev/null &
RUNPID=$!
sleep 1.5
MPID=$(pgrep -f "memcached -p $PORT" | tail -1)
if [ "$MODE" = slice ] && [ -n "$SLICE_US" ]; then
    gcc -O2 -o "$OUT.setslice" "$HERE/setslice.c"
    for t in /proc/$MPID/task/*; do
        [ "$(cat $t/comm)" = gleaner-recl0 ] && "$OUT.setslice" "$(basename $t)" "$SLICE_US" 0
    done
fi
taskset -c 1 $MC load 127.0.0.1 $PORT 300000 1024 > /dev/null
O=$(taskset -c 1 $MC open 127.0.0.1 $PORT 300000 1024 20000 10 95 0.99 4 1 | tail -1 |
    python3 -c 'import json,sys;l=json.loads(sys.stdin.read())["latency_us"];print(l["p50"],l["p99"],l["p999"])')
SECS=5
PERF=
case $MODE in
    prof) SECS=8; perf record -a -g -F 999 -o "$OUT.data" -- sleep 8 > /dev/null 2>&1 & PERF=$! ;;
    sched) SECS=6; (sleep 3; perf sched record -a -o "$OUT.sched" -- sleep 1.5 > /dev/null 2>&1) & PERF=$! ;;
    threads) SECS=8
        snap() { for t in /proc/$MPID/task/*; do echo "$(cat $t/comm) $(cut -d' ' -f10,12,14,15 $t/stat)"; done; }
        (snap > "$OUT.t0"; sleep 8; snap > "$OUT.t1") & PERF=$! ;;
esac
C=$(taskset -c 1 $MC closed 127.0.0.1 $PORT 300000 1024 $SECS 95 0.99 4 16 2 | tail -1 |
    python3 -c 'import json,sys;print(round(json.loads(sys.stdin.read())["throughput_rps"]))')
[ -n "$PERF" ] && wait $PERF
kill $MPID; wait $RUNPID
echo "$MODE ${SLICE_US:+slice=$SLICE_US }open p50/p99/p999 $O closed $C"
if [ "$MODE" = prof ]; then
    perf report -i "$OUT.data" --no-children --sort cpu,comm --stdio 2>/dev/null | grep -E '^ +[0-9]' | head -14
fi
