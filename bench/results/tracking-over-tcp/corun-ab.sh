#!/bin/bash
# The fair co-run (bench/corun.py, one rep) under each dirty-tracking mode, alternated ROUNDS
# times, with the build GLEANER (its preload library beside it). Run from the repository root.
# Usage: corun-ab.sh GLEANER [ROUNDS]
set -u
G=$1; ROUNDS=${2:-2}; D=bench/results/tracking-over-tcp
for r in $(seq 1 "$ROUNDS"); do for v in sync async; do
  GLEANER_CORUN_ARGS="--dirty-tracking $v" GLEANER_CORUN_BIN=$G python3 bench/corun.py --systems fair \
      --reps 1 --mc-weight 4 --out $D/corun-$v-$r.json --no-render > $D/$v-$r.log 2>&1
  echo "$v $r: $(grep -E ' ok' $D/$v-$r.log | tr '\n' ' ')"
done; done
