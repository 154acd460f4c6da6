#!/bin/bash
# Reads ahead on memnode connections, A/B: for each build, a `gleaner memnode` on TCP loopback
# and two runs of `gleaner bench micro` against it, recording the memnode's CPU time per run
# (utime + stime from /proc, in clock ticks of 10 ms) and micro's summary lines; the builds
# alternate, ROUNDS times. Usage: ab.sh OLD_GLEANER NEW_GLEANER [ROUNDS]
set -u
OLD=$1; NEW=$2; ROUNDS=${3:-3}
T=$(mktemp -d)/token; PORT=17071
one() {
    local g=$1 label=$2
    "$g" memnode --listen 127.0.0.1:$PORT --capacity 2G --token-file "$T" > /dev/null 2>&1 &
    local mn=$!
    sleep 0.5
    for i in 1 2; do
        local a b out
        a=$(awk '{print $14+$15}' /proc/$mn/stat)
        out=$("$g" bench micro --pattern random --size 256M --local 50% \
            --memnode 127.0.0.1:$PORT --token-file "$T" 2>&1 | grep -E "far memory|remote fault \(")
        b=$(awk '{print $14+$15}' /proc/$mn/stat)
        echo "$label run $i memnode_cpu_ticks $((b - a)) | $(echo "$out" | tr '\n' ' ')"
    done
    kill $mn; wait $mn 2>/dev/null
}
for r in $(seq 1 "$ROUNDS"); do
    one "$OLD" old
    one "$NEW" new
done
