//! The calling thread's CPU time, for the costs gleaner's threads report about themselves.

/// This thread's CPU time so far in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`; 0 if the clock
/// cannot be read).
pub fn thread_cpu_ns() -> u64 {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_spins_sees_its_cpu_time_grow() {
        let before = thread_cpu_ns();
        let t0 = std::time::Instant::now();
        let mut x = 0u64;
        while t0.elapsed() < std::time::Duration::from_millis(20) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(thread_cpu_ns() > before + 5_000_000, "{x}");
    }
}
