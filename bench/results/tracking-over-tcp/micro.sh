#!/bin/bash
# Dirty tracking over a TCP memnode on loopback, sync against async: `gleaner bench micro` at
# 128 MiB, 50% local, PATTERN, against a fresh memnode (with `--bandwidth BW` unless BW is none),
# the two modes alternated over 2 rounds; the memnode's CPU (clock ticks of 10 ms) and micro's
# CPU (user+system s, /usr/bin/time). Usage: micro.sh GLEANER BW PATTERN
set -u
G=$1; BW=$2; P=$3; T=$(mktemp -d)/token
extra=""; [ "$BW" != none ] && extra="--bandwidth $BW"
for r in 1 2; do for m in sync async; do
  port=$((17500 + RANDOM % 100))
  "$G" memnode --listen 127.0.0.1:$port --capacity 2G --token-file "$T" $extra > /dev/null 2>&1 &
  mn=$!
  sleep 0.4
  a=$(awk '{print $14+$15}' /proc/$mn/stat)
  out=$( { /usr/bin/time -f "cpu %U+%S" "$G" bench micro --pattern "$P" --size 128M --local 50% \
      --dirty-tracking $m --memnode 127.0.0.1:$port --token-file "$T" 2>&1; } \
      | grep -E "far memory|remote fault \(|^cpu" | tr '\n' ' ')
  b=$(awk '{print $14+$15}' /proc/$mn/stat)
  echo "bw=$BW $P $m memnode_ticks=$((b - a)) $out"
  kill $mn; wait $mn 2>/dev/null
done; done
