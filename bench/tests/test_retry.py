"""The harness runs a linux-swap cell once more when the kernel OOM-killed it in its cgroup (the
cgroup-v1 OOM killer fires now and then under heavy swap traffic), keeps the first try on
record, and says so in the report; any other failure is not retried. The cells themselves are
replaced by a stand-in here: what is tested is the runner's bookkeeping."""
import os
import tempfile

from bench.harness import report, runner

OOM = "OOM-killed by the kernel in the memory cgroup (1 kill(s)); mcload load failed"


class _Workload:
    name = "fake"
    description = "a stand-in workload"
    throughput_unit = "requests/s"
    has_latency = False
    metric_keys = ["throughput"]
    systems = ["all-local", "linux-swap"]
    ratios = [50]

    def params(self):
        return {}

    def run_params(self):
        return {}


def _suite(outcomes):
    # A results path of its own: the suite writes it by replacing the file (as root, a path like
    # /dev/null would be replaced by a regular file, and every later reader of /dev/null, rustc's
    # probes in CI included, would read what was written there).
    out = os.path.join(tempfile.mkdtemp(), "results.json")
    s = runner.Suite("run", [], out, "test", systems=["linux-swap"], ratios=[50],
                     progress=False)
    s.results = {"workloads": {}}
    s.tmp_root = tempfile.mkdtemp()
    s.total_cells, s.done_cells = 0, 0
    calls = []

    def cell(w, system, ratio, budget, memnode):
        calls.append(system)
        if system == "all-local":
            return {"system": system, "ratio": None, "ok": True, "peak_rss_bytes": 100 << 20,
                    "metrics": {"throughput": 10.0}}
        ok, err = outcomes.pop(0)
        return {"system": system, "ratio": ratio, "ok": ok, "error": err, "cell_s": 1.0,
                "started": "t", "metrics": {"throughput": 5.0} if ok else {}}

    s._cell = cell
    return s, calls


def test_an_oom_killed_linux_swap_cell_is_run_once_more():
    s, calls = _suite([(False, OOM), (True, None)])
    s._workload(_Workload(), None)
    runs = s.results["workloads"]["fake"]["runs"]
    swap = [r for r in runs if r["system"] == "linux-swap"]
    assert calls.count("linux-swap") == 2 and len(swap) == 1
    assert swap[0]["ok"] and swap[0]["first_try"]["error"] == OOM
    assert "second try" in report._cell_line({"has_latency": False}, swap[0])


def test_other_failures_and_a_second_oom_are_not_retried_again():
    s, calls = _suite([(False, "exit status 1")])
    s._workload(_Workload(), None)
    assert calls.count("linux-swap") == 1
    s, calls = _suite([(False, OOM), (False, OOM)])
    s._workload(_Workload(), None)
    swap = [r for r in s.results["workloads"]["fake"]["runs"] if r["system"] == "linux-swap"]
    assert calls.count("linux-swap") == 2 and not swap[0]["ok"] and swap[0]["first_try"]
