#!/bin/bash
# A/B: bench micro, handlers blocking in poll (base) vs in read (read), interleaved.
for rep in 1 2 3; do
 for b in base read; do
  for pat in random seq; do
   /tmp/exp/bins/$b/gleaner bench micro --pattern $pat --size 512M --local 50% --json --pin-cpu 0 > micro-$pat-$b-$rep.json 2>micro-$pat-$b-$rep.err
  done
 done
done
# The process pinned to CPU 0 (one fault handler, as in the harness's --pin cells):
for rep in 1 2 3; do
 for b in base read; do
  taskset -c 0 /tmp/exp/bins/$b/gleaner bench micro --pattern random --size 512M --local 50% --json --pin-cpu 0 > pinned-random-$b-$rep.json
 done
done
