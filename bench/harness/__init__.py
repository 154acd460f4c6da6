"""gleaner's benchmark harness: real workloads at local-memory ratios 100/75/50/25% of their
footprint, under all-local, gleaner (embedded and separate memnode) and Linux swap (memory cgroup +
zram), with results as JSON under bench/results/harness-*.json, plots and a generated section of
bench/results/DETAILS.md. Entry point: `python3 -m bench.harness --help`."""
