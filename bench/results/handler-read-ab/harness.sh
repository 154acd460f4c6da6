#!/bin/bash
# A/B: harness cells at 50%, pinned, gleaner only; poll (base) vs read, interleaved.
cd /work/main
for rep in 1 2; do
 for w in memcached redis; do
  for b in base read; do
   GLEANER_HARNESS_BIN=/tmp/exp/bins/$b/gleaner python3 -m bench.harness run --size full --workloads $w --systems gleaner --ratios 50 --pin --out /tmp/exp/ab/h-$w-$b-$rep.json --no-render --no-progress > /tmp/exp/ab/h-$w-$b-$rep.log 2>&1
  done
 done
done
