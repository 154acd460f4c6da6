//! Exact least-recently-used (a reference point): every access, hits included, moves the page to
//! the most-recently-used end, whatever the simulator's visibility setting. Prefetched pages enter
//! at the most-recently-used end.

use std::collections::BTreeMap;

use super::{EvictPolicy, Insert, PageMap, Touch, Visibility};

/// Exact LRU with recency stamps: O(log n) per operation.
#[derive(Debug, Default, Clone)]
pub struct Lru {
    by_stamp: BTreeMap<u64, u64>,
    stamp_of: PageMap<u64>,
    clock: u64,
}

impl Lru {
    /// An empty LRU.
    pub fn new() -> Self {
        Self::default()
    }

    fn bump(&mut self, page: u64) {
        self.clock += 1;
        if let Some(old) = self.stamp_of.insert(page, self.clock) {
            self.by_stamp.remove(&old);
        }
        self.by_stamp.insert(self.clock, page);
    }
}

impl EvictPolicy for Lru {
    fn name(&self) -> String {
        "lru".into()
    }

    fn visibility(&self) -> Visibility {
        Visibility::Oracle
    }

    fn insert(&mut self, page: u64, _how: Insert, _at: usize) {
        self.bump(page);
    }

    fn touch(&mut self, page: u64, _how: Touch, _at: usize) {
        if self.stamp_of.contains_key(&page) {
            self.bump(page);
        }
    }

    fn victim(&mut self, _at: usize) -> Option<u64> {
        let (_, page) = self.by_stamp.pop_first()?;
        self.stamp_of.remove(&page);
        Some(page)
    }

    fn remove(&mut self, page: u64) {
        if let Some(s) = self.stamp_of.remove(&page) {
            self.by_stamp.remove(&s);
        }
    }

    fn len(&self) -> usize {
        self.stamp_of.len()
    }
}
