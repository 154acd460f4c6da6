//! Least recently *seen* used, with a probation for pages seen once: LRU over the accesses the
//! engine can see.
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
//! # Probation: look twice
//!
//! The access that faulted a page in is usually also a write the next scan reports (memcached
//! reads an item's key, then counts a reference to it), so one report says nothing about reuse.
//! As Linux does for its inactive list ("all mapped folios start out with page table references
//! from the instantiating fault, so we need to look twice"), a page that came in on demand
//! can wait in a FIFO *probation* until a scan reports it a second time; only then does it join
//! the LRU order. While the probation holds more than its share of the resident pages
//! (`recency:N%`), victims come from its head: a page used once, at its fault, leaves after a
//! short stay instead of pushing a page in use out of the LRU order. The default share,
//! [`DEFAULT_PROBATION_PCT`], is 0: plain LRU over what is seen (`recency` = `recency:0%`).
//!
//! # Data structure
//!
//! Two queues of (page, stamp) in stamp order (probation, and the LRU order), and each page's
//! latest stamp and place. A touch gives the page a new stamp and appends it; the entry it had
//! becomes stale and is skipped when it reaches the front. A queue is compacted when stale
//! entries outnumber live ones three to one, so it stays within four entries per resident
//! page. Every call is amortised O(1).

use std::collections::VecDeque;

use super::{EvictPolicy, Insert, PageMap, Touch, Visibility};

/// The stamp of a prefetched page not used yet: older than every real one.
const UNUSED: u64 = 0;

/// The share of the resident pages the probation may hold before victims come from it, by
/// default: none (plain LRU over what is seen). In memcached at 50% local (one run, on a VM
/// busy with other jobs) neither `recency:25%` nor `recency:40%` took clearly fewer far faults
/// per request than plain LRU, whose count the quieter same-run comparison confirmed
/// (`bench/results/access-scan/README.md`). The probation has not been shown to help, so it is
/// a knob.
pub const DEFAULT_PROBATION_PCT: u8 = 0;

/// Where a page is, and its latest stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Meta {
    stamp: u64,
    /// In probation, with the scan reports seen since it arrived (0 or 1); `None`: in the LRU
    /// order.
    probation: Option<u8>,
}

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct Recency {
    visibility: Visibility,
    probation_pct: u8,
    /// Pages seen once since they came in on demand, (page, stamp) in arrival order.
    probation: VecDeque<(u64, u64)>,
    /// The LRU order, (page, stamp) in non-decreasing stamp order.
    lru: VecDeque<(u64, u64)>,
    /// Each resident page's place and latest stamp (an entry whose stamp differs is stale).
    meta: PageMap<Meta>,
    /// Live pages in probation.
    in_probation: usize,
    /// The next stamp (strictly increasing, starting above [`UNUSED`]).
    next: u64,
}

impl Recency {
    /// An empty policy for the given visibility (the one the engine offers is
    /// [`Visibility::Fault`]; under oracle visibility every hit counts as seen) whose
    /// probation holds up to `probation_pct`% of the resident pages (0: plain LRU).
    pub fn new(visibility: Visibility, probation_pct: u8) -> Self {
        Recency {
            visibility,
            probation_pct: probation_pct.min(100),
            probation: VecDeque::new(),
            lru: VecDeque::new(),
            meta: PageMap::default(),
            in_probation: 0,
            next: UNUSED + 1,
        }
    }

    fn fresh(&mut self) -> u64 {
        let s = self.next;
        self.next += 1;
        s
    }

    /// Puts `page` at the young end of the LRU order.
    fn promote(&mut self, page: u64) {
        let stamp = self.fresh();
        if let Some(m) = self.meta.get(&page) {
            if m.probation.is_some() {
                self.in_probation -= 1;
            }
        }
        self.meta.insert(
            page,
            Meta {
                stamp,
                probation: None,
            },
        );
        self.lru.push_back((page, stamp));
        self.compact_if_stale();
    }

    /// Drops stale entries once they outnumber live ones three to one.
    fn compact_if_stale(&mut self) {
        let live_lru = self.meta.len() - self.in_probation;
        let meta = &self.meta;
        if self.lru.len() > 64 && self.lru.len() > 4 * live_lru {
            self.lru.retain(|(p, s)| {
                meta.get(p)
                    .is_some_and(|m| m.stamp == *s && m.probation.is_none())
            });
        }
        if self.probation.len() > 64 && self.probation.len() > 4 * self.in_probation {
            self.probation.retain(|(p, s)| {
                meta.get(p)
                    .is_some_and(|m| m.stamp == *s && m.probation.is_some())
            });
        }
    }

    /// Pops the oldest live entry of the probation (`true`) or of the LRU order.
    fn pop(&mut self, from_probation: bool) -> Option<u64> {
        loop {
            let (page, s) = if from_probation {
                self.probation.pop_front()?
            } else {
                self.lru.pop_front()?
            };
            let live = self
                .meta
                .get(&page)
                .is_some_and(|m| m.stamp == s && m.probation.is_some() == from_probation);
            if live {
                self.meta.remove(&page);
                if from_probation {
                    self.in_probation -= 1;
                }
                return Some(page);
            }
        }
    }
}

impl EvictPolicy for Recency {
    fn name(&self) -> String {
        if self.probation_pct == DEFAULT_PROBATION_PCT {
            "recency".into()
        } else {
            format!("recency:{}%", self.probation_pct)
        }
    }

    fn visibility(&self) -> Visibility {
        self.visibility
    }

    fn insert(&mut self, page: u64, how: Insert, _at: usize) {
        // Inserted again while resident (the engine never does; a stale entry would be
        // skipped): count it once.
        if let Some(m) = self.meta.remove(&page) {
            if m.probation.is_some() {
                self.in_probation -= 1;
            }
        }
        match how {
            Insert::Demand if self.probation_pct > 0 => {
                let stamp = self.fresh();
                self.meta.insert(
                    page,
                    Meta {
                        stamp,
                        probation: Some(0),
                    },
                );
                self.in_probation += 1;
                self.probation.push_back((page, stamp));
                self.compact_if_stale();
            }
            Insert::Demand => self.promote(page),
            Insert::Prefetch => {
                self.meta.insert(
                    page,
                    Meta {
                        stamp: UNUSED,
                        probation: None,
                    },
                );
                self.lru.push_front((page, UNUSED));
            }
        }
    }

    fn touch(&mut self, page: u64, how: Touch, _at: usize) {
        let Some(m) = self.meta.get_mut(&page) else {
            return;
        };
        if how == Touch::Hit && self.visibility != Visibility::Oracle {
            return;
        }
        match (m.probation, how) {
            // The first report after a demand fault is most likely that fault's own access.
            (Some(0), Touch::Scanned) => m.probation = Some(1),
            _ => self.promote(page),
        }
    }

    fn victim(&mut self, _at: usize) -> Option<u64> {
        // Unused prefetched pages first (stamped older than everything in the LRU order).
        if let Some(&(page, UNUSED)) = self.lru.front() {
            if self.meta.get(&page).is_some_and(|m| m.stamp == UNUSED) {
                return self.pop(false);
            }
        }
        let over = self.in_probation * 100 > self.meta.len() * self.probation_pct as usize;
        let first = over || self.meta.len() == self.in_probation;
        self.pop(first).or_else(|| self.pop(!first))
    }

    fn remove(&mut self, page: u64) {
        if let Some(m) = self.meta.remove(&page) {
            if m.probation.is_some() {
                self.in_probation -= 1;
            }
        }
        self.compact_if_stale();
    }

    fn len(&self) -> usize {
        self.meta.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lru_the_page_seen_longest_ago_leaves_first_and_unused_prefetches_before_it() {
        let mut r = Recency::new(Visibility::Fault, 0);
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
    fn a_page_seen_once_leaves_from_probation_and_one_seen_twice_stays() {
        let mut r = Recency::new(Visibility::Fault, 25);
        // Ten pages, each reported twice: in the LRU order.
        for p in 0..10u64 {
            r.insert(p, Insert::Demand, 0);
            r.touch(p, Touch::Scanned, 0);
            r.touch(p, Touch::Scanned, 0);
        }
        // Six pages reported once (their fault's own access): probation, over its share.
        for p in 100..106u64 {
            r.insert(p, Insert::Demand, 0);
            r.touch(p, Touch::Scanned, 0);
        }
        // Victims come from the probation, oldest first, while it holds over 25%: 6 of 16,
        // 5 of 15 and 4 of 14 do, 3 of 13 does not.
        let out: Vec<u64> = (0..3).map(|_| r.victim(0).unwrap()).collect();
        assert_eq!(out, vec![100, 101, 102], "the pages seen once go first");
        // Then the LRU order's oldest.
        assert_eq!(r.victim(0), Some(0));
        // A probation page reported again joins the LRU order as its youngest.
        r.touch(103, Touch::Scanned, 1);
        assert_eq!(r.len(), 12);
        assert_eq!(r.in_probation, 2);
    }

    #[test]
    fn stale_entries_are_compacted_and_removed_pages_never_return() {
        let mut r = Recency::new(Visibility::Fault, 25);
        for p in 0..100u64 {
            r.insert(p, Insert::Demand, 0);
        }
        for round in 0..50 {
            for p in 0..100u64 {
                r.touch(p, Touch::Scanned, round);
            }
        }
        assert!(r.lru.len() + r.probation.len() <= 4 * 100 + 2 * 64 + 2);
        r.remove(0);
        let mut out = Vec::new();
        while let Some(p) = r.victim(0) {
            out.push(p);
        }
        assert_eq!(out, (1..100).collect::<Vec<_>>());
    }
}
