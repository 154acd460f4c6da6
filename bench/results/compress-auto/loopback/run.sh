#!/bin/bash
# `--compress auto` over TCP loopback at full speed (no --bandwidth): which compressor it keeps.
# The demo job (30000 objects, 16 MiB local) twice through a local TCP memnode, and
# `bench micro --pattern random` on the embedded memnode over TCP; stats here.
set -eu
cd "$(dirname "$0")"
G=../../../../target/release/gleaner
PY=${PYTHON:-/root/.pyenv/versions/3.11.7/bin/python3.11}
$G memnode --listen 127.0.0.1:0 --capacity 2G --token-file token > memnode.out 2> memnode.err &
trap 'kill %1' EXIT
sleep 1
addr=$(head -1 memnode.out | sed 's/listening on //')
for i in 1 2; do
  $G run --local-mem 16M --memnode "$addr" --token-file token --stats "demo-$i.json" -- \
    "$PY" ../../../../scripts/demo_job.py 30000 > "demo-$i.out" 2> "demo-$i.err"
done
$G bench micro --pattern random --size 256M --local 50% --memnode embedded-tcp --json > micro.json
rm -f token memnode.out memnode.err
