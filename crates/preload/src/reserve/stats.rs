//! The reserve's counters, as the run's stats and `gleaner status` show them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use gleaner_policy::hermes::Interval;

/// Counters bumped by the allocation paths and the management thread.
#[derive(Default)]
pub(crate) struct Stats {
    /// Requests served from the reserve.
    pub(crate) hits: AtomicU64,
    /// Requests the reserve was meant to serve but had nothing ready for.
    pub(crate) misses: AtomicU64,
    /// Of the misses, large requests served with the chunk the thread was faulting in (they
    /// fault only the pages it had not reached).
    pub(crate) partial_hits: AtomicU64,
    /// Large requests served from the pool, and of them those given a fresh chunk (one the
    /// thread pre-faulted, never used by the program: cold in the caches) rather than one the
    /// program freed.
    pub(crate) large_hits: AtomicU64,
    pub(crate) fresh_hits: AtomicU64,
    /// `realloc`s of the reserve's blocks: answered in place (the block still fits), or moved
    /// (a new block, the old one copied and freed; the reserve has no `mremap`), of them those
    /// whose old or new size is large, and the bytes they copied.
    pub(crate) reallocs_kept: AtomicU64,
    pub(crate) reallocs_moved: AtomicU64,
    pub(crate) reallocs_moved_large: AtomicU64,
    pub(crate) realloc_copied_bytes: AtomicU64,
    /// Of the misses, small requests the heap had no block for (the rest are large requests
    /// the pool had no chunk for).
    pub(crate) small_misses: AtomicU64,
    /// Of the small misses, where the management thread was when each came ([`Phase`]): asleep
    /// (the miss woke it), woken but not running yet (waiting for a CPU), refilling the heap,
    /// refilling the pool, elsewhere in its loop (bookkeeping, releasing chunks, the pause
    /// after a refused refill), or not through its first refill yet.
    pub(crate) small_misses_at: [AtomicU64; 6],
    /// The thread's wall time in its heap's and its pool's refills (us), and its longest pool
    /// refill: how long the heap waited for the thread while the pool was refilled.
    /// The CPU time the program's start spent stocking the heap (`thread::stock`), ns.
    pub(crate) stock_cpu_ns: AtomicU64,
    pub(crate) heap_refill_us: AtomicU64,
    pub(crate) pool_refill_us: AtomicU64,
    pub(crate) pool_refill_max_us: AtomicU64,
    /// Requests sent to the default allocator (the misses, and what the reserve does not serve:
    /// over-aligned blocks, requests past its bound, a fork child's).
    pub(crate) fallbacks: AtomicU64,
    /// Of the misses, requests that found the heap's, the pool's or the window's lock held
    /// past a brief spin and went to the default allocator rather than wait (`deferred.rs`).
    pub(crate) busy: AtomicU64,
    /// Pre-faulting calls the kernel refused, and the last one's `errno` (`ENOMEM`: the memory
    /// cgroup's reclaim did not make room in time); the thread then stops refilling for a period.
    pub(crate) populate_failures: AtomicU64,
    pub(crate) populate_last_errno: AtomicU64,
    /// Bytes the thread pre-faulted.
    pub(crate) populated_bytes: AtomicU64,
    /// Bytes the thread gave back (pool chunks freed beyond the bound, released by the thread).
    pub(crate) released_bytes: AtomicU64,
    /// The thread's wake-ups (all, and those a request made by finding the reserve low) and the
    /// CPU time it spent (all of it, sleeping and waking included), in nanoseconds.
    pub(crate) wakeups: AtomicU64,
    pub(crate) need_wakeups: AtomicU64,
    pub(crate) thread_cpu_ns: AtomicU64,
    /// Of it, the time spent pre-faulting (the work moved off the program's requests).
    pub(crate) populate_cpu_ns: AtomicU64,
    /// The pool's current target (bytes), the thread's reaction time it is sized for, and the
    /// longest scheduling delay seen between a request's wake-up and the thread running (us).
    pub(crate) pool_target: AtomicUsize,
    pub(crate) reaction_us: AtomicU64,
    pub(crate) wake_delay_max_us: AtomicU64,
    /// Bytes `mlock`ed now.
    pub(crate) locked_bytes: AtomicUsize,
    /// Small and large requests since the thread last looked (the interval's demand).
    pub(crate) small_bytes: AtomicUsize,
    pub(crate) small_count: AtomicUsize,
    pub(crate) large_bytes: AtomicUsize,
    pub(crate) large_count: AtomicUsize,
}

/// Where the management thread is in its loop (what a small miss is counted against).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub(crate) enum Phase {
    /// Asleep on its futex word (a request's wake-up makes it runnable).
    Asleep = 0,
    /// Woken (by a request or its timeout) and not running yet: waiting for a CPU.
    Woken = 1,
    /// Refilling the heap.
    Heap = 2,
    /// Refilling the pool.
    Pool = 3,
    /// Elsewhere in its loop.
    Other = 4,
    /// Not in its loop yet: started, not yet through its first refill.
    Starting = 5,
}

/// The names of [`Phase`]s, in order, for the stats.
pub(crate) const PHASES: [&str; 6] = [
    "asleep",
    "woken",
    "heap_refill",
    "pool_refill",
    "other",
    "starting",
];

impl Stats {
    /// Notes a request of `size` bytes for the interval's demand.
    pub(crate) fn demand(&self, size: usize, large: bool) {
        let (bytes, count) = if large {
            (&self.large_bytes, &self.large_count)
        } else {
            (&self.small_bytes, &self.small_count)
        };
        bytes.fetch_add(size, Ordering::Relaxed);
        count.fetch_add(1, Ordering::Relaxed);
    }

    /// The last interval's small and large demand, and a new interval begins.
    pub(crate) fn take_interval(&self) -> (Interval, Interval) {
        let swap = |a: &AtomicUsize| a.swap(0, Ordering::Relaxed);
        (
            Interval {
                bytes: swap(&self.small_bytes),
                count: swap(&self.small_count),
            },
            Interval {
                bytes: swap(&self.large_bytes),
                count: swap(&self.large_count),
            },
        )
    }
}
