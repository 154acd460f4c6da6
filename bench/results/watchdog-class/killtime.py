import os, signal, subprocess, sys, time
ts=[]
for i in range(10):
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(0.3)
    t0=time.monotonic()
    os.kill(p.pid, signal.SIGKILL)
    while True:
        pid, st = os.waitpid(p.pid, os.WNOHANG)
        if pid: break
        time.sleep(0.001)
    ts.append(time.monotonic()-t0)
    p.stdout.close(); p.stderr.close()
print("kill-to-reaped ms:", [round(t*1000,1) for t in ts])
