#!/bin/bash
# Counts the recvfrom calls of both ends of a TCP memnode connection for one build: strace -c on
# a `gleaner memnode` and, separately, on a `gleaner bench micro` run against it (64 MiB region,
# random, 50% local). Usage: recv-count.sh GLEANER LABEL
set -u
G=$1; L=$2; T=$(mktemp -d)/token
side() {   # $1 = memnode | client
    local port=$((17080 + RANDOM % 100))
    "$G" memnode --listen 127.0.0.1:$port --capacity 2G --token-file "$T" > /dev/null 2>&1 &
    local mn=$! st=
    sleep 0.5
    if [ "$1" = memnode ]; then
        strace -f -c -e trace=recvfrom -p $mn -o "strace-$L-memnode.txt" 2>/dev/null & st=$!
        sleep 0.5
        "$G" bench micro --pattern random --size 64M --local 50% --memnode 127.0.0.1:$port \
            --token-file "$T" 2>&1 | grep -E "remote fault \("
        kill -INT $st; wait $st 2>/dev/null
    else
        strace -f -c -e trace=recvfrom -o "strace-$L-client.txt" "$G" bench micro --pattern random \
            --size 64M --local 50% --memnode 127.0.0.1:$port --token-file "$T" 2>&1 \
            | grep -E "remote fault \("
    fi
    kill $mn; wait $mn 2>/dev/null
    echo "$L $1: $(grep -E ' recvfrom$' "strace-$L-$1.txt" | awk '{print $4}') recvfrom calls"
}
side memnode
side client
