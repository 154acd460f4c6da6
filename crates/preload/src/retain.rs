//! Freed big blocks kept for reuse: the page ranges of heap blocks the program freed, held
//! (still mapped, possibly resident) so that the next big allocation of a similar size takes
//! them without a fault, instead of discarding them at `free` and zero-filling fresh pages
//! through userfaultfd at the next first touch.
//!
//! Programs that allocate and free large arrays over and over (numpy temporaries) paid a
//! discard per `free` and a zero-fill fault per few pages for every new array, even with all
//! their memory local: pagerank ran at half its all-local speed at a budget above its footprint.
//! The C library keeps such blocks too (glibc raises its mmap threshold after the first free of
//! an mmapped block and then reuses heap memory; jemalloc keeps dirty pages for 10 s).
//!
//! What is kept is bounded two ways, both checked whenever a range is kept or taken: at most
//! `cap` pages (the oldest ranges go first beyond it) and for at most `max_age` (a program that
//! stops allocating big blocks gets its budget back on its next big `free` or allocation). The
//! ranges that go are handed back to the caller to discard. This module only does the
//! bookkeeping (pure, unit-tested); `arena.rs` discards and reuses the pages.
//!
//! Reclaim asks first ([`Retained::give_up`]): kept blocks hold budget that live pages could
//! use, so when reclaim needs room, blocks idle longer than nearly every reuse waited go before
//! anything is evicted. How long reuses wait is learnt ([`ReuseWaits`]): numpy's temporaries
//! come back within a fraction of a second, a growing buffer's old blocks never. A block reclaim
//! gave up that a later allocation would have fitted counts as a reuse that waited that long
//! (a *ghost*, as in ARC), so that a threshold too short for the program corrects itself.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Reclaim gives up blocks idle this long (ms) while no reuse has been seen.
const MIN_IDLE_MS: u64 = 10;
/// The share of reuse waits a block must have outwaited to be given up to reclaim.
const QUANTILE: f64 = 0.9;
/// Blocks given up to reclaim remembered as ghosts.
const GHOSTS: usize = 32;

/// How long kept blocks waited for their reuse, in doubling buckets of milliseconds (bucket
/// `i` holds waits below `2^i` ms and at least half that), halved every [`ReuseWaits::DECAY`]
/// samples so that it follows the program's phases.
struct ReuseWaits {
    buckets: [u32; 16],
    samples: u32,
}

impl ReuseWaits {
    const DECAY: u32 = 256;
    /// None recorded yet.
    const EMPTY: ReuseWaits = ReuseWaits {
        buckets: [0; 16],
        samples: 0,
    };

    fn record(&mut self, wait_ms: u64) {
        let i = ((64 - wait_ms.leading_zeros()) as usize).min(self.buckets.len() - 1);
        self.buckets[i] += 1;
        self.samples += 1;
        if self.samples >= Self::DECAY {
            self.samples = 0;
            for b in &mut self.buckets {
                *b /= 2;
            }
        }
    }

    /// The wait (the upper end of its bucket, ms) that [`QUANTILE`] of the recorded waits did
    /// not exceed; None before any.
    fn quantile_ms(&self) -> Option<u64> {
        let total: u32 = self.buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let want = (total as f64 * QUANTILE).ceil() as u32;
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= want {
                return Some(1 << i);
            }
        }
        Some(1 << (self.buckets.len() - 1))
    }
}

/// Page ranges of freed big blocks, by size (best fit) and by age (oldest dropped first).
pub(crate) struct Retained {
    /// `(pages, first)`: the ranges by size, for the smallest that fits.
    by_size: BTreeSet<(usize, usize)>,
    /// `(kept_at, first) -> pages`: the ranges by the time they were kept (`kept_at` in the
    /// caller's clock, milliseconds), oldest first.
    by_age: BTreeMap<(u64, usize), usize>,
    /// `first -> kept_at`, to find a range's age entry from its size entry.
    kept_at: BTreeMap<usize, u64>,
    /// Pages in all ranges.
    pages: usize,
    /// The most pages kept.
    cap: usize,
    /// The longest a range is kept, in the caller's clock (milliseconds).
    max_age: u64,
    /// How long reused ranges had waited.
    waits: ReuseWaits,
    /// `(pages, kept_at)` of the latest ranges given up to reclaim, newest last.
    ghosts: VecDeque<(usize, u64)>,
}

impl Retained {
    /// Nothing kept yet; at most `cap` pages, each range for at most `max_age` ms. A cap of 0
    /// keeps nothing.
    pub(crate) const fn new(cap: usize, max_age: u64) -> Self {
        Retained {
            by_size: BTreeSet::new(),
            by_age: BTreeMap::new(),
            kept_at: BTreeMap::new(),
            pages: 0,
            cap,
            max_age,
            waits: ReuseWaits::EMPTY,
            ghosts: VecDeque::new(),
        }
    }

    /// Pages kept now.
    #[cfg(test)]
    pub(crate) fn pages(&self) -> usize {
        self.pages
    }

    /// Keeps `[first, first+pages)` at time `now`. Returns the ranges no longer kept (the
    /// oldest beyond the cap, and any older than the age bound), which may include this one
    /// (larger than the cap on its own).
    pub(crate) fn keep(&mut self, first: usize, pages: usize, now: u64) -> Vec<(usize, usize)> {
        let mut gone = self.expire(now);
        if pages > self.cap {
            gone.push((first, pages));
            return gone;
        }
        self.insert(first, pages, now);
        while self.pages > self.cap {
            let (&(at, f), &n) = self.by_age.iter().next().expect("pages > 0 means a range");
            self.remove(f, n, at);
            gone.push((f, n));
        }
        gone
    }

    /// Takes `pages` pages at time `now`: the front of the smallest kept range that holds them
    /// (the rest of it stays kept, with its age), or None. Also returns the ranges no longer
    /// kept because of their age.
    pub(crate) fn take(&mut self, pages: usize, now: u64) -> (Option<usize>, Vec<(usize, usize)>) {
        let gone = self.expire(now);
        let Some(&(n, first)) = self.by_size.range((pages, 0)..).next() else {
            // A block given up to reclaim would have served this one: it gave up too early.
            if let Some(i) = self.ghosts.iter().position(|&(n, _)| n >= pages) {
                let (_, at) = self.ghosts.remove(i).expect("an index found just now");
                self.waits.record(now.saturating_sub(at));
            }
            return (None, gone);
        };
        let at = self.kept_at[&first];
        self.waits.record(now.saturating_sub(at));
        self.remove(first, n, at);
        if n > pages {
            self.insert(first + pages, n - pages, at);
        }
        (Some(first), gone)
    }

    /// Gives up the oldest ranges idle at least [`Retained::idle_limit`] at `now`, until at
    /// least `pages` pages or no such range is left (reclaim asks: the budget is short).
    pub(crate) fn give_up(&mut self, pages: usize, now: u64) -> Vec<(usize, usize)> {
        let min_age = self.idle_limit();
        let mut gone = Vec::new();
        let mut freed = 0;
        while freed < pages {
            let Some((&(at, f), &n)) = self.by_age.iter().next() else {
                break;
            };
            if now.saturating_sub(at) < min_age {
                break;
            }
            self.remove(f, n, at);
            gone.push((f, n));
            freed += n;
            if self.ghosts.len() == GHOSTS {
                self.ghosts.pop_front();
            }
            self.ghosts.push_back((n, at));
        }
        gone
    }

    /// How long a range must have been idle for reclaim to take it: a little longer than
    /// [`QUANTILE`] of reuses waited (ghosts included), at least [`MIN_IDLE_MS`].
    pub(crate) fn idle_limit(&self) -> u64 {
        self.waits
            .quantile_ms()
            .map_or(MIN_IDLE_MS, |q| q.clamp(MIN_IDLE_MS, self.max_age))
    }

    /// Drops every range kept before `now - max_age`.
    fn expire(&mut self, now: u64) -> Vec<(usize, usize)> {
        let mut gone = Vec::new();
        while let Some((&(at, f), &n)) = self.by_age.iter().next() {
            if now.saturating_sub(at) <= self.max_age {
                break;
            }
            self.remove(f, n, at);
            gone.push((f, n));
        }
        gone
    }

    fn insert(&mut self, first: usize, pages: usize, at: u64) {
        self.by_size.insert((pages, first));
        self.by_age.insert((at, first), pages);
        self.kept_at.insert(first, at);
        self.pages += pages;
    }

    fn remove(&mut self, first: usize, pages: usize, at: u64) {
        self.by_size.remove(&(pages, first));
        self.by_age.remove(&(at, first));
        self.kept_at.remove(&first);
        self.pages -= pages;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_range_is_taken_by_the_next_allocation_that_fits() {
        let mut r = Retained::new(1000, 1000);
        assert!(r.keep(100, 64, 0).is_empty());
        assert!(r.keep(500, 256, 0).is_empty());
        // The smallest range that holds 60 pages: the 64 at 100.
        assert_eq!(r.take(60, 1), (Some(100), vec![]));
        // Its last 4 pages stay kept; 200 pages come from the front of the 256.
        assert_eq!(r.pages(), 4 + 256);
        assert_eq!(r.take(200, 1), (Some(500), vec![]));
        assert_eq!(r.take(4, 1), (Some(160), vec![]));
        assert_eq!(r.take(57, 1), (None, vec![]));
        assert_eq!(r.take(56, 1), (Some(700), vec![]));
        assert_eq!(r.pages(), 0);
    }

    #[test]
    fn the_oldest_ranges_go_beyond_the_cap() {
        let mut r = Retained::new(100, 1000);
        assert!(r.keep(0, 40, 1).is_empty());
        assert!(r.keep(1000, 40, 2).is_empty());
        assert_eq!(r.keep(2000, 40, 3), vec![(0, 40)]);
        assert_eq!(r.pages(), 80);
        // One range larger than the cap is not kept at all.
        assert_eq!(r.keep(3000, 101, 4), vec![(3000, 101)]);
        assert_eq!(r.pages(), 80);
    }

    #[test]
    fn ranges_older_than_the_age_bound_go_at_the_next_keep_or_take() {
        let mut r = Retained::new(1000, 10);
        assert!(r.keep(0, 8, 0).is_empty());
        assert!(r.keep(100, 8, 5).is_empty());
        // At 11 the first is 11 ms old: gone; the second stays and is taken.
        assert_eq!(r.take(8, 11), (Some(100), vec![(0, 8)]));
        assert!(r.keep(200, 8, 20).is_empty());
        assert_eq!(r.keep(300, 8, 31), vec![(200, 8)]);
        assert_eq!(r.pages(), 8);
    }

    #[test]
    fn a_split_range_keeps_its_age() {
        let mut r = Retained::new(1000, 10);
        assert!(r.keep(0, 100, 0).is_empty());
        assert_eq!(r.take(10, 9), (Some(0), vec![]));
        // The remaining 90 pages were kept at 0: gone at 11.
        assert_eq!(r.take(10, 11), (None, vec![(10, 90)]));
    }

    #[test]
    fn reclaim_takes_the_oldest_ranges_idle_long_enough() {
        let mut r = Retained::new(1000, 1000);
        // No reuse seen yet: ranges idle 10 ms or more go.
        assert_eq!(r.idle_limit(), MIN_IDLE_MS);
        assert!(r.keep(0, 10, 0).is_empty());
        assert!(r.keep(100, 10, 5).is_empty());
        assert!(r.keep(200, 10, 50).is_empty());
        // 15 pages asked at 56: the two oldest (idle 56 and 51 ms).
        assert_eq!(r.give_up(15, 56), vec![(0, 10), (100, 10)]);
        // The third is only 6 ms idle.
        assert!(r.give_up(15, 56).is_empty());
        assert_eq!(r.give_up(1, 60), vec![(200, 10)]);
        assert_eq!(r.pages(), 0);
    }

    #[test]
    fn reclaim_waits_as_long_as_reuses_did() {
        let mut r = Retained::new(1000, 1000);
        // Ten reuses, each 150 ms after the free: the limit becomes 256 ms (150's bucket).
        for i in 0..10 {
            let t = i * 1000;
            assert!(r.keep(0, 10, t).is_empty());
            assert_eq!(r.take(10, t + 150), (Some(0), vec![]));
        }
        assert_eq!(r.idle_limit(), 256);
        assert!(r.keep(0, 10, 20_000).is_empty());
        assert!(r.give_up(10, 20_100).is_empty());
        assert_eq!(r.give_up(10, 20_300), vec![(0, 10)]);
    }

    #[test]
    fn a_block_given_up_too_early_that_an_allocation_would_have_fitted_raises_the_limit() {
        let mut r = Retained::new(1000, 1000);
        assert!(r.keep(0, 10, 0).is_empty());
        // Reclaim takes it at 20 ms, 10 ms being the limit with nothing learnt.
        assert_eq!(r.give_up(10, 20), vec![(0, 10)]);
        // An allocation at 300 ms that it would have served: nothing kept, but a wait of 300
        // ms is learnt from the ghost (once: the ghost is used up).
        assert_eq!(r.take(8, 300), (None, vec![]));
        assert_eq!(r.idle_limit(), 512);
        assert_eq!(r.take(8, 400), (None, vec![]));
        assert_eq!(r.waits.buckets.iter().sum::<u32>(), 1);
        // A larger allocation than any ghost learns nothing.
        assert!(r.keep(0, 10, 1000).is_empty());
        assert_eq!(r.give_up(10, 2000), vec![(0, 10)]);
        assert_eq!(r.take(11, 2100), (None, vec![]));
        assert_eq!(r.waits.buckets.iter().sum::<u32>(), 1);
    }

    #[test]
    fn reuse_waits_follow_the_program_as_old_ones_decay() {
        let mut w = ReuseWaits::EMPTY;
        for _ in 0..100 {
            w.record(300);
        }
        assert_eq!(w.quantile_ms(), Some(512));
        // Many quick reuses later, the old long ones have been halved away below the 10%.
        for _ in 0..2000 {
            w.record(0);
        }
        assert_eq!(w.quantile_ms(), Some(1));
    }

    #[test]
    fn a_cap_of_zero_keeps_nothing() {
        let mut r = Retained::new(0, 1000);
        assert_eq!(r.keep(0, 1, 0), vec![(0, 1)]);
        assert_eq!(r.take(1, 0), (None, vec![]));
    }
}
