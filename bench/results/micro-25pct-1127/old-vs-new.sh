#!/usr/bin/env bash
# The same sequential pattern at 25% under the build of 2026-11-24 (`3cb1704`, the one behind
# the micro sections then) and today's, interleaved. OLD: that build's gleaner, e.g.
#   git worktree add /tmp/old 3cb1704 && (cd /tmp/old && cargo build --release -p gleaner-cli)
#   OLD=/tmp/old/target/release/gleaner bench/results/micro-25pct-1127/old-vs-new.sh
set -euo pipefail
here=$(dirname "$0")
new=target/release/gleaner
for rep in 1 2; do
  "$OLD" bench micro --pattern seq --size 512M --local 25% --json > "$here/old-3cb1704-$rep.json"
  $new bench micro --pattern seq --size 512M --local 25% --json > "$here/new-defaults-$rep.json"
  $new bench micro --pattern seq --size 512M --local 25% --json --evict fifo --compress off \
    --encrypt off --drop-far-copies none > "$here/new-as-old-$rep.json"
done
