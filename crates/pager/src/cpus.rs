//! The process's CPUs: which it may run on, and placing the pager's threads on them (fault
//! handlers pinned one per CPU, reclaim threads let onto every CPU), and a thread's CPU time.

use gleaner_sys::affinity;

/// The CPUs this process may run on (its affinity mask), in order.
pub(crate) fn allowed_cpus() -> Vec<usize> {
    affinity::current()
        .map(|set| set.cpus())
        .unwrap_or_default()
}

/// Lets the calling thread run on every online CPU (the kernel keeps it within the process's
/// cgroup cpuset): a reclaim thread of a program pinned to one CPU then works beside it, as
/// Linux's kswapd would, instead of taking turns with it.
pub(crate) fn allow_every_cpu() {
    // Every CPU number a set can hold: the kernel keeps those online and in the cpuset, so CPUs
    // numbered past the count of online ones (an offline CPU in between) are not left out.
    if let Err(e) = affinity::set(&affinity::CpuSet::of(0..affinity::MAX_CPUS)) {
        log::debug!("a reclaim thread stays on the program's CPUs: {e}");
    }
}

/// Pins the calling thread to `cpu`.
pub(crate) fn pin_to(cpu: usize) {
    if let Err(e) = affinity::pin_to(cpu) {
        log::warn!("pinning a fault handler to CPU {cpu}: {e}");
    }
}

pub(crate) use gleaner_sys::cputime::thread_cpu_ns;
