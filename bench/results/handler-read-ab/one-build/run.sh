#!/bin/bash
# One build (cf13891), handlers waiting in poll (GLEANER_HANDLERS_POLL=1) against in read
# (the default), interleaved: harness cells at 50%, --pin, gleaner only.
cd "$(git rev-parse --show-toplevel)"
O=bench/results/handler-read-ab/one-build
for rep in 1 2 3; do
 for w in memcached redis; do
  for mode in poll read; do
   if [ $mode = poll ]; then export GLEANER_HANDLERS_POLL=1; else unset GLEANER_HANDLERS_POLL; fi
   python3 -m bench.harness run --size full --workloads $w --systems gleaner --ratios 50 --pin \
     --out $O/h-$w-$mode-$rep.json --no-render --no-progress > /dev/null 2>&1
  done
 done
done
