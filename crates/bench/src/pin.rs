//! `--pin-cpu N`: the threads that run the access pattern (and the init pass) on one CPU, so that
//! gleaner and the plain-memory run under Linux swap can be pinned alike.
//!
//! Threads inherit the affinity of the thread that creates them, so pinning the thread that
//! spawns the stream threads pins those too. Pin *after* the region exists: its fault handlers,
//! evictor and embedded memnode are not the program's threads and keep their own placement.

/// The calling thread's affinity before it was pinned; restored on drop.
/// Not `Send`: it must be dropped on the thread it pinned.
pub struct Pinned {
    saved: libc::cpu_set_t,
    _same_thread: std::marker::PhantomData<*const ()>,
}

/// Pins the calling thread to `cpu`; the returned guard puts the previous affinity back.
pub fn pin_current_thread(cpu: usize) -> Result<Pinned, String> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(format!(
            "--pin-cpu {cpu}: beyond the largest CPU number ({})",
            libc::CPU_SETSIZE - 1
        ));
    }
    // SAFETY: cpu_set_t is plain data, for which all zeroes is the empty set.
    let mut saved: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most size_of::<cpu_set_t>() bytes into the live `saved`.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut saved) };
    if rc != 0 {
        return Err(format!(
            "sched_getaffinity: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: as above, all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes bit `cpu` of the live set, and cpu < CPU_SETSIZE was checked above.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: sets the calling thread's affinity from a live set of the size given.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(format!(
            "--pin-cpu {cpu}: sched_setaffinity: {} (is CPU {cpu} online and allowed?)",
            std::io::Error::last_os_error()
        ));
    }
    Ok(Pinned {
        saved,
        _same_thread: std::marker::PhantomData,
    })
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: sets the calling thread's affinity from the live set saved when it was pinned.
        let rc = unsafe {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.saved)
        };
        if rc != 0 {
            log::warn!(
                "restoring the CPU affinity after --pin-cpu: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}
