#!/bin/bash
# What sealing far pages costs issue 11's cells: the harness's memcached and redis cells at 50%
# local memory, pinned, gleaner only, with the defaults (`base`) and with `--encrypt off`
# (`noenc`), alternated over 2 rounds. Run from the repository root.
set -u
D=bench/results/encrypt-cost
for r in 1 2; do for v in base noenc; do for w in memcached redis; do
  if [ $v = noenc ]; then export GLEANER_HARNESS_ARGS="--encrypt off"; else unset GLEANER_HARNESS_ARGS; fi
  python3 -m bench.harness run --size full --workloads $w --systems gleaner --ratios 50 --pin \
      --out $D/$w-$v-$r.json --no-render --no-progress
done; done; done
