//! A pool's hit count, kept per thread so that a hit costs no shared atomic read-modify-write.
//!
//! A hit is the common case of every soft read, and a `lock xadd` on one word that every
//! reader shares cost about 5 ns of a 32-byte read here (and bounces its cache line between
//! cores). Instead each thread that reads takes one of [`SHARDS`] padded counters for its whole
//! life (a lease, returned when it exits) and adds to it with a plain load and store: no other
//! thread writes that counter, so nothing is lost. Threads beyond `SHARDS` at once share one
//! more counter with `fetch_add`. The total ([`HitCounts::total`]) sums the counters; each only
//! grows, so totals read one after another never go down. The evacuator publishes the total in
//! the control area for the daemon (`pool.rs`), at most one tick late.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Counters a thread can own; one more is shared by any further threads.
pub(crate) const SHARDS: usize = 64;
/// The shared counter's index (also what a thread uses while it has no lease).
const SHARED: u32 = SHARDS as u32;
/// A thread that has not asked for a lease yet.
const UNSET: u32 = u32::MAX;

/// One counter on its own cache lines (128 bytes: adjacent-line prefetch pairs lines).
#[repr(align(128))]
#[derive(Default)]
struct Shard(AtomicU64);

/// A pool's hits, one counter per reading thread.
pub(crate) struct HitCounts {
    /// A fixed length, so that indexing by a leased index needs no bounds check.
    shards: Box<[Shard; SHARDS + 1]>,
}

impl Default for HitCounts {
    fn default() -> Self {
        HitCounts {
            shards: Box::new(std::array::from_fn(|_| Shard::default())),
        }
    }
}

impl HitCounts {
    /// Counts one hit by the calling thread.
    #[inline]
    pub(crate) fn add_one(&self) {
        let i = LEASED.with(Cell::get);
        if (i as usize) < SHARDS {
            // Only this thread writes shard `i` while it holds the lease (the lease's mutex
            // orders a previous holder's last store before this load), so a load and a store
            // lose nothing and need no locked instruction.
            let c = &self.shards[i as usize].0;
            c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        } else {
            self.add_one_unleased(i);
        }
    }

    #[cold]
    #[inline(never)]
    fn add_one_unleased(&self, i: u32) {
        let i = if i == UNSET { lease() } else { i };
        if (i as usize) < SHARDS {
            let c = &self.shards[i as usize].0;
            c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        } else {
            self.shards[SHARDS].0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every hit counted so far (those of threads running now, to within their last few).
    pub(crate) fn total(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.0.load(Ordering::Relaxed))
            .sum()
    }
}

thread_local! {
    /// The counter this thread owns in every pool ([`UNSET`] before its first hit, [`SHARED`]
    /// when none was free or after its lease went back).
    static LEASED: Cell<u32> = const { Cell::new(UNSET) };
    /// Gives the lease back when the thread exits.
    static LEASE: Lease = const { Lease(Cell::new(SHARED)) };
}

/// Counters no running thread owns (indexes below [`SHARDS`]), and how many were ever handed.
static FREE: Mutex<(u32, Vec<u32>)> = Mutex::new((0, Vec::new()));

/// A thread's lease on one counter index.
struct Lease(Cell<u32>);

impl Drop for Lease {
    fn drop(&mut self) {
        let i = self.0.get();
        if (i as usize) < SHARDS {
            // Later hits by this thread (in other thread-locals' destructors) go to the shared
            // counter; the mutex orders this thread's stores before the next holder's loads.
            let _ = LEASED.try_with(|l| l.set(SHARED));
            let mut f = FREE.lock().unwrap_or_else(|e| e.into_inner());
            f.1.push(i);
        }
    }
}

/// Takes a counter index for the calling thread ([`SHARED`] if none is free, or if the thread
/// is exiting and cannot hold a lease).
fn lease() -> u32 {
    let i = {
        let mut f = FREE.lock().unwrap_or_else(|e| e.into_inner());
        match f.1.pop() {
            Some(i) => i,
            None if (f.0 as usize) < SHARDS => {
                f.0 += 1;
                f.0 - 1
            }
            None => SHARED,
        }
    };
    let held = LEASE.try_with(|l| l.0.set(i)).is_ok();
    let i = if held {
        i
    } else {
        if (i as usize) < SHARDS {
            FREE.lock().unwrap_or_else(|e| e.into_inner()).1.push(i);
        }
        SHARED
    };
    let _ = LEASED.try_with(|l| l.set(i));
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn every_hit_of_many_threads_is_counted() {
        // More threads at once than counters (some share the last one), and more over time
        // than counters (leases are reused after their threads exit).
        let c = Arc::new(HitCounts::default());
        for _round in 0..3 {
            let barrier = Arc::new(std::sync::Barrier::new(SHARDS + 16));
            let threads: Vec<_> = (0..SHARDS + 16)
                .map(|t| {
                    let (c, barrier) = (c.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait(); // all alive at once
                        for _ in 0..(1000 + t) {
                            c.add_one();
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
        }
        let per_round: u64 = (0..SHARDS as u64 + 16).map(|t| 1000 + t).sum();
        assert_eq!(c.total(), 3 * per_round);
        let handed = FREE.lock().unwrap().0;
        assert!(handed as usize <= SHARDS, "never more leases than counters");
    }
}
