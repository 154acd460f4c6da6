//! The management thread: it reads the demand since it last looked and refills the heap
//! (Algorithm 1) and the pool (Algorithm 2) from the window, pre-faulting each piece before the
//! program can see it, then sleeps until a request takes the heap or the pool under its low
//! watermark (the refill threshold) or finds nothing ready (`wake.rs`). Woken by a request, it
//! sizes the refill from the demand that drained the reserve; woken by its timeout, from the
//! demand per period (2 ms, Hermes's `f`). The pool is sized from the large requests' rate over
//! the thread's measured reaction time (`LargeDemand`, [`refill_pool`]), and its chunks are
//! published while they form (`forming.rs`). The timeout is one period while the program asks,
//! doubling to a second while it does not: an idle service's reserve costs about one wake-up a
//! second, when it publishes the reserve's stats for `gleaner status`.
//!
//! The thread is gleaner's runtime (its own allocations come from the C library), holds no lock
//! while it faults pages in, and never waits for a program thread, nor a program thread for it.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gleaner_pager::PAGE_SIZE;
use gleaner_policy::hermes::{
    demand_rate, heap_plan, horizon_us, per_period, pool_target, reaction_peak, target, Interval,
};
use gleaner_sys::cputime::thread_cpu_ns;

use super::pool::Chunk;
use super::stats::Phase;
use super::{window, Reserve};

/// Stocks the heap before the program runs (from the library's constructor): the first
/// refill, made on the caller's thread. A service allocates most at its start-up, before the
/// thread could have run: redis makes its 10,000 shared integers first, and beside a batch job
/// on a busy machine the thread's first refill came after 3,500-11,000 of them (all missed);
/// the program's own `malloc`s in a test missed half of 20,000 even on a quiet machine. Costs
/// the program's start the pre-faulting of the heap's least target (5 MiB, a few milliseconds)
/// once. If the window or the kernel refuses, the thread's first refill tries again.
pub(super) fn stock(r: &Reserve) {
    let cpu = thread_cpu_ns();
    let populating = r.stats.populate_cpu_ns.load(Ordering::Relaxed);
    refill_heap(r, Interval::default(), false);
    // The program's CPU, not the thread's: kept apart from the thread's pre-faulting time (the
    // thread's overhead is its own CPU less that).
    let s = &r.stats;
    s.populate_cpu_ns.fetch_sub(
        s.populate_cpu_ns.load(Ordering::Relaxed) - populating,
        Ordering::Relaxed,
    );
    s.stock_cpu_ns
        .store(thread_cpu_ns().saturating_sub(cpu), Ordering::Relaxed);
}

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

/// Where the thread runs: off the CPU of the request that last woke it (or missed), where it
/// can. A `SCHED_BATCH` thread does not preempt on wake-up, but once the scheduler gives it the
/// program's CPU (at a timer tick that ended the program's time slice) it keeps it for a slice
/// of its own, ended only at a later tick (4 ms apart at `HZ=250`): the program's request
/// waits that long. On another CPU the thread competes with whatever runs there (a batch job)
/// instead of with the service. `GLEANER_RESERVE_AFFINITY=any` leaves the affinity alone (read
/// at start-up, with the reserve's other settings).
struct Placement {
    /// The thread's affinity at its start (the process's), `None` when it is left alone.
    allowed: Option<Vec<usize>>,
    /// The CPU now left out, if any.
    avoided: Option<u32>,
}

impl Placement {
    /// For the calling thread: its affinity now is what it may choose from (`avoid` false:
    /// nothing is ever changed).
    fn new(avoid: bool) -> Placement {
        let allowed = avoid
            .then(gleaner_sys::affinity::current)
            .and_then(Result::ok)
            .map(|s| s.cpus())
            .filter(|c| c.len() > 1);
        Placement {
            allowed,
            avoided: None,
        }
    }

    /// Leaves CPU `cpu` out of the thread's affinity (`u32::MAX`: none known yet), if the
    /// thread may run elsewhere; on a refusal (the process's CPUs changed) it keeps what it has.
    fn step_off(&mut self, cpu: u32) {
        let Some(allowed) = &self.allowed else { return };
        if cpu == u32::MAX || self.avoided == Some(cpu) {
            return;
        }
        let rest: Vec<usize> = allowed
            .iter()
            .copied()
            .filter(|&c| c != cpu as usize)
            .collect();
        if rest.is_empty() {
            return;
        }
        if gleaner_sys::affinity::set(&gleaner_sys::affinity::CpuSet::of(rest)).is_ok() {
            self.avoided = Some(cpu);
        }
    }
}

/// The longest the thread sleeps while nothing is asked (it wakes then only to publish the
/// stats, which `gleaner status` reads once a second).
const MAX_IDLE: Duration = Duration::from_secs(1);

/// The reaction time assumed until one is measured (it halves every second unless a longer one
/// is seen): a woken `SCHED_BATCH` thread does not preempt, so on a busy CPU it waits out the
/// running task's time slice (wake-up delays of 2.7-3.6 ms measured on the 2-vCPU VM); a pool
/// sized for the 2 ms period alone ran dry two or three times while it learned a program's rate.
const FIRST_REACTION_US: u64 = 4_000;

/// What the thread knows of the large requests between refills: their demand rate, the mean
/// request (the chunks' size) and how late the thread reacts.
struct LargeDemand {
    /// Bytes per second ([`demand_rate`]), as of the thread's last wake-up.
    rate: f64,
    /// The mean large request seen last: the pool stays stocked with chunks of it between
    /// intervals that asked for none.
    mean: Option<usize>,
    /// The thread's reaction time the pool is sized for ([`reaction_peak`]), in microseconds,
    /// and when it was last updated.
    reaction_us: u64,
    reaction_at: Instant,
}

fn run(r: &'static Reserve) {
    let mut published = Instant::now() - Duration::from_secs(1);
    let mut last = Instant::now();
    let mut timeout = r.period;
    let period_us = r.period.as_micros() as u64;
    let mut large_demand = LargeDemand {
        rate: 0.0,
        mean: None,
        reaction_us: FIRST_REACTION_US,
        reaction_at: Instant::now(),
    };
    let mut small_misses = 0;
    let mut placement = Placement::new(r.avoid_requester_cpu);
    loop {
        // Until its first refill the thread is `Starting` (misses then are the program's
        // start-up, before the thread could have stocked anything).
        let starting = r.phase.load(Ordering::Relaxed) == Phase::Starting as u8;
        if !starting {
            r.enter(Phase::Asleep);
        }
        let woken = r.waker.sleep(timeout, || r.needs_refill());
        if !starting {
            r.enter(Phase::Other);
        }
        // The scheduling delay: from the request's wake-up call to now.
        let delay_us = r
            .waker
            .take_woken_at()
            .map(|at| r.now_ns().saturating_sub(at) / 1000);
        placement.step_off(r.requester_cpu.load(Ordering::Relaxed));
        let wall = Instant::now();
        let cpu = thread_cpu_ns();
        r.stats.wakeups.fetch_add(1, Ordering::Relaxed);
        r.missed.store(false, Ordering::Relaxed);
        r.release_trimmed();
        r.heap.settle();
        let elapsed = last.elapsed();
        last = Instant::now();
        let (small, large) = r.stats.take_interval();
        let elapsed_us = elapsed.as_micros() as u64;
        // Woken by a request: the interval's demand is what drained the reserve, taken as it
        // is. Woken by the timeout: the demand per period, the rate the target follows.
        let small = if woken {
            small
        } else {
            per_period(small, elapsed_us, period_us)
        };
        // A small request missed: the heap's ready bytes are holes too small for it (they count
        // as ready, so the plan alone would not grow the heap): grow by a whole target.
        let missed = r.stats.small_misses.load(Ordering::Relaxed);
        let fragmented = missed != small_misses;
        small_misses = missed;
        let horizon = horizon_us(period_us, large_demand.reaction_us);
        large_demand.rate = demand_rate(large_demand.rate, large.bytes, elapsed_us, horizon);
        if let Some(m) = large.mean() {
            large_demand.mean = Some(m);
        }
        let stocked = timed(r, Phase::Heap, || refill_heap(r, small, fragmented))
            & timed(r, Phase::Pool, || refill_pool(r, &large_demand, horizon));
        // The reaction time: the scheduling delay plus the time the thread was off its CPU
        // while refilling (preempted, or waiting in the kernel).
        let off_cpu_us = (wall.elapsed().as_nanos() as u64)
            .saturating_sub(thread_cpu_ns().saturating_sub(cpu))
            / 1000;
        large_demand.reaction_us = reaction_peak(
            large_demand.reaction_us,
            large_demand.reaction_at.elapsed().as_micros() as u64,
            Some(delay_us.unwrap_or(0) + off_cpu_us),
        );
        large_demand.reaction_at = Instant::now();
        r.enter(Phase::Other);
        r.stats
            .reaction_us
            .store(large_demand.reaction_us, Ordering::Relaxed);
        if let Some(d) = delay_us {
            r.stats.wake_delay_max_us.fetch_max(d, Ordering::Relaxed);
        }
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

/// Runs a refill `f` in phase `p` (the heap's or the pool's; the thread's first refills stay
/// `Starting`), timing it for the stats.
fn timed(r: &Reserve, p: Phase, f: impl FnOnce() -> bool) -> bool {
    if r.phase.load(Ordering::Relaxed) != Phase::Starting as u8 {
        r.enter(p);
    }
    let began = Instant::now();
    let res = f();
    let us = began.elapsed().as_micros() as u64;
    r.enter(Phase::Other);
    let s = &r.stats;
    if p == Phase::Pool {
        s.pool_refill_us.fetch_add(us, Ordering::Relaxed);
        s.pool_refill_max_us.fetch_max(us, Ordering::Relaxed);
    } else {
        s.heap_refill_us.fetch_add(us, Ordering::Relaxed);
    }
    res
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

/// Algorithm 2, sized from the rate: adds chunks of the mean large request while the pool is
/// under its target ([`pool_target`]: twice the demand over the thread's reaction time), one at a
/// time, each faulted in (and locked, within `RLIMIT_MEMLOCK`) before it joins the pool, so
/// that the program can take it at once. The demand that arrives during the refill raises the
/// target as it goes (a program that starts allocating is learned within one refill). Sets the
/// pool's low watermark (half the target) once a large request was seen. A refill lasts one
/// horizon at most (the heap's refill comes next; a pool still low wakes the thread at once).
/// Returns false if the window, the kernel or the bound refused a chunk.
fn refill_pool(r: &Reserve, demand: &LargeDemand, horizon: u64) -> bool {
    let Some(mean) = demand.mean else {
        return true;
    };
    let Some(len) = super::large_chunk_len(mean).filter(|&l| l <= r.pool_bound) else {
        return true;
    };
    let began = Instant::now();
    let mut rate = demand.rate;
    let mut seen = r.stats.large_bytes.load(Ordering::Relaxed);
    let mut since = Instant::now();
    loop {
        // The requests made while refilling (they are in the next interval too).
        let now_bytes = r.stats.large_bytes.load(Ordering::Relaxed);
        if now_bytes != seen || since.elapsed() >= Duration::from_micros(horizon) {
            let e = since.elapsed().as_micros() as u64;
            rate = demand_rate(rate, now_bytes.saturating_sub(seen), e, horizon);
            seen = now_bytes;
            since = Instant::now();
        }
        let target = pool_target(rate, horizon, r.pool_bound);
        r.pool_low.store(target / 2, Ordering::Relaxed);
        r.stats.pool_target.store(target, Ordering::Relaxed);
        let pooled = r.pool.pooled();
        if pooled + len > target.max(len)
            || pooled + len > r.pool_bound
            || began.elapsed() >= Duration::from_micros(horizon)
        {
            return true;
        }
        if !add_chunk(r, len) {
            return false;
        }
    }
}

/// Pages the thread faults in per call while it forms a chunk: between two calls a request
/// that found the pool empty may take the chunk as it is (`forming.rs`).
const FORM_PIECE: usize = 16 * PAGE_SIZE;

/// Faults in one chunk of `len` bytes and pools it. While it is being faulted in, the chunk is
/// published as *forming*: a request that finds the pool empty takes it as it is and faults
/// only the pages not yet in (where it would otherwise fault the whole chunk), and the thread
/// then stops and leaves it to the request. Returns false if the window, the kernel or the
/// bound refused.
fn add_chunk(r: &Reserve, len: usize) -> bool {
    let Some(start) = r.window.take(len) else {
        return false;
    };
    r.forming.publish(start, len);
    let mut done = 0;
    while done < len {
        let n = FORM_PIECE.min(len - done);
        if !r.forming.is(start) {
            // A request took it: the rest is its own to fault in.
            r.stats
                .populated_bytes
                .fetch_add(done as u64, Ordering::Relaxed);
            return true;
        }
        if !populate(r, start + done, n) {
            if r.forming.withdraw(start) {
                r.window.give(start, len);
            }
            return false;
        }
        done += n;
    }
    r.stats
        .populated_bytes
        .fetch_add(len as u64, Ordering::Relaxed);
    if !r.forming.withdraw(start) {
        // Taken after its last piece: whole, as good as a pooled chunk.
        return true;
    }
    let locked = r.stats.locked_bytes.load(Ordering::Relaxed) + len <= r.memlock_limit
        // SAFETY: the chunk is the reserve's, faulted in, handed to nobody yet.
        && unsafe { libc::mlock(start as *const libc::c_void, len) } == 0;
    if locked {
        r.stats.locked_bytes.fetch_add(len, Ordering::Relaxed);
    }
    if let Err(c) = r.pool.put(
        Chunk {
            start,
            len,
            locked,
            fresh: true,
        },
        r.pool_bound,
    ) {
        if c.locked {
            r.stats.locked_bytes.fetch_sub(c.len, Ordering::Relaxed);
        }
        r.window.give(c.start, c.len);
        return false;
    }
    true
}

/// Pre-faults `[start, start+len)` ([`window::populate`]), counting the CPU time it takes: the
/// page faults (and under pressure the reclaim) the program's first touches would otherwise
/// have met, apart from the thread's own overhead (waking, sleeping, bookkeeping).
fn populate(r: &Reserve, start: usize, len: usize) -> bool {
    let cpu = thread_cpu_ns();
    let res = window::populate(start, len);
    r.stats
        .populate_cpu_ns
        .fetch_add(thread_cpu_ns().saturating_sub(cpu), Ordering::Relaxed);
    if let Err(errno) = res {
        r.stats.populate_failures.fetch_add(1, Ordering::Relaxed);
        r.stats
            .populate_last_errno
            .store(errno as u64, Ordering::Relaxed);
    }
    res.is_ok()
}
