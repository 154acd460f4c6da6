#!/usr/bin/env bash
# Why `bench micro` at 25% local got slower between 2026-11-24 and 2026-11-27: the sequential
# pattern under today's defaults and with the defaults added since switched off, interleaved.
# Run from the repository root after `cargo build --release`; writes CFG-REP.json here.
set -euo pipefail
here=$(dirname "$0")
g=target/release/gleaner
for rep in 1 2; do
  for cfg in defaults keep-far-copies codec-off codec-off-keep-far-copies; do
    case $cfg in
      defaults) extra=() ;;
      keep-far-copies) extra=(--drop-far-copies none) ;;
      codec-off) extra=(--compress off --encrypt off) ;;
      codec-off-keep-far-copies) extra=(--compress off --encrypt off --drop-far-copies none) ;;
    esac
    $g bench micro --pattern seq --size 512M --local 25% --json "${extra[@]}" > "$here/$cfg-$rep.json"
  done
done
