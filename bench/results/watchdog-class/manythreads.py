import threading, time, os, glob
ev=threading.Event()
ts=[threading.Thread(target=ev.wait) for _ in range(1000)]
for t in ts: t.start()
def watch_cpu():
    for t in glob.glob(f"/proc/{os.getpid()}/task/*"):
        try:
            if open(t+"/comm").read().strip()=="gleaner-watch":
                f=open(t+"/stat").read().rsplit(") ",1)[1].split()
                return (int(f[11])+int(f[12]))/os.sysconf("SC_CLK_TCK")
        except OSError: pass
time.sleep(2)
t0=time.time(); c0=watch_cpu(); time.sleep(float(os.environ.get("SECS","20"))); c1=watch_cpu()
print(f"watchdog CPU with {len(os.listdir('/proc/self/task'))} threads: {100*(c1-c0)/(time.time()-t0):.2f}% of a CPU")
ev.set()
