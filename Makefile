# Benchmark harness (bench/harness). Needs a release build and root (cgroups, zram swap).
#   make bench-quick   smoke sweep, small sizes, a few minutes -> bench/results/harness-quick.json
#   make bench         full sweep, ~30-40 minutes                -> bench/results/harness-full.json
#   make bench-test    the harness's own tests (cgroup/zram teardown, JSON completeness)
#   make bench-clean   undo whatever an interrupted harness left behind (idempotent)
PYTHON ?= $(shell python3 -c 'import os,sys; print(os.path.realpath(sys.executable))')

.PHONY: bench bench-quick bench-setup bench-build bench-test bench-clean bench-render

bench-build:
	cargo build --release

bench-setup:
	PYTHON=$(PYTHON) bash bench/harness/setup.sh

bench-quick: bench-build bench-setup
	$(PYTHON) -m bench.harness quick

bench: bench-build bench-setup
	$(PYTHON) -m bench.harness full

bench-render:
	$(PYTHON) -m bench.harness render

bench-test: bench-setup
	$(PYTHON) -m pytest bench/tests -q

bench-clean:
	$(PYTHON) -m bench.harness cleanup
