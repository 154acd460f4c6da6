//! How many pages the next eviction batch takes, and the next prefetch window at most.
//!
//! A fault on a page of a batch in flight waits until the batch's far copies are committed
//! (`faults.waited_on_eviction`), so a batch's whole time, from claiming its victims to the
//! store's acknowledgement, is the longest such a fault waits. Through shared memory a batch of
//! 128 pages is short, nearly all of it CPU work, but over a slow link the write-back dominates:
//! at 32 MB/s (`gleaner memnode --bandwidth 32M`) a batch of 128 of memcached's pages holds them
//! for many milliseconds, and memcached's open-loop p99 was several times longer with such
//! batches than with batches of 16 (`bench/results/evict-batch-link/README.md`).
//!
//! So, unless the size is set (`RegionConfig::evict_batch`), each batch is sized from the store's
//! time to take the pages recent batches wrote back (the commit: through a socket, the write and
//! the memnode's acknowledgement), per page, as a moving average over the batches that wrote any:
//! to spend about [`TARGET`] committing were all its pages to be written, between [`MIN_PAGES`] and
//! the size chosen from the budget, which is also where it starts. Only the commit is timed, not
//! the whole batch: the rest (taking the pages, encoding them) is CPU work that smaller batches
//! would not shorten in total, and timing it made batches shrink whenever the reclaim thread was
//! preempted (memcached pinned to one CPU with every pager thread: batches well below 128 pages on
//! average, each with its own TLB flush; `bench/results/evict-batch-link/README.md`). Through
//! shared memory a commit takes about a microsecond per page; at 32 MB/s, a hundred times that.
//! Batches that write nothing (clean pages, dropped) teach nothing; counting them would let a phase
//! of clean evictions grow the batches back just before the next writes. Smaller batches than
//! [`MIN_PAGES`] did worse on that link, each request's own cost adding up.
//!
//! The same pace caps prefetch windows ([`BatchSize::prefetch_window_cap`]): reads and write-backs
//! cross the same link, one direction each, and a window holds the link's read side, and the
//! handler that sent it, until its last page is through. Over a 32 MB/s link Leap's 32 pages took
//! milliseconds, in which every demand read behind them waited: memcached's open-loop p99 there was
//! several times longer with them than with windows of at most 8 pages or without prefetching
//! (`bench/results/prefetch-link/README.md`). So a window takes what the link moves in
//! [`PREFETCH_LINK_TIME`], 4 pages there; through shared memory or a fast network that is hundreds
//! of pages and nothing is cut. Before any write-back has been timed nothing is cut either.
//!
//! The average is kept in one relaxed atomic that every evicting thread updates: a lost update
//! only delays the adaptation by a batch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How long a prefetch window may hold the link to the store, at most.
pub(crate) const PREFETCH_LINK_TIME: Duration = Duration::from_micros(500);
/// How long a batch's commit (write-back and acknowledgement) should take.
pub(crate) const TARGET: Duration = Duration::from_millis(1);
/// The fewest pages an adapted batch takes (unless the largest size is smaller).
pub(crate) const MIN_PAGES: usize = 16;
/// Weight of a new batch's time per page in the moving average (1/4).
const NEW_SHARE: u64 = 4;

/// The eviction batch size of a region.
pub(crate) struct BatchSize {
    max: usize,
    adaptive: bool,
    /// Moving average of a batch's commit time per page written back, in nanoseconds (0: none
    /// yet).
    ns_per_page: AtomicU64,
}

impl BatchSize {
    /// Batches of at most `max` pages, sized from their time when `adaptive` (the size was not
    /// set), else always `max`.
    pub(crate) fn new(max: usize, adaptive: bool) -> BatchSize {
        BatchSize {
            max: max.max(1),
            adaptive,
            ns_per_page: AtomicU64::new(0),
        }
    }

    /// The largest batch (what buffers are sized for).
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// Pages the next batch takes.
    pub(crate) fn next(&self) -> usize {
        let per_page = self.ns_per_page.load(Ordering::Relaxed);
        if !self.adaptive || per_page == 0 {
            return self.max;
        }
        let fits = (TARGET.as_nanos() as u64 / per_page) as usize;
        fits.clamp(MIN_PAGES.min(self.max), self.max)
    }

    /// A batch that wrote back `written` pages took `took` to commit them.
    pub(crate) fn observed(&self, written: usize, took: Duration) {
        if written == 0 {
            return;
        }
        let sample = (took.as_nanos() as u64 / written as u64).max(1);
        let old = self.ns_per_page.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample
        } else {
            old - old / NEW_SHARE + sample / NEW_SHARE
        };
        self.ns_per_page.store(new.max(1), Ordering::Relaxed);
    }

    /// How many pages the link to the store moves in `d` at the recent batches' commit time per
    /// page (at least 1): `None` before any batch wrote.
    pub(crate) fn pages_within(&self, d: Duration) -> Option<usize> {
        match self.ns_per_page.load(Ordering::Relaxed) {
            0 => None,
            per_page => Some(((d.as_nanos() as u64 / per_page) as usize).max(1)),
        }
    }

    /// The most pages a prefetch window takes: what the link moves in [`PREFETCH_LINK_TIME`],
    /// at most a request's worth (see the module's doc).
    pub(crate) fn prefetch_window_cap(&self) -> usize {
        self.pages_within(PREFETCH_LINK_TIME)
            .map_or(gleaner_proto::MAX_BATCH_PAGES, |n| {
                n.min(gleaner_proto::MAX_BATCH_PAGES)
            })
    }

    /// The moving average of a batch's commit time per page written back, in microseconds (0
    /// before any batch wrote).
    pub(crate) fn us_per_page(&self) -> f64 {
        self.ns_per_page.load(Ordering::Relaxed) as f64 / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_start_at_the_largest_size_and_shrink_while_they_are_slow() {
        let b = BatchSize::new(128, true);
        assert_eq!(b.next(), 128, "no batch yet");
        assert_eq!(b.pages_within(Duration::from_micros(500)), None);
        assert_eq!(
            b.prefetch_window_cap(),
            gleaner_proto::MAX_BATCH_PAGES,
            "nothing cut before the link's pace is known"
        );
        // Shared memory: a few microseconds a page, 128 pages well within the target.
        for _ in 0..10 {
            b.observed(128, Duration::from_micros(128 * 6));
        }
        assert_eq!(b.next(), 128);
        assert_eq!(b.prefetch_window_cap(), 83, "500 µs at 6 µs a page");
        // A 32 MB/s link: ~110 µs a page. The average follows within a few batches, and the
        // size stops at the floor (1 ms / 110 µs is 9 pages).
        for _ in 0..20 {
            b.observed(b.next(), Duration::from_micros(b.next() as u64 * 110));
        }
        assert_eq!(b.next(), MIN_PAGES);
        assert!(
            (b.us_per_page() - 110.0).abs() < 10.0,
            "{}",
            b.us_per_page()
        );
        // What the link moves in half a millisecond at that pace: 4 pages, a prefetch window's
        // most.
        assert_eq!(b.pages_within(Duration::from_micros(500)), Some(4));
        assert_eq!(b.prefetch_window_cap(), 4);
        // 25 µs a page: 40 pages fit in the target.
        for _ in 0..40 {
            b.observed(b.next(), Duration::from_micros(b.next() as u64 * 25));
        }
        assert!((38..=42).contains(&b.next()), "{}", b.next());
        // The link gets fast again: back to the largest size.
        for _ in 0..40 {
            b.observed(b.next(), Duration::from_micros(b.next() as u64 * 2));
        }
        assert_eq!(b.next(), 128);
    }

    #[test]
    fn a_size_that_was_set_never_changes_and_small_ones_are_not_raised() {
        let b = BatchSize::new(64, false);
        b.observed(64, Duration::from_millis(50));
        assert_eq!(b.next(), 64);
        // An adaptive size whose largest is below the floor keeps its largest.
        let b = BatchSize::new(8, true);
        b.observed(8, Duration::from_millis(50));
        assert_eq!(b.next(), 8);
        // Batches that wrote nothing teach nothing.
        let b = BatchSize::new(128, true);
        b.observed(0, Duration::from_secs(1));
        assert_eq!((b.next(), b.us_per_page()), (128, 0.0));
    }
}
