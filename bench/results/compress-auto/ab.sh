#!/bin/bash
# `--compress auto` (the default since it was added: zstd once the link is slow) against `lz4`
# on the co-run bench's capped link (32 MB/s), fair order, rounds interleaved: each round runs
# bench/corun.py's three gleaner cells (memcached alone, a batch job alone, the co-run) once
# per setting. Usage: bench/results/compress-auto/ab.sh ROUNDS
set -eu
cd "$(dirname "$0")/../../.."
OUT=bench/results/compress-auto
for r in $(seq 1 "${1:-2}"); do
  for c in lz4 auto; do
    GLEANER_CORUN_ARGS="--compress $c" python3 bench/corun.py --reps 1 --mc-weight 4 --systems fair \
      --keep-stats "$OUT/stats-$c-$r" --out "$OUT/corun-$c-$r.json" --no-render
  done
done
