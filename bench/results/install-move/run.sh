#!/usr/bin/env bash
# Builds install_move.c and runs it alternated: UFFDIO_COPY (mode 0) against UFFDIO_MOVE from a
# pre-populated staging area (mode 1), 50,000 random-order faults each, app and handler on CPU 0.
set -euo pipefail
cd "$(dirname "$0")"
gcc -O2 -pthread install_move.c -o /tmp/install_move
for round in 1 2 3; do
    for mode in 0 1; do
        echo "round $round: $(/tmp/install_move $mode 50000 0 0)"
    done
done
