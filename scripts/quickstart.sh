#!/usr/bin/env bash
# Builds gleaner and runs a program's memory on far memory with an embedded memnode: a 256 MiB
# region of which only 25% may be resident, random accesses checked word by word, beside the
# same run all-local and the raw userfaultfd and transport floors.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --workspace
echo
exec target/release/gleaner bench micro --pattern random --size 256M --local 25% "$@"
