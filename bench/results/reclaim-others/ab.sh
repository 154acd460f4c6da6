#!/bin/bash
# Alternates --reclaim-cpus any / others on one build, gleaner only, pinned harness cells.
cd /work/main
for r in 4 5; do
 for m in others any; do
  for w in redis memcached; do
   GLEANER_HARNESS_BIN=/tmp/ab/oth/gleaner GLEANER_HARNESS_ARGS="--reclaim-cpus $m" timeout 600 python3 -m bench.harness run --size full --workloads $w --systems gleaner --ratios 50 --pin --out /tmp/ab/rc/$w-$m-$r.json --no-render --no-progress 2>&1 | grep "gleaner  " 
  done
 done
done
