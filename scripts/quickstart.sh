#!/usr/bin/env bash
# Builds gleaner and runs an unmodified program on far memory with an embedded memnode: a Python
# job that builds ~130 MB of objects, first all-local, then under `gleaner run` with 64 MiB of
# local memory (the rest of its heap lives on a private memnode started for the run). The two
# checksums must match. Extra arguments go to `gleaner run` (e.g. --local-mem 32M).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --workspace
# The real interpreter (a version manager's shim would put its own processes under gleaner too).
PY=$(python3 -c 'import sys; print(sys.executable)')
echo
echo "== all-local: $PY scripts/demo_job.py 50000"
"$PY" scripts/demo_job.py 50000
echo
echo "== far memory: gleaner run --local-mem 64M $* -- $PY scripts/demo_job.py 50000"
exec target/release/gleaner run --local-mem 64M "$@" -- "$PY" scripts/demo_job.py 50000
