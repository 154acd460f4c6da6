"""Runs a command in a memory cgroup of LIMIT MiB with swap on a fresh zram device (the harness's
Linux-swap environment): python3 linux_swap.py LIMIT_MIB CMD..."""
import subprocess, sys, time, os
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', '..'))
from bench.harness import swapenv
limit = int(sys.argv[1]) << 20
cmd = sys.argv[2:]
with swapenv.swap_environment(1 << 30) as (state, info):
    cg = swapenv.Cgroup(state, "perl-try", limit)
    t = time.time()
    r = subprocess.run(cmd, preexec_fn=cg.preexec(), capture_output=True, text=True, timeout=300)
    print(f"linux swap {sys.argv[1]}M: {time.time()-t:.2f} s rc {r.returncode} {r.stdout.strip()} {cg.memory_stat().get('pgmajfault') if hasattr(cg,'memory_stat') else ''}")
