//! Belady's MIN (a reference point): evict the resident page whose next use is furthest in the
//! future (never used again counts as infinitely far). Optimal for demand paging with a forced
//! fetch of every missed page; with prefetching it remains the natural "perfect knowledge"
//! reference, not a proven optimum.
//!
//! The future is precomputed once per trace ([`Future`]: for every reference, the index of the
//! next reference to the same page), and the policy keeps its pages in an ordered set keyed by
//! next use, so a replay costs O(n log n). Belady always sees every reference (oracle).

use std::collections::BTreeSet;
use std::sync::Arc;

use super::{EvictPolicy, Insert, PageMap, Touch, Visibility};

/// "Never used again".
const NEVER: usize = usize::MAX;

/// The future of a reference string: next-use indices.
#[derive(Debug, Clone)]
pub struct Future {
    /// `next[i]`: index of the next reference to the page of reference `i`, or `usize::MAX`.
    next: Vec<usize>,
    /// Index of the first reference to each page.
    first: PageMap<usize>,
}

impl Future {
    /// Builds the next-use table of a reference string (one page per reference), O(n).
    pub fn new(pages: impl IntoIterator<Item = u64>) -> Self {
        let pages: Vec<u64> = pages.into_iter().collect();
        let mut next = vec![NEVER; pages.len()];
        let mut first: PageMap<usize> = PageMap::default();
        for (i, &p) in pages.iter().enumerate().rev() {
            if let Some(&later) = first.get(&p) {
                next[i] = later;
            }
            first.insert(p, i);
        }
        Future { next, first }
    }

    /// The number of references.
    pub fn len(&self) -> usize {
        self.next.len()
    }

    /// Whether the reference string is empty.
    pub fn is_empty(&self) -> bool {
        self.next.is_empty()
    }

    /// The index of the next reference to the page referenced at `i` (`usize::MAX`: never).
    pub fn next_after(&self, i: usize) -> usize {
        self.next.get(i).copied().unwrap_or(NEVER)
    }

    /// The index of the first reference to `page` (`usize::MAX`: never).
    pub fn first(&self, page: u64) -> usize {
        self.first.get(&page).copied().unwrap_or(NEVER)
    }
}

/// Belady's MIN over a [`Future`].
#[derive(Debug, Clone)]
pub struct Belady {
    future: Arc<Future>,
    /// (next use, page) of every resident page.
    order: BTreeSet<(usize, u64)>,
    key: PageMap<usize>,
    /// Index of the latest reference seen to each page (to answer "next use" for prefetches).
    last_ref: PageMap<usize>,
}

impl Belady {
    /// Belady over the future of the trace being replayed. The simulator must replay exactly the
    /// references the future was built from, passing each one's index as `at`.
    pub fn new(future: Arc<Future>) -> Self {
        Belady {
            future,
            order: BTreeSet::new(),
            key: PageMap::default(),
            last_ref: PageMap::default(),
        }
    }

    fn set(&mut self, page: u64, next: usize) {
        if let Some(old) = self.key.insert(page, next) {
            self.order.remove(&(old, page));
        }
        self.order.insert((next, page));
    }

    /// `page` is referenced at `at`: its next use is the next reference after `at`.
    fn referenced(&mut self, page: u64, at: usize) {
        self.last_ref.insert(page, at);
        let next = self.future.next_after(at);
        self.set(page, next);
    }
}

impl EvictPolicy for Belady {
    fn name(&self) -> String {
        "belady".into()
    }

    fn visibility(&self) -> Visibility {
        Visibility::Oracle
    }

    fn insert(&mut self, page: u64, how: Insert, at: usize) {
        match how {
            Insert::Demand => self.referenced(page, at),
            Insert::Prefetch => {
                // Not referenced now: its next use follows its latest reference so far.
                let next = match self.last_ref.get(&page) {
                    Some(&j) => self.future.next_after(j),
                    None => self.future.first(page),
                };
                self.set(page, next);
            }
        }
    }

    fn touch(&mut self, page: u64, _how: Touch, at: usize) {
        if self.key.contains_key(&page) {
            self.referenced(page, at);
        }
    }

    fn victim(&mut self, _at: usize) -> Option<u64> {
        let (_, page) = self.order.pop_last()?;
        self.key.remove(&page);
        Some(page)
    }

    fn remove(&mut self, page: u64) {
        if let Some(k) = self.key.remove(&page) {
            self.order.remove(&(k, page));
        }
    }

    fn len(&self) -> usize {
        self.key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn future_next_use_table() {
        let f = Future::new([7u64, 8, 7, 9, 8]);
        assert_eq!(f.len(), 5);
        assert_eq!(
            (0..5).map(|i| f.next_after(i)).collect::<Vec<_>>(),
            vec![2, 4, NEVER, NEVER, NEVER]
        );
        assert_eq!(f.first(9), 3);
        assert_eq!(f.first(1), NEVER);
    }
}
