#!/usr/bin/env bash
# Installs what the benchmark harness's workloads need (run as root on Debian; idempotent) and
# builds its load generator. Python packages go to the interpreter that runs the harness
# (PYTHON, default: python3's real executable).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-$(python3 -c 'import os,sys; print(os.path.realpath(sys.executable))')}

need_apt=()
command -v gcc >/dev/null || need_apt+=(gcc libc6-dev)
command -v memcached >/dev/null || need_apt+=(memcached)
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v redis-benchmark >/dev/null || need_apt+=(redis-tools)
command -v mkswap >/dev/null || need_apt+=(util-linux)
command -v zramctl >/dev/null || need_apt+=(util-linux)
command -v modprobe >/dev/null || need_apt+=(kmod)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "harness setup: apt-get install ${need_apt[*]}" >&2
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi
# Debian starts memcached and redis as services on install: the harness starts its own.
for svc in memcached redis-server; do
    if command -v systemctl >/dev/null && systemctl is-active --quiet "$svc" 2>/dev/null; then
        systemctl stop "$svc" || true
    fi
done

need_pip=()
"$PY" -c 'import numpy' 2>/dev/null || need_pip+=(numpy)
"$PY" -c 'import xgboost' 2>/dev/null || need_pip+=(xgboost-cpu)
"$PY" -c 'import matplotlib' 2>/dev/null || need_pip+=(matplotlib)
"$PY" -c 'import tqdm' 2>/dev/null || need_pip+=(tqdm)
"$PY" -c 'import pytest' 2>/dev/null || need_pip+=(pytest)
if [ ${#need_pip[@]} -gt 0 ]; then
    echo "harness setup: $PY -m pip install ${need_pip[*]}" >&2
    "$PY" -m pip install -q --root-user-action=ignore "${need_pip[@]}"
fi

mkdir -p build
if [ ! -x build/mcload ] || [ mcload.c -nt build/mcload ]; then
    gcc -O2 -Wall -o build/mcload mcload.c -lm
fi
echo "harness setup: ok ($PY)" >&2
