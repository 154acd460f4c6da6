#!/bin/bash
# The demo job on a pool of two memnodes (TCP loopback, no cap, --replicas 2, the default), and
# the fork child of tests/c/preload_program.c (`fork 64`: the child reads its 80 MiB once, then
# prints its RssAnon), sync against async tracking, alternated over 2 rounds.
# Usage (from the repository root): bench/results/tracking-over-tcp/pool-demo.sh
set -u
G=target/release/gleaner; P=target/release/gleaner_preload_program; T=$(mktemp -d)/token
a=$((17700 + RANDOM % 50)); b=$((a + 50))
"$G" memnode --listen 127.0.0.1:$a --capacity 4G --token-file "$T" > /dev/null 2>&1 & m1=$!
"$G" memnode --listen 127.0.0.1:$b --capacity 4G --token-file "$T" > /dev/null 2>&1 & m2=$!
sleep 0.5
pool=127.0.0.1:$a,127.0.0.1:$b
for r in 1 2; do for m in sync async; do
  s=$(date +%s.%N)
  out=$("$G" run -q --local-mem 64M --dirty-tracking $m --memnode $pool --token-file "$T" \
      -- python3 scripts/demo_job.py 50000 2>&1 | tail -1)
  e=$(date +%s.%N)
  echo "demo on a pool, $m: $(echo "$e - $s" | bc) s | $out"
  echo "fork child on a pool, $m: $("$G" run -q --local-mem 16M --dirty-tracking $m --memnode $pool \
      --token-file "$T" -- "$P" fork 64 2>/dev/null | grep child)"
done; done
kill $m1 $m2; wait 2>/dev/null
