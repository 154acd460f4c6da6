//! Least recently *seen* used: LRU over the accesses the engine can see.
//!
//! A page's recency is the last moment it was seen used: installed for a demand fault, its
//! first use after a prefetch, a re-fault, or the engine's access scan reporting it written
//! since the previous scan ([`Touch::Scanned`]). The victim is the page seen longest ago; a
//! prefetched page not used yet counts as seen before every other page, so it goes first.
//!
//! With the access scan's bits this is LRU at the granularity of the scan's period, for the
//! pages the program writes (reads of resident pages stay invisible, as in every order built
//! for [`Visibility::Fault`]). CLOCK has the same bits but one level of recency (used since the
//! hand last passed, or not): where the program writes most of its resident pages within one
//! turn of the hand (memcached writes an item's header on every GET), nearly every page looks
//! used and CLOCK falls back to arrival order; the last-seen order still tells them apart.
//!
//! # Data structure
//!
//! A queue of (page, stamp) in stamp order, and each page's latest stamp. A touch gives the page
//! a new stamp and appends it; the entry it had becomes stale and is skipped when it reaches
//! the front. The queue is compacted when stale entries outnumber live ones three to one, so
//! it stays within four entries per resident page. Every call is amortised O(1).

use std::collections::VecDeque;

use super::{EvictPolicy, Insert, PageMap, Touch, Visibility};

/// The stamp of a prefetched page not used yet: older than every real one.
const UNUSED: u64 = 0;

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct Recency {
    visibility: Visibility,
    /// (page, stamp) in non-decreasing stamp order; stale when the stamp is not the page's.
    queue: VecDeque<(u64, u64)>,
    /// Each resident page's latest stamp.
    stamps: PageMap<u64>,
    /// The next stamp (strictly increasing, starting above [`UNUSED`]).
    next: u64,
}

impl Recency {
    /// An empty policy for the given visibility (the one the engine offers is
    /// [`Visibility::Fault`]; under oracle visibility every hit counts as seen).
    pub fn new(visibility: Visibility) -> Self {
        Recency {
            visibility,
            queue: VecDeque::new(),
            stamps: PageMap::default(),
            next: UNUSED + 1,
        }
    }

    fn stamp(&mut self, page: u64) {
        let s = self.next;
        self.next += 1;
        self.stamps.insert(page, s);
        self.queue.push_back((page, s));
        self.compact_if_stale();
    }

    /// Drops stale entries once they outnumber live ones three to one.
    fn compact_if_stale(&mut self) {
        if self.queue.len() > 64 && self.queue.len() > 4 * self.stamps.len() {
            let stamps = &self.stamps;
            self.queue.retain(|(p, s)| stamps.get(p) == Some(s));
        }
    }
}

impl EvictPolicy for Recency {
    fn name(&self) -> String {
        "recency".into()
    }

    fn visibility(&self) -> Visibility {
        self.visibility
    }

    fn insert(&mut self, page: u64, how: Insert, _at: usize) {
        match how {
            Insert::Demand => self.stamp(page),
            Insert::Prefetch => {
                self.stamps.insert(page, UNUSED);
                self.queue.push_front((page, UNUSED));
            }
        }
    }

    fn touch(&mut self, page: u64, how: Touch, _at: usize) {
        if !self.stamps.contains_key(&page) {
            return;
        }
        if how == Touch::Hit && self.visibility != Visibility::Oracle {
            return;
        }
        self.stamp(page);
    }

    fn victim(&mut self, _at: usize) -> Option<u64> {
        while let Some((page, s)) = self.queue.pop_front() {
            if self.stamps.get(&page) == Some(&s) {
                self.stamps.remove(&page);
                return Some(page);
            }
        }
        None
    }

    fn remove(&mut self, page: u64) {
        self.stamps.remove(&page);
        self.compact_if_stale();
    }

    fn len(&self) -> usize {
        self.stamps.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_seen_longest_ago_leaves_first_and_unused_prefetches_before_it() {
        let mut r = Recency::new(Visibility::Fault);
        for (i, p) in [1u64, 2, 3, 4].into_iter().enumerate() {
            r.insert(p, Insert::Demand, i);
        }
        r.touch(1, Touch::Scanned, 4);
        r.touch(3, Touch::Scanned, 4);
        // A hit is invisible under fault visibility.
        r.touch(2, Touch::Hit, 5);
        r.insert(9, Insert::Prefetch, 6);
        assert_eq!(r.victim(7), Some(9), "an unused prefetched page goes first");
        assert_eq!(r.victim(7), Some(2));
        assert_eq!(r.victim(7), Some(4));
        r.touch(1, Touch::Refault, 8);
        assert_eq!(r.victim(9), Some(3));
        assert_eq!(r.victim(9), Some(1));
        assert_eq!(r.victim(9), None);
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn stale_entries_are_compacted_and_removed_pages_never_return() {
        let mut r = Recency::new(Visibility::Fault);
        for p in 0..100u64 {
            r.insert(p, Insert::Demand, 0);
        }
        for round in 0..50 {
            for p in 0..100u64 {
                r.touch(p, Touch::Scanned, round);
            }
        }
        assert!(r.queue.len() <= 4 * 100 + 1, "{}", r.queue.len());
        r.remove(0);
        let mut out = Vec::new();
        while let Some(p) = r.victim(0) {
            out.push(p);
        }
        assert_eq!(out, (1..100).collect::<Vec<_>>());
    }
}
