import socket, time, os, resource, glob
resource.setrlimit(resource.RLIMIT_NOFILE, (20000, 20000))
keep=[socket.socketpair() for _ in range(5000)]
def watch_cpu():
    for t in glob.glob(f"/proc/{os.getpid()}/task/*"):
        if open(t+"/comm").read().strip()=="gleaner-watch":
            f=open(t+"/stat").read().rsplit(") ",1)[1].split()
            return (int(f[11])+int(f[12]))/os.sysconf("SC_CLK_TCK")
t0=time.time(); c0=watch_cpu(); time.sleep(float(os.environ.get("SECS","10"))); c1=watch_cpu()
print(f"watchdog CPU with {len(os.listdir('/proc/self/fd'))} descriptors: {100*(c1-c0)/(time.time()-t0):.2f}% of a CPU")
