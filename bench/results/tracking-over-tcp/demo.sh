#!/bin/bash
# The quick-start demo job over a TCP memnode on loopback (no link cap), sync against async
# tracking, alternated over 2 rounds: wall time of `gleaner run` and the job's own line.
# Usage (from the repository root): bench/results/tracking-over-tcp/demo.sh
set -u
G=target/release/gleaner; T=$(mktemp -d)/token; port=$((17600 + RANDOM % 100))
"$G" memnode --listen 127.0.0.1:$port --capacity 4G --token-file "$T" > /dev/null 2>&1 &
mn=$!
sleep 0.5
for r in 1 2; do for m in sync async; do
  s=$(date +%s.%N)
  out=$("$G" run -q --local-mem 64M --dirty-tracking $m --memnode 127.0.0.1:$port --token-file "$T" \
      -- python3 scripts/demo_job.py 50000 2>&1 | tail -1)
  e=$(date +%s.%N)
  echo "demo over tcp, $m: $(echo "$e - $s" | bc) s | $out"
done; done
kill $mn; wait $mn 2>/dev/null
