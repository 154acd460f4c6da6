#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, unit and end-to-end tests (real
# userfaultfd, real memnode processes over real sockets, a real C program), and a short fuzz run
# of the protocol decoder. Run as root (the userfaultfd-permission test switches to `nobody`).
set -euo pipefail
cd "$(dirname "$0")/.."

# /dev/null must be the null device: a root process that once replaced it with a file (a test
# writing its results "atomically" to /dev/null did) leaves every later reader of /dev/null,
# rustc's probes among them, reading junk. Repair it loudly, and check again after the tests.
devnull_ok() { [ -c /dev/null ]; }
if ! devnull_ok; then
    echo "WARNING: /dev/null is not the null device (something replaced it); recreating it" >&2
    rm -f /dev/null && mknod -m 666 /dev/null c 1 3
    # Cargo caches its rustc probes, failures included: drop what was probed meanwhile.
    rm -f target/.rustc_info.json fuzz/target/.rustc_info.json
fi
bash scripts/setup.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

step() { printf '\n=== %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --release -- -D warnings

step "cargo build --release"
cargo build --workspace --release

step "cargo test --release"
cargo test --workspace --release -- --test-threads=2

step "benchmark harness: cgroup/zram setup and teardown, and a quick sweep (every workload and system at 50% local) checked for completeness"
if [ "${GLEANER_SKIP_BENCH_QUICK:-0}" = 1 ]; then
    echo "WARNING: GLEANER_SKIP_BENCH_QUICK=1: the harness's quick sweep was NOT run" >&2
    make -s bench-test
else
    # The headline ratio only: the sweep's other ratios run the same code paths (`make
    # bench-quick` runs them all).
    HARNESS_RUN_QUICK=1 HARNESS_QUICK_RATIOS=50 make -s bench-test
fi

step "concerto (LLM co-serving, serve/): model numerics, scheduler, far-memory checkpoints, HTTP"
# Uses target/release/libgleaner.so and gleaner-memnode built above; numpy only (no torch needed).
(cd serve && OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 -m unittest discover -s tests -t . -v)

devnull_ok || { echo "FAIL: a test replaced /dev/null with a regular file" >&2; exit 1; }

step "fuzz the protocol decoder (${GLEANER_FUZZ_SECONDS:-30} s)"
if rustup toolchain list 2>/dev/null | grep -q nightly; then
    command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
    # Seeds (one valid frame of every kind) get the fuzzer past the header checks at once.
    (cd fuzz && mkdir -p corpus/decode_frame && \
        cargo +nightly fuzz run decode_frame corpus/decode_frame seeds/decode_frame -- \
            -dict=decode_frame.dict -max_len=16384 -rss_limit_mb=2048 \
            -max_total_time="${GLEANER_FUZZ_SECONDS:-30}")
else
    echo "WARNING: no nightly Rust toolchain: the cargo-fuzz run of the protocol decoder was NOT" \
         "run (the decoder's garbage-input unit tests above did run)." >&2
fi
echo
echo "all checks passed"
