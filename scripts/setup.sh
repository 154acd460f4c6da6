#!/usr/bin/env bash
# Installs what gleaner's build and tests need on a fresh Debian machine (run as root, or with
# sudo available). Idempotent: does nothing when everything is already there.
set -euo pipefail

need_apt=()
command -v cc >/dev/null || need_apt+=(build-essential)
command -v setpriv >/dev/null || need_apt+=(util-linux)
command -v python3 >/dev/null || need_apt+=(python3)
# Real programs the `gleaner run` tests put on far memory.
command -v memcached >/dev/null || need_apt+=(memcached)
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v redis-cli >/dev/null || need_apt+=(redis-tools)
# numpy for the test of big arrays freed and reallocated: python3's own, else Debian's.
python3 -c 'import numpy' 2>/dev/null || /usr/bin/python3 -c 'import numpy' 2>/dev/null ||
    need_apt+=(python3-numpy)
# The reference Prometheus parser, for the test of the metrics (tests/service.rs).
python3 -c 'import prometheus_client' 2>/dev/null ||
    /usr/bin/python3 -c 'import prometheus_client' 2>/dev/null ||
    need_apt+=(python3-prometheus-client)
# librocksdb's C API, for the RocksDB program of the Hermes test and benchmark
# (bench/hermes/rocksdb_latency.c).
[ -f /usr/include/rocksdb/c.h ] || need_apt+=(librocksdb-dev)
# systemd-analyze, for the test of the service units.
command -v systemd-analyze >/dev/null || need_apt+=(systemd)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing ${need_apt[*]} with apt-get" >&2
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi
# A JDK for the Java real-program test: large, so a failed install only warns (that test then
# fails, saying javac is missing) instead of stopping everything else.
if ! command -v javac >/dev/null; then
    echo "setup: installing default-jdk-headless with apt-get" >&2
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq default-jdk-headless ||
        echo "setup: WARNING: could not install a JDK; the Java test will fail" >&2
fi

if ! command -v cargo >/dev/null; then
    [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null; then
    echo "setup: Rust is not installed. gleaner needs Rust 1.88 or newer: install it with rustup" \
         "(https://rustup.rs) and run this again." >&2
    exit 1
fi
ver=$(rustc --version | awk '{print $2}')
if [ "$(printf '%s\n1.88.0\n' "$ver" | sort -V | head -1)" != "1.88.0" ]; then
    echo "setup: rustc $ver is too old; gleaner needs 1.88 or newer (rustup update)." >&2
    exit 1
fi
