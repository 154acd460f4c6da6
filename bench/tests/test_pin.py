"""The harness's --pin: servers on CPU 0 and their clients on CPU 1 under every system alike,
recorded in the results' params; where it cannot pin (one CPU, no taskset), nothing is pinned
and the params say nothing of pinning."""
import os
import shutil

from bench.harness.workloads import Memcached, Redis, all_workloads


def test_pinned_servers_and_clients_and_the_record_of_it():
    can = (os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None
    for w in (Redis(True, pin=True), Memcached(True, pin=True)):
        cmd = w.server_cmd("1234", "/tmp")
        if can:
            assert cmd[:3] == ["taskset", "-c", "0"], cmd
            assert w.pinned("client") == ["taskset", "-c", "1"]
            assert "pinned" in w.run_params()
        else:
            assert cmd[0] != "taskset" and "pinned" not in w.run_params()
    # Unpinned by default, and the batch jobs are never pinned.
    assert Redis(True).server_cmd("1234", "/tmp")[0] != "taskset"
    assert "pinned" not in Redis(True).run_params()
    assert not any(w.pin for w in all_workloads(True, ["xgboost", "pagerank"], pin=True))
