//! The management thread: every period (2 ms, Hermes's `f`) it reads the interval's demand and
//! refills the heap (Algorithm 1) and the pool (Algorithm 2) from the window, pre-faulting each
//! piece before the program can see it; every second it publishes the reserve's stats for
//! `gleaner status`.
//!
//! The thread is gleaner's runtime (its own allocations come from the C library), holds no lock
//! while it faults pages in, and never waits for a program thread, nor a program thread for it.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gleaner_pager::PAGE_SIZE;
use gleaner_policy::hermes::{heap_plan, pool_refill};

use super::pool::Chunk;
use super::{window, Reserve};

/// Starts the thread for `r`.
pub(super) fn spawn(r: &'static Reserve) -> Result<(), String> {
    let t = std::thread::Builder::new()
        .name("gleaner-reserve".into())
        .stack_size(256 * 1024)
        .spawn(move || {
            crate::mark_runtime_thread();
            set_priority();
            run(r)
        })
        .map_err(|e| format!("starting the reserve's thread: {e}"))?;
    drop(t);
    Ok(())
}

/// The thread's priority, `GLEANER_RESERVE_PRIORITY`: `normal` (the default), `low` (nice 19)
/// or `idle` (`SCHED_IDLE`: only CPU time no other thread of the machine wants). At normal
/// priority the thread's page faults compete with the service's own threads for the CPU; below
/// it, under CPU contention the reserve runs short and requests fall back (counted as misses:
/// with `idle`, the 256 KiB microbenchmark on the busy 2-vCPU VM got no gain at all).
fn set_priority() {
    match std::env::var("GLEANER_RESERVE_PRIORITY").as_deref() {
        Ok("low") => {
            // SAFETY: changes the calling thread's own nice value (PRIO_PROCESS of tid 0).
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
        }
        Ok("idle") => {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: changes the calling thread's own policy (pid 0) with a valid parameter.
            unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
        }
        _ => {}
    }
}

fn run(r: &'static Reserve) {
    let mut published = Instant::now() - Duration::from_secs(1);
    loop {
        std::thread::sleep(r.period);
        let cpu = thread_cpu_ns();
        r.stats.wakeups.fetch_add(1, Ordering::Relaxed);
        let (small, large) = r.stats.take_interval();
        refill_heap(r, small);
        refill_pool(r, large);
        r.stats
            .thread_cpu_ns
            .fetch_add(thread_cpu_ns().saturating_sub(cpu), Ordering::Relaxed);
        if published.elapsed() >= Duration::from_secs(1) {
            published = Instant::now();
            super::report::publish();
        }
    }
}

/// Algorithm 1: grows the heap step by step, each step faulted in before it joins the heap.
fn refill_heap(r: &Reserve, last: gleaner_policy::hermes::Interval) {
    let plan = heap_plan(last, r.heap.free_bytes(), r.heap_bound, PAGE_SIZE);
    let mut added = 0;
    while added < plan.grow {
        let Some(start) = r.window.take(plan.step) else {
            return;
        };
        if !window::populate(start, plan.step) {
            r.window.give(start, plan.step);
            return;
        }
        r.stats
            .populated_bytes
            .fetch_add(plan.step as u64, Ordering::Relaxed);
        // SAFETY: a step of the window just taken and faulted in, referenced by nothing else.
        unsafe { r.heap.grow(start, plan.step) };
        added += plan.step;
    }
}

/// Algorithm 2: adds chunks of the interval's mean large request while the pool is under its
/// target; each is faulted in (and locked, within `RLIMIT_MEMLOCK`) before it joins the pool.
fn refill_pool(r: &Reserve, last: gleaner_policy::hermes::Interval) {
    let Some((n, len)) = pool_refill(
        last,
        r.pool.pooled(),
        r.pool_bound,
        super::HEADER + 16,
        PAGE_SIZE,
    ) else {
        return;
    };
    for _ in 0..n {
        let Some(start) = r.window.take(len) else {
            return;
        };
        if !window::populate(start, len) {
            r.window.give(start, len);
            return;
        }
        r.stats
            .populated_bytes
            .fetch_add(len as u64, Ordering::Relaxed);
        let locked = r.stats.locked_bytes.load(Ordering::Relaxed) + len <= r.memlock_limit
            // SAFETY: the chunk is the reserve's, faulted in, handed to nobody yet.
            && unsafe { libc::mlock(start as *const libc::c_void, len) } == 0;
        if locked {
            r.stats.locked_bytes.fetch_add(len, Ordering::Relaxed);
        }
        if let Err(c) = r.pool.put(Chunk { start, len, locked }, r.pool_bound) {
            if c.locked {
                r.stats.locked_bytes.fetch_sub(c.len, Ordering::Relaxed);
            }
            r.window.give(c.start, c.len);
            return;
        }
    }
}

/// This thread's CPU time so far, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the live local.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
