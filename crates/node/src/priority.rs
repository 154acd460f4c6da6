//! The control loop's scheduling priority. It takes soft memory back while others allocate, and
//! on a machine whose CPUs those others keep busy a loop at their priority reads the pressure
//! late: an antagonist allocating 1-2 GiB/s reached a cgroup's limit (an OOM kill) while the
//! daemon's thread waited for a CPU. So the loop's thread asks for a higher priority (nice
//! [`CONTROL_NICE`]) where it may (root, or `CAP_SYS_NICE`), as the kernel's own reclaim never
//! queues behind the allocators it serves.

/// The nice value the control loop's thread asks for.
pub const CONTROL_NICE: i32 = -10;

/// Gives the calling thread nice `nice`; returns whether the kernel allowed it.
pub fn raise_this_thread(nice: i32) -> bool {
    // SAFETY: gettid and setpriority have no memory-safety preconditions; PRIO_PROCESS with a
    // thread id sets that thread's nice value alone on Linux.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_may_always_lower_its_own_priority() {
        // Raising needs privilege; lowering (a higher nice) never does, and touches only the
        // calling thread.
        std::thread::spawn(|| {
            assert!(raise_this_thread(5));
            // SAFETY: getpriority has no memory-safety preconditions.
            let now =
                unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
            assert_eq!(now, 5);
        })
        .join()
        .unwrap();
    }
}
