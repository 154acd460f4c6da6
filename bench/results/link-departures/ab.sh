#!/bin/bash
# Replies held for the emulated link, A/B: for each build, a `gleaner memnode --bandwidth 32M` on
# TCP loopback and one `gleaner bench micro --pattern random --size 128M --local 50%` against it,
# recording the memnode's CPU time (utime + stime from /proc, clock ticks of 10 ms), micro's
# summary lines and (new build) the memnode's `link_departures` stats; builds alternate ROUNDS
# times. Both builds run micro with `--dirty-tracking sync` (the old build's default over a
# socket), so that only the link differs. Usage: ab.sh OLD_GLEANER NEW_GLEANER [ROUNDS]
set -u
OLD=$1; NEW=$2; ROUNDS=${3:-3}
T=$(mktemp -d)/token
one() {
    local g=$1 label=$2 port=$((17400 + RANDOM % 100))
    "$g" memnode --listen 127.0.0.1:$port --capacity 2G --token-file "$T" --bandwidth 32M > /dev/null 2>&1 &
    local mn=$!
    sleep 0.5
    local a b out dep
    a=$(awk '{print $14+$15}' /proc/$mn/stat)
    out=$("$g" bench micro --pattern random --size 128M --local 50% \
        --dirty-tracking sync --memnode 127.0.0.1:$port --token-file "$T" 2>&1 | grep -E "far memory|remote fault \(")
    b=$(awk '{print $14+$15}' /proc/$mn/stat)
    dep=$("$g" memnode stats --addr 127.0.0.1:$port --token-file "$T" 2>/dev/null \
        | python3 -c 'import json,sys; print(json.load(sys.stdin).get("link_departures"))' 2>/dev/null)
    echo "$label memnode_cpu_ticks $((b - a)) | $(echo "$out" | tr '\n' ' ') | link_departures $dep"
    kill $mn; wait $mn 2>/dev/null
}
for r in $(seq 1 "$ROUNDS"); do
    one "$OLD" old
    one "$NEW" new
done
