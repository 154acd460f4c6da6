//! One session's pages, and the capacity pool all sessions share.
//!
//! # Layout
//!
//! Each session owns a [`PageStore`]: a hash map from page id to a boxed page
//! (`HashMap<u64, Box<[u8; PAGE_SIZE]>>`). Every page is its own 4 KiB heap allocation, so
//! storing, overwriting and freeing a page never moves other pages, freed memory goes straight
//! back to the allocator, and there is no arena to compact. The cost is the allocator's per-chunk
//! header and the map entry (~16 + 24 bytes per page, about 1 % of the page).
//! A slab arena would save that 1 % and the per-page `malloc`, at the price of its own free list
//! and fragmentation handling; the map is the simpler choice until measurements say otherwise.
//!
//! The map hashes ids with a seeded splitmix64 finaliser: page ids are dense integers, which
//! SipHash would hash correctly but several times slower, and a plain multiplicative hash would
//! collide on strided ids.
//!
//! # Concurrency
//!
//! The session wraps its store in an `RwLock` (see `session.rs`): reads of one session proceed in
//! parallel, writes and frees are exclusive, and different sessions never contend. Incoming pages
//! are copied into their boxes *before* the lock is taken ([`stage`]), so a write holds the lock
//! only for the map inserts. No lock is ever held during socket I/O.
//!
//! # Capacity
//!
//! [`Capacity`] counts the pages stored by all sessions together. A write reserves exactly the
//! number of pages new to its session (ids already stored are overwritten in place, duplicate ids
//! within a batch count once) with one compare-and-swap, under the session's write lock, so the
//! count of new pages cannot change between counting and storing. Every page removed by `Free`,
//! `Goodbye` or lease expiry is released back. `used` therefore always equals the number of pages
//! held by all sessions.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use gleaner_proto::{PageBatch, PageIds, PageRanges, PAGE_SIZE};

/// One stored page.
pub(crate) type Page = Box<[u8; PAGE_SIZE]>;

/// How many missing ids a `NotFound` message lists.
const MISSING_LISTED: usize = 8;

/// The pages all sessions together may hold, and how many they hold now.
#[derive(Debug)]
pub(crate) struct Capacity {
    total: u64,
    used: AtomicU64,
}

impl Capacity {
    /// A pool of `total` pages, all free.
    pub(crate) fn new(total: u64) -> Self {
        Capacity {
            total,
            used: AtomicU64::new(0),
        }
    }

    /// Total pages.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Pages in use.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Reserves `n` pages atomically, or returns how many were free if `n` do not fit.
    pub(crate) fn try_reserve(&self, n: u64) -> Result<(), u64> {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let free = self.total.saturating_sub(used);
            if n > free {
                return Err(free);
            }
            match self.used.compare_exchange_weak(
                used,
                used + n,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(now) => used = now,
            }
        }
    }

    /// Returns `n` pages to the pool.
    pub(crate) fn release(&self, n: u64) {
        if n == 0 {
            return;
        }
        let before = self.used.fetch_sub(n, Ordering::Relaxed);
        debug_assert!(
            before >= n,
            "released {n} pages but only {before} were used"
        );
    }
}

/// A write did not fit: nothing was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full {
    /// Pages new to the session that the batch needed.
    pub needed: u64,
    /// Pages free at the time.
    pub free: u64,
    /// Total capacity.
    pub total: u64,
}

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "memnode full: batch needs {} new pages, {} of {} free",
            self.needed, self.free, self.total
        )
    }
}

/// Some pages of a read are not stored in the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Missing {
    /// The first few missing ids, in request order.
    pub listed: Vec<u64>,
    /// How many requested ids were missing in all.
    pub total: usize,
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "page(s) ")?;
        for (i, id) in self.listed.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{id}")?;
        }
        if self.total > self.listed.len() {
            write!(f, " and {} more", self.total - self.listed.len())?;
        }
        write!(f, " not stored in this session")
    }
}

/// Copies a write batch into freshly allocated pages, outside any lock. `staged` is cleared first.
pub(crate) fn stage(batch: &PageBatch<'_>, staged: &mut Vec<(u64, Page)>) {
    staged.clear();
    staged.reserve(batch.len());
    for (id, data) in batch.iter() {
        // One allocation and one copy (no zero-fill): the decoder guarantees entries of exactly
        // PAGE_SIZE bytes.
        let page: Page = Box::<[u8]>::from(data)
            .try_into()
            .expect("a decoded batch entry is exactly one page");
        staged.push((id, page));
    }
}

/// One session's pages.
#[derive(Debug)]
pub(crate) struct PageStore {
    pages: HashMap<u64, Page, IdHashBuilder>,
    /// Set once the session ended: the store then refuses every further operation.
    ended: bool,
}

impl PageStore {
    /// An empty store whose hasher is seeded with `seed`.
    pub(crate) fn new(seed: u64) -> Self {
        PageStore {
            pages: HashMap::with_hasher(IdHashBuilder { seed }),
            ended: false,
        }
    }

    /// Pages held.
    pub(crate) fn len(&self) -> usize {
        self.pages.len()
    }

    /// Whether the session has ended (its pages were released).
    pub(crate) fn is_ended(&self) -> bool {
        self.ended
    }

    /// Encodes the reply to a read (a `Pages` payload, in request order) into `out`, or reports
    /// the missing pages. Never produces a page that is not stored.
    pub(crate) fn read_into(&self, ids: &PageIds<'_>, out: &mut Vec<u8>) -> Result<(), Missing> {
        PageBatch::begin(out);
        let mut missing = Missing {
            listed: Vec::new(),
            total: 0,
        };
        for id in ids.iter() {
            match self.pages.get(&id) {
                Some(page) if missing.total == 0 => PageBatch::push(out, id, &page[..]),
                Some(_) => {}
                None => {
                    missing.total += 1;
                    if missing.listed.len() < MISSING_LISTED {
                        missing.listed.push(id);
                    }
                }
            }
        }
        if missing.total > 0 {
            out.clear();
            return Err(missing);
        }
        Ok(())
    }

    /// Stores the staged pages, all or nothing. Reserves the pages new to this session from
    /// `capacity`; if they do not fit, stores nothing and leaves `staged` as it was. On success
    /// `staged` is drained and the pages it replaced are moved to `replaced` so the caller can
    /// free them after unlocking. `new_ids` is scratch space. Returns the pages newly added.
    pub(crate) fn write(
        &mut self,
        staged: &mut Vec<(u64, Page)>,
        capacity: &Capacity,
        new_ids: &mut Vec<u64>,
        replaced: &mut Vec<Page>,
    ) -> Result<u64, Full> {
        new_ids.clear();
        new_ids.extend(
            staged
                .iter()
                .map(|(id, _)| *id)
                .filter(|id| !self.pages.contains_key(id)),
        );
        new_ids.sort_unstable();
        new_ids.dedup();
        let needed = new_ids.len() as u64;
        capacity.try_reserve(needed).map_err(|free| Full {
            needed,
            free,
            total: capacity.total(),
        })?;
        self.pages.reserve(new_ids.len());
        for (id, page) in staged.drain(..) {
            if let Some(old) = self.pages.insert(id, page) {
                replaced.push(old);
            }
        }
        Ok(needed)
    }

    /// Removes every stored page in `ranges` and releases them to `capacity`; returns how many
    /// were removed. Work is bounded by the pages held, not by the ranges' nominal size (a range
    /// may cover up to `u32::MAX` pages).
    pub(crate) fn free(&mut self, ranges: &PageRanges<'_>, capacity: &Capacity) -> u64 {
        let before = self.pages.len();
        // At most MAX_FREE_RANGES × u32::MAX: fits a u64.
        let nominal: u64 = ranges.iter().map(|(_, n)| u64::from(n)).sum();
        if nominal <= before as u64 {
            for (start, count) in ranges.iter() {
                for id in (0..u64::from(count)).map_while(|i| start.checked_add(i)) {
                    self.pages.remove(&id);
                }
            }
        } else {
            // The ranges cover more ids than the session holds: walk the map once instead,
            // testing each id against the sorted, merged ranges.
            let merged = merge_ranges(ranges);
            self.pages.retain(|id, _| !covered(&merged, *id));
        }
        let removed = (before - self.pages.len()) as u64;
        capacity.release(removed);
        removed
    }

    /// Ends the session: drops every page, releases them to `capacity`, and refuses further
    /// operations. Returns how many pages were released (0 if it had already ended).
    pub(crate) fn end(&mut self, capacity: &Capacity) -> u64 {
        self.ended = true;
        let n = self.pages.len() as u64;
        self.pages = HashMap::with_hasher(self.pages.hasher().clone());
        capacity.release(n);
        n
    }
}

/// Sorted, non-overlapping inclusive `(first, last)` ranges covering the same ids as `ranges`.
fn merge_ranges(ranges: &PageRanges<'_>) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = ranges
        .iter()
        .filter(|&(_, n)| n > 0)
        .map(|(start, n)| (start, start.saturating_add(u64::from(n) - 1)))
        .collect();
    v.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (first, last) in v {
        match merged.last_mut() {
            Some(prev) if first <= prev.1.saturating_add(1) => prev.1 = prev.1.max(last),
            _ => merged.push((first, last)),
        }
    }
    merged
}

/// Whether `id` lies in one of the sorted, merged inclusive `ranges`.
fn covered(ranges: &[(u64, u64)], id: u64) -> bool {
    // The first range starting after `id`; the one before it is the only candidate.
    let i = ranges.partition_point(|&(first, _)| first <= id);
    i > 0 && id <= ranges[i - 1].1
}

/// Builds [`IdHasher`]s that share one seed.
#[derive(Debug, Clone)]
pub(crate) struct IdHashBuilder {
    seed: u64,
}

impl BuildHasher for IdHashBuilder {
    type Hasher = IdHasher;

    fn build_hasher(&self) -> IdHasher {
        IdHasher { state: self.seed }
    }
}

/// A fast hasher for `u64` page ids: the splitmix64 finaliser over the id xor a per-process seed.
#[derive(Debug)]
pub(crate) struct IdHasher {
    state: u64,
}

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed in practice; this path keeps the trait complete.
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }

    fn write_u64(&mut self, id: u64) {
        let mut z = (self.state ^ id).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        self.state = z ^ (z >> 31);
    }

    fn finish(&self) -> u64 {
        self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(ids: &[u64]) -> Vec<u8> {
        let mut out = Vec::new();
        PageBatch::begin(&mut out);
        for &id in ids {
            PageBatch::push(&mut out, id, &[id as u8; PAGE_SIZE]);
        }
        out
    }

    fn write(store: &mut PageStore, cap: &Capacity, ids: &[u64]) -> Result<u64, Full> {
        let raw = batch(ids);
        let mut staged = Vec::new();
        stage(&PageBatch::from_encoded(&raw), &mut staged);
        store.write(&mut staged, cap, &mut Vec::new(), &mut Vec::new())
    }

    fn free(store: &mut PageStore, cap: &Capacity, ranges: &[(u64, u32)]) -> u64 {
        let mut raw = Vec::new();
        PageRanges::encode_into(&mut raw, ranges);
        store.free(&PageRanges::from_encoded(&raw), cap)
    }

    #[test]
    fn capacity_counts_new_pages_once_and_refuses_overflow() {
        let cap = Capacity::new(4);
        let mut s = PageStore::new(1);
        assert_eq!(write(&mut s, &cap, &[1, 2, 2]), Ok(2));
        assert_eq!(write(&mut s, &cap, &[1, 2, 3]), Ok(1));
        assert_eq!(cap.used(), 3);
        let err = write(&mut s, &cap, &[1, 4, 5]).unwrap_err();
        assert_eq!(
            err,
            Full {
                needed: 2,
                free: 1,
                total: 4
            }
        );
        assert_eq!(s.len(), 3);
        assert_eq!(cap.used(), 3);
        assert_eq!(s.end(&cap), 3);
        assert_eq!(cap.used(), 0);
        assert!(s.is_ended());
    }

    #[test]
    fn free_handles_huge_and_overlapping_ranges() {
        let cap = Capacity::new(100);
        let mut s = PageStore::new(7);
        write(&mut s, &cap, &[0, 1, 2, 10, 11, u64::MAX - 1, u64::MAX]).unwrap();
        assert_eq!(free(&mut s, &cap, &[(1, 2)]), 2);
        assert_eq!(free(&mut s, &cap, &[(u64::MAX - 1, u32::MAX)]), 2);
        assert_eq!(free(&mut s, &cap, &[(5, u32::MAX), (9, 3), (0, 0)]), 2);
        assert_eq!(s.len(), 1);
        assert_eq!(cap.used(), 1);
        assert_eq!(free(&mut s, &cap, &[(0, 1)]), 1);
        assert_eq!(cap.used(), 0);
    }

    #[test]
    fn merged_ranges_cover_exactly_their_ids() {
        let mut raw = Vec::new();
        PageRanges::encode_into(&mut raw, &[(10, 5), (12, 10), (30, 1), (100, 0)]);
        let m = merge_ranges(&PageRanges::from_encoded(&raw));
        assert_eq!(m, vec![(10, 21), (30, 30)]);
        for id in [10, 15, 21, 30] {
            assert!(covered(&m, id), "{id}");
        }
        for id in [0, 9, 22, 29, 31, 100] {
            assert!(!covered(&m, id), "{id}");
        }
    }

    #[test]
    fn read_lists_missing_pages_and_never_returns_partial_data() {
        let cap = Capacity::new(100);
        let mut s = PageStore::new(3);
        write(&mut s, &cap, &[1, 2]).unwrap();
        let mut ids = Vec::new();
        PageIds::encode_into(&mut ids, &[2, 1]);
        let mut out = Vec::new();
        s.read_into(&PageIds::from_encoded(&ids), &mut out).unwrap();
        let b = PageBatch::from_encoded(&out);
        assert_eq!(b.get(0).0, 2);
        assert!(b.get(0).1.iter().all(|&x| x == 2));
        assert_eq!(b.get(1).0, 1);
        ids.clear();
        PageIds::encode_into(&mut ids, &(0..20).collect::<Vec<_>>());
        let m = s
            .read_into(&PageIds::from_encoded(&ids), &mut out)
            .unwrap_err();
        assert_eq!(m.total, 18);
        assert_eq!(
            m.to_string(),
            "page(s) 0, 3, 4, 5, 6, 7, 8, 9 and 10 more not stored in this session"
        );
        assert!(out.is_empty());
    }
}
