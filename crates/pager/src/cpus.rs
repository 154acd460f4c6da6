//! The process's CPUs: which it may run on, and placing the pager's threads on them (fault
//! handlers pinned one per CPU, reclaim threads let onto every CPU), and a thread's CPU time.

/// The CPUs this process may run on (its affinity mask), in order.
pub(crate) fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data, for which all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most size_of::<cpu_set_t>() bytes into the live `set`.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: CPU_ISSET reads bit `i` of the set, and i < CPU_SETSIZE keeps it in bounds.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
}

/// Lets the calling thread run on every online CPU (the kernel keeps it within the process's
/// cgroup cpuset): a reclaim thread of a program pinned to one CPU then works beside it, as
/// Linux's kswapd would, instead of taking turns with it.
pub(crate) fn allow_every_cpu() {
    // Every CPU number a set can hold: the kernel keeps those online and in the cpuset, so CPUs
    // numbered past the count of online ones (an offline CPU in between) are not left out.
    if let Err(e) = set_affinity(0..libc::CPU_SETSIZE as usize) {
        log::debug!("a reclaim thread stays on the program's CPUs: {e}");
    }
}

/// Pins the calling thread to `cpu`.
pub(crate) fn pin_to(cpu: usize) {
    if let Err(e) = set_affinity(std::iter::once(cpu)) {
        log::warn!("pinning a fault handler to CPU {cpu}: {e}");
    }
}

/// Lets the calling thread run on `cpus` only (those at or past `CPU_SETSIZE` are left out).
fn set_affinity(cpus: impl Iterator<Item = usize>) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data, for which all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for cpu in cpus.filter(|&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: CPU_SET writes bit `cpu` of the set, below CPU_SETSIZE.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: sets the calling thread's affinity from a live set of the size given.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// This thread's CPU time in nanoseconds.
pub(crate) fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the live local `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
