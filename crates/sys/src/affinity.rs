//! The calling thread's CPU affinity: read it, set it, pin to one CPU.

use std::io;

/// The largest number of CPUs a set can name (`CPU_SETSIZE`).
pub const MAX_CPUS: usize = libc::CPU_SETSIZE as usize;

/// A set of CPUs, as the kernel's affinity calls take it.
#[derive(Clone, Copy)]
pub struct CpuSet(libc::cpu_set_t);

impl CpuSet {
    /// The empty set.
    pub fn empty() -> CpuSet {
        // SAFETY: cpu_set_t is plain data, for which all zeroes is the empty set.
        CpuSet(unsafe { std::mem::zeroed() })
    }

    /// The set of `cpus` (those at or past [`MAX_CPUS`] are left out).
    pub fn of(cpus: impl IntoIterator<Item = usize>) -> CpuSet {
        let mut set = CpuSet::empty();
        for cpu in cpus.into_iter().filter(|&c| c < MAX_CPUS) {
            // SAFETY: CPU_SET writes bit `cpu` of the live set, below CPU_SETSIZE.
            unsafe { libc::CPU_SET(cpu, &mut set.0) };
        }
        set
    }

    /// The CPUs in the set, in order.
    pub fn cpus(&self) -> Vec<usize> {
        (0..MAX_CPUS)
            // SAFETY: CPU_ISSET reads bit `i` of the live set, and i < CPU_SETSIZE.
            .filter(|&i| unsafe { libc::CPU_ISSET(i, &self.0) })
            .collect()
    }
}

/// The calling thread's affinity.
pub fn current() -> io::Result<CpuSet> {
    let mut set = CpuSet::empty();
    // SAFETY: sched_getaffinity writes at most size_of::<cpu_set_t>() bytes into the live set.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set.0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(set)
}

/// Lets the calling thread run on `set` only.
pub fn set(set: &CpuSet) -> io::Result<()> {
    // SAFETY: sets the calling thread's affinity from a live set of the size given.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set.0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Pins the calling thread to `cpu`: an error names a CPU past [`MAX_CPUS`], or the kernel's
/// refusal (a CPU offline or outside the cpuset).
pub fn pin_to(cpu: usize) -> io::Result<()> {
    if cpu >= MAX_CPUS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "CPU {cpu} is beyond the largest CPU number ({})",
                MAX_CPUS - 1
            ),
        ));
    }
    set(&CpuSet::of([cpu]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_pinned_to_one_of_its_cpus_runs_there_and_gets_its_set_back() {
        std::thread::spawn(|| {
            let before = current().unwrap();
            let cpu = *before.cpus().last().unwrap();
            pin_to(cpu).unwrap();
            assert_eq!(current().unwrap().cpus(), vec![cpu]);
            // SAFETY: sched_getcpu has no preconditions.
            assert_eq!(unsafe { libc::sched_getcpu() }, cpu as i32);
            set(&before).unwrap();
            assert_eq!(current().unwrap().cpus(), before.cpus());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_cpu_past_the_set_size_is_refused_by_name() {
        let e = pin_to(MAX_CPUS).unwrap_err();
        assert!(e.to_string().contains(&MAX_CPUS.to_string()), "{e}");
        assert_eq!(CpuSet::of([3, MAX_CPUS + 5, 1]).cpus(), vec![1, 3]);
    }
}
