#!/bin/bash
# kill-to-reaped of a python child under gleaner run, with two CPU spinners as load; idle vs batch watchdog, alternated
# Usage: killab.sh, with /tmp/preload-idle.so and /tmp/preload-batch0.so the preload library
# built with the watchdog at SCHED_IDLE (main at 51a4a6f) and at SCHED_BATCH (this change).
here=$(cd "$(dirname "$0")" && pwd)
G=/work/main/target/release/gleaner
spin() { python3 -c 'while True: pass' & }
spin; s1=$!; spin; s2=$!
for round in 1 2 3; do
  for v in idle batch0; do
    echo "$v $(cd /tmp && GLEANER_PRELOAD=/tmp/preload-$v.so $G run --local-mem 32M -- python3 "$here"/killtime.py 2>/dev/null)"
  done
done
kill $s1 $s2
