//! First in, first out: pages leave in the order they became resident; accesses change nothing.

use std::collections::VecDeque;

use super::{EvictPolicy, Insert, PageMap, Touch, Visibility};

/// FIFO over insertion order (demand and prefetch alike).
#[derive(Debug, Default, Clone)]
pub struct Fifo {
    /// (page, sequence number); entries whose sequence no longer matches `live` are stale.
    queue: VecDeque<(u64, u64)>,
    live: PageMap<u64>,
    seq: u64,
}

impl Fifo {
    /// An empty FIFO.
    pub fn new() -> Self {
        Self::default()
    }

    fn compact(&mut self) {
        if self.queue.len() > 2 * self.live.len() + 64 {
            let live = &self.live;
            self.queue.retain(|(p, s)| live.get(p) == Some(s));
        }
    }
}

impl EvictPolicy for Fifo {
    fn name(&self) -> String {
        "fifo".into()
    }

    fn visibility(&self) -> Visibility {
        Visibility::Fault
    }

    fn insert(&mut self, page: u64, _how: Insert, _at: usize) {
        self.seq += 1;
        self.live.insert(page, self.seq);
        self.queue.push_back((page, self.seq));
    }

    fn touch(&mut self, _page: u64, _how: Touch, _at: usize) {}

    fn victim(&mut self, _at: usize) -> Option<u64> {
        while let Some((p, s)) = self.queue.pop_front() {
            if self.live.get(&p) == Some(&s) {
                self.live.remove(&p);
                return Some(p);
            }
        }
        None
    }

    fn remove(&mut self, page: u64) {
        if self.live.remove(&page).is_some() {
            self.compact();
        }
    }

    fn len(&self) -> usize {
        self.live.len()
    }
}
