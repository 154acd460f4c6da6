#!/bin/bash
# Runs the service-time test (crates/cli/tests/pager_integrity.rs,
# a_remote_faults_service_time_excludes_the_woken_programs_run: one far read every 2 ms, the
# program and its handler on CPU 0) N times and keeps the line it prints with its stats.
# Usage, from the repository root: bench/results/install-stalls/run.sh [N] > OUT
N=${1:-3}
for i in $(seq "$N"); do
    cargo test --release -q -p gleaner-cli --test pager_integrity \
        a_remote_faults_service_time_excludes_the_woken_programs_run -- --nocapture 2>&1 |
        grep "remote faults;"
done
