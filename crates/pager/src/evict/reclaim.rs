//! Who evicts, and when: a pool of reclaim threads driven by Hermit's feedback-directed scheduler
//! (`gleaner_policy::reclaim`), its ablations (`static:N`, `direct`), and direct reclaim by a
//! faulting thread as the last resort. This module is the state they share with the rest of
//! the region; the reclaim threads' loop and direct reclaim are `evict/reclaimer.rs`.
//!
//! The scheduler is consulted inline where a page is charged to the budget
//! ([`Reclaim::on_charge`]); no thread spins to watch memory. Reclaim thread `i` runs batches
//! while `i < threads_for(resident)` and sleeps on a condition variable otherwise; a charge wakes
//! the pool when the scheduler asks for more threads than are awake.
//!
//! Feedback to the scheduler: every pool batch reports its pages and busy time
//! ([`ReclaimScheduler::on_reclaimed`], S_out); every fault on a page that was evicted reports the
//! page's turnaround, the time since its eviction, from a per-page eviction clock.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use gleaner_policy::reclaim::{ReclaimMode, ReclaimParams, ReclaimScheduler, ReclaimSnapshot};
use serde::Serialize;

use crate::evict::budget::Budget;
use crate::observe::counters::RegionCounters;

/// Resolution of the per-page eviction clock: 64 µs, so a `u32` covers about 76 hours.
const EVICT_TICK_NS: u64 = 64_000;

/// How long a sleeping reclaim thread waits before re-reading the scheduler on its own, in case a
/// wake-up was missed (the resident count can also fall without a charge, e.g. on discard).
const POOL_IDLE_RECHECK: Duration = Duration::from_millis(20);

/// The reclaim side of a region: the scheduler, the pool's wake-up, and its accounting.
pub(crate) struct Reclaim {
    sched: Mutex<ReclaimScheduler>,
    pool_size: usize,
    epoch: Instant,
    /// Per page: when it was last evicted, in [`EVICT_TICK_NS`] ticks since `epoch` plus one
    /// (0: never evicted).
    evicted_at: Box<[AtomicU32]>,
    /// One wake-up flag and condition variable per pool thread, so a charge wakes exactly the
    /// threads the scheduler asks for (no thundering herd on a small machine).
    wake: Box<[(Mutex<bool>, Condvar)]>,
    /// Pool threads not asleep.
    awake: AtomicUsize,
    /// The first pool thread has its evictor (`Region::launch` waits for it, so that its
    /// descriptors are made before the program runs).
    first_ready: AtomicBool,
    /// Batches in progress (pool and direct); `prepare_fork` waits for none.
    pub(crate) in_batch: AtomicUsize,
    /// Thread CPU time the pool spent in batches.
    pool_cpu_ns: AtomicU64,
    /// Wall time the pool spent in batches.
    pool_busy_ns: AtomicU64,
    pool_batches: AtomicU64,
    pool_pages: AtomicU64,
    /// Charges whose faulting thread had to reclaim synchronously first.
    direct_waits: AtomicU64,
    direct_pages: AtomicU64,
    /// Pages the allocator's release hook discarded.
    released_by_allocator: AtomicU64,
    /// Wall time faulting threads spent reclaiming directly.
    direct_ns: AtomicU64,
    /// Highest number of pool threads awake at once.
    peak_awake: AtomicUsize,
    /// Pool threads a charge asked for, not yet woken (0: none): see [`Reclaim::on_charge`].
    wake_wanted: AtomicUsize,
    /// Wake-ups of sleeping pool threads that charges asked for.
    pool_wakeups: AtomicU64,
}

/// Reclaim statistics: the scheduler's state plus what the pool and faulting threads did.
#[derive(Debug, Clone, Serialize)]
pub struct ReclaimStats {
    /// The scheduler's state: mode, watermarks, swap intensity, turnaround, direct reclaims.
    pub scheduler: ReclaimSnapshot,
    /// Reclaim threads created.
    pub pool_size: usize,
    /// Reclaim threads awake now.
    pub threads_awake: usize,
    /// The most reclaim threads awake at once.
    pub peak_threads_awake: usize,
    /// Sleeping reclaim threads woken because charges asked for them (each after the fault
    /// that asked was served).
    pub pool_wakeups: u64,
    /// Batches run by the pool.
    pub pool_batches: u64,
    /// Pages evicted by the pool.
    pub pool_pages: u64,
    /// Thread CPU time the pool spent in batches, in nanoseconds.
    pub pool_cpu_ns: u64,
    /// Wall time the pool spent in batches, in nanoseconds.
    pub pool_busy_ns: u64,
    /// Pages evicted per second of pool busy time, per thread.
    pub pool_pages_per_s: f64,
    /// Faults that waited while their own thread reclaimed synchronously.
    pub direct_waits: u64,
    /// Pages evicted by faulting threads.
    pub direct_pages: u64,
    /// Wall time faulting threads spent reclaiming, in nanoseconds.
    pub direct_ns: u64,
    /// `direct_waits` per page charged (zero-fill or remote fault).
    pub direct_wait_ratio: f64,
    /// Pages the program's allocator discarded when reclaim asked, instead of an eviction
    /// (freed blocks it kept for reuse: [`crate::RegionConfig::release_hook`]).
    pub released_by_allocator: u64,
}

impl Reclaim {
    /// Reclaim for a budget of `budget` pages over `pages` pages.
    pub(crate) fn new(pages: usize, budget: usize, mode: ReclaimMode, max_threads: usize) -> Self {
        let params = ReclaimParams {
            max_reclaimers: max_threads.max(1),
            ..ReclaimParams::default()
        };
        let sched = ReclaimScheduler::new(budget as u64, mode, params);
        let pool_size = sched.pool_size();
        let evicted_at = Box::<[AtomicU32]>::new_zeroed_slice(pages);
        // SAFETY: an all-zero u32 is a valid AtomicU32 holding 0 ("never evicted").
        let evicted_at = unsafe { evicted_at.assume_init() };
        Reclaim {
            sched: Mutex::new(sched),
            pool_size,
            epoch: Instant::now(),
            evicted_at,
            wake: (0..pool_size)
                .map(|_| (Mutex::new(false), Condvar::new()))
                .collect(),
            awake: AtomicUsize::new(0),
            first_ready: AtomicBool::new(false),
            in_batch: AtomicUsize::new(0),
            pool_cpu_ns: AtomicU64::new(0),
            pool_busy_ns: AtomicU64::new(0),
            pool_batches: AtomicU64::new(0),
            pool_pages: AtomicU64::new(0),
            direct_waits: AtomicU64::new(0),
            direct_pages: AtomicU64::new(0),
            released_by_allocator: AtomicU64::new(0),
            direct_ns: AtomicU64::new(0),
            peak_awake: AtomicUsize::new(0),
            wake_wanted: AtomicUsize::new(0),
            pool_wakeups: AtomicU64::new(0),
        }
    }

    /// Reclaim threads to create.
    pub(crate) fn pool_size(&self) -> usize {
        self.pool_size
    }

    /// Nanoseconds since the region started (the eviction clock's time base).
    pub(crate) fn clock_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// The eviction clock's reading at `now_ns`: [`EVICT_TICK_NS`] ticks plus one, wrapping,
    /// never 0 (which means "never evicted").
    fn tick(now_ns: u64) -> u32 {
        ((now_ns / EVICT_TICK_NS).wrapping_add(1) as u32).max(1)
    }

    /// Records that `page` was just evicted (for its turnaround when it comes back).
    pub(crate) fn stamp_eviction(&self, page: usize, now_ns: u64) {
        self.evicted_at[page].store(Self::tick(now_ns), Ordering::Relaxed);
    }

    /// The turnaround of `page`, evicted earlier and faulting now, if it was ever evicted.
    fn turnaround_ns(&self, page: usize, now_ns: u64) -> Option<u64> {
        let at = self.evicted_at[page].load(Ordering::Relaxed);
        if at == 0 {
            return None;
        }
        Some(u64::from(Self::tick(now_ns).wrapping_sub(at)) * EVICT_TICK_NS)
    }

    /// Whether a faulting thread must reclaim synchronously before charging a page, and how
    /// many pages, with `resident` pages resident.
    pub(crate) fn direct_need(&self, resident: usize) -> usize {
        let s = self.sched.lock().expect("reclaim scheduler lock");
        s.direct_reclaim_pages(resident as u64) as usize
    }

    /// A page was charged; `resident` includes it. `refault` is the page if it came back from
    /// the memnode (its turnaround is reported). When the scheduler asks for more threads than
    /// are awake, notes it for [`Reclaim::wake_deferred`]: the charging fault handler wakes them
    /// once its fault is served. Woken at once, a reclaim thread on the handler's CPU preempts
    /// it in the middle of the fault, and the faulting thread waits for a batch of evictions (or
    /// a scheduler tick), which cost redis at 50% local a long stall per such wake-up, thousands
    /// of them in a run (`docs/decisions/0005-deferred-reclaim-wakeups.md`,
    /// `bench/results/cpu-cuts-ab/README.md`).
    pub(crate) fn on_charge(&self, resident: usize, refault: Option<usize>) {
        let now = self.clock_ns();
        let turnaround = refault.and_then(|p| self.turnaround_ns(p, now));
        let decision = {
            let mut s = self.sched.lock().expect("reclaim scheduler lock");
            if let Some(t) = turnaround {
                s.on_refault(t);
            }
            let d = s.on_charge(resident as u64, now);
            if d.checked {
                d.threads
            } else {
                s.threads_for(resident as u64)
            }
        };
        if decision > self.awake.load(Ordering::Relaxed) {
            self.wake_wanted.fetch_max(decision, Ordering::Relaxed);
        }
    }

    /// Wakes the pool threads charges asked for since the last call (see
    /// [`Reclaim::on_charge`]); fault handlers call it after each fault they serve, and any
    /// other thread that charges (the hint thread) after its charges.
    pub(crate) fn wake_deferred(&self) {
        if self.wake_wanted.load(Ordering::Relaxed) == 0 {
            return;
        }
        let n = self.wake_wanted.swap(0, Ordering::Relaxed);
        if n > self.awake.load(Ordering::Relaxed) {
            RegionCounters::add(&self.pool_wakeups, 1);
            self.wake_threads(n);
        }
    }

    /// Wakes every reclaim thread; each re-reads the scheduler.
    pub(crate) fn wake_pool(&self) {
        self.wake_threads(self.pool_size);
    }

    /// Wakes reclaim threads `0..n`.
    fn wake_threads(&self, n: usize) {
        for (m, cv) in self.wake.iter().take(n) {
            *m.lock().expect("reclaim wake lock") = true;
            cv.notify_one();
        }
    }

    /// The budget is now `pages` (it grew or shrank at run time: `Engine::budget_changed`).
    pub(crate) fn set_budget(&self, pages: usize) {
        self.sched
            .lock()
            .expect("reclaim scheduler lock")
            .set_budget(pages as u64);
    }

    /// How many reclaim threads should run now.
    pub(crate) fn wanted(&self, budget: &Budget) -> usize {
        if budget.evict_paused.load(Ordering::SeqCst) {
            return 0;
        }
        let resident = budget.resident() as u64;
        self.sched
            .lock()
            .expect("reclaim scheduler lock")
            .threads_for(resident)
    }

    /// A pool thread starts: it counts as awake until [`Reclaim::pool_thread_stops`].
    /// The first pool thread has made what eviction needs (its evictor's descriptors).
    pub(crate) fn first_thread_ready(&self) {
        self.first_ready.store(true, Ordering::Release);
    }

    /// Whether [`Reclaim::first_thread_ready`] was called.
    pub(crate) fn is_first_thread_ready(&self) -> bool {
        self.first_ready.load(Ordering::Acquire)
    }

    pub(crate) fn pool_thread_starts(&self) {
        self.awake.fetch_add(1, Ordering::Relaxed);
    }

    /// A pool thread stops.
    pub(crate) fn pool_thread_stops(&self) {
        self.awake.fetch_sub(1, Ordering::Relaxed);
    }

    /// Pool thread `id`, not wanted now, sleeps until a charge asks for it, or for
    /// [`POOL_IDLE_RECHECK`] at most; it returns at once if it is wanted after all (a charge
    /// asked for it after the caller looked: the flag it set is seen under the lock, so the
    /// wake-up cannot be lost), or if `stopping` says so.
    pub(crate) fn sleep_while_unwanted(
        &self,
        id: usize,
        budget: &Budget,
        stopping: impl Fn() -> bool,
    ) {
        self.awake.fetch_sub(1, Ordering::Relaxed);
        {
            let (m, cv) = &self.wake[id];
            let mut woken = m.lock().expect("reclaim wake lock");
            if !*woken && id >= self.wanted(budget) && !stopping() {
                woken = cv
                    .wait_timeout(woken, POOL_IDLE_RECHECK)
                    .expect("reclaim wake lock")
                    .0;
            }
            *woken = false;
        }
        let now = self.awake.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak_awake.fetch_max(now, Ordering::Relaxed);
    }

    /// The program's allocator gave up `pages` pages when reclaim asked.
    pub(crate) fn record_released(&self, pages: usize) {
        RegionCounters::add(&self.released_by_allocator, pages as u64);
    }

    /// A pool thread spent `cpu_ns` of its CPU time in a batch (whatever came of it).
    pub(crate) fn record_pool_cpu(&self, cpu_ns: u64) {
        RegionCounters::add(&self.pool_cpu_ns, cpu_ns);
    }

    /// Pool thread `id` evicted `pages` pages in a batch of `busy_ns`: counted, and told to
    /// the scheduler (S_out).
    pub(crate) fn record_pool_batch(&self, id: usize, pages: usize, busy_ns: u64) {
        RegionCounters::add(&self.pool_busy_ns, busy_ns);
        RegionCounters::add(&self.pool_batches, 1);
        RegionCounters::add(&self.pool_pages, pages as u64);
        self.sched
            .lock()
            .expect("reclaim scheduler lock")
            .on_reclaimed(id, pages as u64, busy_ns);
    }

    /// A faulting thread reclaimed `pages` pages itself, taking `ns`: counted, and told to the
    /// scheduler when it evicted any.
    pub(crate) fn record_direct(&self, pages: usize, ns: u64) {
        RegionCounters::add(&self.direct_waits, 1);
        RegionCounters::add(&self.direct_pages, pages as u64);
        RegionCounters::add(&self.direct_ns, ns);
        if pages > 0 {
            self.sched
                .lock()
                .expect("reclaim scheduler lock")
                .record_direct_reclaim(pages as u64);
        }
    }

    /// A snapshot for the stats JSON.
    pub(crate) fn stats(&self, charges: u64) -> ReclaimStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let busy = get(&self.pool_busy_ns);
        let pages = get(&self.pool_pages);
        let direct_waits = get(&self.direct_waits);
        ReclaimStats {
            scheduler: self
                .sched
                .lock()
                .expect("reclaim scheduler lock")
                .snapshot(),
            pool_size: self.pool_size,
            threads_awake: self.awake.load(Ordering::Relaxed),
            peak_threads_awake: self.peak_awake.load(Ordering::Relaxed),
            pool_wakeups: get(&self.pool_wakeups),
            pool_batches: get(&self.pool_batches),
            pool_pages: pages,
            pool_cpu_ns: get(&self.pool_cpu_ns),
            pool_busy_ns: busy,
            pool_pages_per_s: if busy == 0 {
                0.0
            } else {
                pages as f64 * 1e9 / busy as f64
            },
            direct_waits,
            direct_pages: get(&self.direct_pages),
            released_by_allocator: get(&self.released_by_allocator),
            direct_ns: get(&self.direct_ns),
            direct_wait_ratio: if charges == 0 {
                0.0
            } else {
                direct_waits as f64 / charges as f64
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A charge that asks for a reclaim thread does not wake it: the fault handler making the
    /// charge is still serving its fault, and a thread woken on its CPU would run first. The
    /// handler wakes it (once) when the fault is served.
    #[test]
    fn a_charge_asks_for_reclaim_but_wakes_it_only_when_the_fault_is_served() {
        let r = Reclaim::new(4096, 1024, ReclaimMode::Static(1), 1);
        let woken = |r: &Reclaim| *r.wake[0].0.lock().unwrap();
        for resident in 1..=1024 {
            r.on_charge(resident, None);
        }
        assert!(r.wake_wanted.load(Ordering::Relaxed) >= 1, "asked for");
        assert!(!woken(&r), "not woken while the fault is served");
        r.wake_deferred();
        assert!(woken(&r), "woken once it is served");
        assert_eq!(r.pool_wakeups.load(Ordering::Relaxed), 1);
        r.wake_deferred();
        assert_eq!(
            r.pool_wakeups.load(Ordering::Relaxed),
            1,
            "woken once per ask"
        );
    }
}
