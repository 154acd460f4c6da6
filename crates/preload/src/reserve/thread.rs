//! The management thread: it reads the demand since it last looked and refills the heap
//! (Algorithm 1) and the pool (Algorithm 2) from the window, pre-faulting each piece before the
//! program can see it, then sleeps until a request takes the heap or the pool under its low
//! watermark (the refill threshold) or finds nothing ready (`wake.rs`). Woken by a request, it
//! sizes the refill from the demand that drained the reserve; woken by its timeout, from the
//! demand per period (2 ms, Hermes's `f`). The timeout is one period while the program asks,
//! doubling to a second while it does not: an idle service's reserve costs about one wake-up a
//! second, when it publishes the reserve's stats for `gleaner status`.
//!
//! The thread is gleaner's runtime (its own allocations come from the C library), holds no lock
//! while it faults pages in, and never waits for a program thread, nor a program thread for it.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gleaner_pager::PAGE_SIZE;
use gleaner_policy::hermes::{heap_plan, per_period, pool_refill, target, Interval};
use gleaner_sys::cputime::thread_cpu_ns;

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

/// The thread's priority, `GLEANER_RESERVE_PRIORITY`: `batch` (the default: `SCHED_BATCH` at
/// the normal nice value), `normal` (`SCHED_OTHER`), `low` (nice 19) or `idle` (`SCHED_IDLE`:
/// only CPU time no other thread of the machine wants).
///
/// `SCHED_BATCH` keeps the thread's fair share of the CPU but takes away its wake-up
/// preemption: a request that wakes the thread (taking the reserve under its watermark) then
/// keeps its CPU, where under `SCHED_OTHER` the woken thread could take the CPU from it for
/// its whole refill (a millisecond of pre-faulting) on a busy machine, in the middle of the
/// request. Below the normal weight (`low`, `idle`), under CPU contention the reserve runs short
/// and requests fall back (counted as misses: with `idle`, the 256 KiB microbenchmark on the
/// busy 2-vCPU VM got no gain at all).
fn set_priority() {
    match std::env::var("GLEANER_RESERVE_PRIORITY").as_deref() {
        Ok("low") => {
            // SAFETY: changes the calling thread's own nice value (PRIO_PROCESS of tid 0).
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
        }
        Ok("idle") => set_policy(libc::SCHED_IDLE),
        Ok("normal") => {}
        _ => set_policy(libc::SCHED_BATCH),
    }
}

/// The longest the thread sleeps while nothing is asked (it wakes then only to publish the
/// stats, which `gleaner status` reads once a second).
const MAX_IDLE: Duration = Duration::from_secs(1);

fn run(r: &'static Reserve) {
    let mut published = Instant::now() - Duration::from_secs(1);
    let mut last = Instant::now();
    let mut timeout = r.period;
    // The mean large request seen last: the pool stays stocked with chunks of it between
    // intervals that asked for none.
    let mut large_mean = None;
    let mut small_misses = 0;
    loop {
        let woken = r.waker.sleep(timeout, || r.needs_refill());
        r.stats.wakeups.fetch_add(1, Ordering::Relaxed);
        r.missed.store(false, Ordering::Relaxed);
        let elapsed = last.elapsed();
        last = Instant::now();
        let (small, large) = r.stats.take_interval();
        // Woken by a request: the interval's demand is what drained the reserve, taken as it
        // is. Woken by the timeout: the demand per period, the rate the target follows.
        let (small, large) = if woken {
            (small, large)
        } else {
            let (e, p) = (elapsed.as_micros() as u64, r.period.as_micros() as u64);
            (per_period(small, e, p), per_period(large, e, p))
        };
        if let Some(m) = large.mean() {
            large_mean = Some(m);
        }
        let large = match (large.count, large_mean) {
            (0, Some(m)) => Interval { bytes: m, count: 1 },
            _ => large,
        };
        // A small request missed: the heap's ready bytes are holes too small for it (they count
        // as ready, so the plan alone would not grow the heap): grow by a whole target.
        let missed = r.stats.small_misses.load(Ordering::Relaxed);
        let fragmented = missed != small_misses;
        small_misses = missed;
        let stocked = refill_heap(r, small, fragmented) & refill_pool(r, large);
        // Woken by a request: the next timeout is one period. Woken by the timeout, the
        // reserve did not run low in it: twice as long, up to MAX_IDLE (a request that takes
        // the reserve low wakes the thread whenever it comes).
        timeout = if woken {
            r.period
        } else {
            (timeout * 2).min(MAX_IDLE)
        };
        r.stats
            .thread_cpu_ns
            .store(thread_cpu_ns(), Ordering::Relaxed);
        if published.elapsed() >= Duration::from_secs(1) {
            published = Instant::now();
            super::report::publish();
        }
        if !stocked {
            // The window is full or the kernel refused memory: no request's wake-up can help
            // before a period has passed.
            r.heap_low.store(0, Ordering::Relaxed);
            r.pool_low.store(0, Ordering::Relaxed);
            std::thread::sleep(r.period);
        }
    }
}

/// Sets the calling thread's scheduling policy (one with no static priority).
fn set_policy(policy: i32) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: changes the calling thread's own policy (pid 0) with a valid parameter.
    unsafe { libc::sched_setscheduler(0, policy, &param) };
}

/// Algorithm 1: grows the heap step by step, each step faulted in before it joins the heap;
/// sets the heap's low watermark (the refill threshold). Returns false if the window or the
/// kernel refused a step.
///
/// `fragmented`: a request found no block although the heap counts ready bytes; the plan is
/// made as if none were ready.
fn refill_heap(r: &Reserve, last: Interval, fragmented: bool) -> bool {
    let free = if fragmented { 0 } else { r.heap.free_bytes() };
    let plan = heap_plan(last, free, r.heap_bound, PAGE_SIZE);
    r.heap_low
        .store(target(last, r.heap_bound) / 2, Ordering::Relaxed);
    let mut added = 0;
    while added < plan.grow {
        let Some(start) = r.window.take(plan.step) else {
            return false;
        };
        if !populate(r, start, plan.step) {
            r.window.give(start, plan.step);
            return false;
        }
        r.stats
            .populated_bytes
            .fetch_add(plan.step as u64, Ordering::Relaxed);
        // SAFETY: a step of the window just taken and faulted in, referenced by nothing else.
        unsafe { r.heap.grow(start, plan.step) };
        added += plan.step;
    }
    true
}

/// Algorithm 2: adds chunks of the interval's mean large request while the pool is under its
/// target; each is faulted in (and locked, within `RLIMIT_MEMLOCK`) before it joins the pool.
/// Sets the pool's low watermark once a large request was seen. Returns false if the window,
/// the kernel or the bound refused a chunk.
fn refill_pool(r: &Reserve, last: Interval) -> bool {
    if last.count > 0 {
        r.pool_low
            .store(target(last, r.pool_bound) / 2, Ordering::Relaxed);
    }
    let Some((n, len)) = pool_refill(
        last,
        r.pool.pooled(),
        r.pool_bound,
        super::HEADER + 16,
        PAGE_SIZE,
    ) else {
        return true;
    };
    for _ in 0..n {
        let Some(start) = r.window.take(len) else {
            return false;
        };
        if !populate(r, start, len) {
            r.window.give(start, len);
            return false;
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
            return false;
        }
    }
    true
}

/// Pre-faults `[start, start+len)` ([`window::populate`]), counting the CPU time it takes: the
/// page faults (and under pressure the reclaim) the program's first touches would otherwise
/// have met, apart from the thread's own overhead (waking, sleeping, bookkeeping).
fn populate(r: &Reserve, start: usize, len: usize) -> bool {
    let cpu = thread_cpu_ns();
    let ok = window::populate(start, len);
    r.stats
        .populate_cpu_ns
        .fetch_add(thread_cpu_ns().saturating_sub(cpu), Ordering::Relaxed);
    ok
}
