//! One session's pages, and the capacity pool all sessions share.
//!
//! # Layout
//!
//! Each session owns a [`SessionPages`]: a hash map from page id to the page's blob, boxed at its
//! own length (`HashMap<u64, Box<[u8]>>`). Blobs are opaque: the client may store a page raw
//! (4096 bytes) or sealed by its codec (compressed and/or encrypted, 1 to
//! [`MAX_BLOB_SIZE`](gleaner_proto::MAX_BLOB_SIZE) bytes); the memnode never looks inside.
//! Every blob is its own heap allocation, so storing, overwriting and freeing a page never moves
//! other pages, freed memory goes straight back to the allocator, and there is no arena to
//! compact. The cost is the allocator's per-chunk header and the map entry (~16 + 32 bytes per
//! page: about 1 % of a raw page, relatively more for a well-compressed one).
//! A slab arena would save that and the per-page `malloc`, at the price of its own free list
//! and fragmentation handling (worse with variable sizes); the map is the simpler choice until
//! measurements say otherwise.
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
//! [`Capacity`] counts **bytes**: a stored blob occupies exactly its length (not `PAGE_SIZE`, and
//! not the allocator's rounding or the map entry, which are overhead of this host, not the
//! client's data), and a shared-memory slab occupies its pages × `PAGE_SIZE` (see `slabs.rs`).
//!
//! A write reserves the batch's net growth of its session: for every distinct id in the batch,
//! the length of its new blob minus the length of the blob it replaces (0 for a new id). For an
//! id repeated within a batch only the last copy is stored, so only the last copy counts. A
//! positive net growth is reserved with one compare-and-swap before anything is stored (all or
//! nothing); a negative one (the batch replaces blobs with smaller ones) is released once the
//! batch is stored. Both happen under the session's write lock, so the lengths being replaced
//! cannot change between counting and storing. Every blob removed by `Free`, `Goodbye` or lease
//! expiry releases its length. `used` therefore always equals the bytes of all blobs held by all
//! sessions plus the bytes of all granted slabs.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use gleaner_proto::units::format_size;
use gleaner_proto::{PageBatch, PageIds, PageRanges, PageVersions};

/// One stored page: its blob, exactly as the client sent it (1 to `MAX_BLOB_SIZE` bytes),
/// reference-counted so that a forked session shares it with its parent until either replaces
/// or frees it.
pub(crate) type Blob = std::sync::Arc<[u8]>;

/// A page as the client wrote it: `(id, version, blob)`.
pub(crate) type Staged = (u64, u64, Blob);

/// A stored page: the version the client gave it and its blob.
#[derive(Debug, Clone)]
struct Stored {
    version: u64,
    blob: Blob,
}

/// How many missing ids a `NotFound` message lists.
const MISSING_LISTED: usize = 8;

/// The bytes all sessions together may hold (blob lengths plus granted slabs), and how many they
/// hold now; or, with a parent, one tenant's quota within the memnode's capacity: a reservation
/// must fit both, and a release returns to both.
#[derive(Debug)]
pub(crate) struct Capacity {
    total: u64,
    used: AtomicU64,
    parent: Option<Arc<Capacity>>,
    /// The tenant whose quota this is.
    owner: Option<String>,
}

impl Capacity {
    /// A pool of `total` bytes, all free.
    pub(crate) fn new(total: u64) -> Self {
        Capacity {
            total,
            used: AtomicU64::new(0),
            parent: None,
            owner: None,
        }
    }

    /// Tenant `owner`'s quota of `total` bytes within `parent`.
    pub(crate) fn quota(total: u64, parent: Arc<Capacity>, owner: &str) -> Self {
        let total = total.min(parent.total);
        Capacity {
            total,
            used: AtomicU64::new(0),
            parent: Some(parent),
            owner: Some(owner.to_string()),
        }
    }

    /// Total bytes.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Bytes in use.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Bytes free now (within the parent's free bytes too).
    pub(crate) fn free(&self) -> u64 {
        let own = self.total.saturating_sub(self.used());
        self.parent.as_ref().map_or(own, |p| own.min(p.free()))
    }

    /// Reserves `n` bytes atomically (here and in the parent), or returns how many were free
    /// if `n` do not fit.
    pub(crate) fn try_reserve(&self, n: u64) -> Result<(), u64> {
        self.reserve_or_refuse(n).map_err(|r| r.free)
    }

    /// As [`Capacity::try_reserve`], saying which level refused.
    pub(crate) fn reserve_or_refuse(&self, n: u64) -> Result<(), Refused> {
        self.try_reserve_here(n).map_err(|free| Refused {
            free,
            total: self.total,
            quota_of: self.owner.clone(),
        })?;
        if let Some(p) = &self.parent {
            if let Err(r) = p.reserve_or_refuse(n) {
                self.release_here(n);
                return Err(r);
            }
        }
        Ok(())
    }

    fn try_reserve_here(&self, n: u64) -> Result<(), u64> {
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

    /// Returns `n` bytes to the pool (and the parent's).
    pub(crate) fn release(&self, n: u64) {
        self.release_here(n);
        if let Some(p) = &self.parent {
            p.release(n);
        }
    }

    fn release_here(&self, n: u64) {
        if n == 0 {
            return;
        }
        let before = self.used.fetch_sub(n, Ordering::Relaxed);
        debug_assert!(
            before >= n,
            "released {n} bytes but only {before} were used"
        );
    }
}

/// A reservation that did not fit, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    /// Bytes free at that level.
    pub free: u64,
    /// That level's total.
    pub total: u64,
    /// The tenant, when its quota refused (None: the memnode's capacity).
    pub quota_of: Option<String>,
}

/// What removing pages (or slabs) gave back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Released {
    /// Pages removed: stored blobs, plus the pages of slabs.
    pub pages: u64,
    /// Bytes returned to the [`Capacity`].
    pub bytes: u64,
}

impl std::ops::Add for Released {
    type Output = Released;

    fn add(self, other: Released) -> Released {
        Released {
            pages: self.pages + other.pages,
            bytes: self.bytes + other.bytes,
        }
    }
}

/// A write did not fit: nothing was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Full {
    /// Bytes the batch would have added to the session (its net growth).
    pub needed: u64,
    /// Bytes free at the time.
    pub free: u64,
    /// Total capacity (or the tenant's quota) in bytes.
    pub total: u64,
    /// The tenant whose quota refused the batch (None: the memnode's capacity did).
    pub tenant: Option<String>,
}

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.tenant {
            Some(t) => write!(f, "tenant {t} is at its quota")?,
            None => write!(f, "memnode full")?,
        }
        write!(
            f,
            ": batch needs {} more bytes, {} of {} free ({} of {})",
            self.needed,
            self.free,
            self.total,
            format_size(self.free),
            format_size(self.total)
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

/// Copies a write batch into freshly allocated blobs, outside any lock. `staged` is cleared
/// first.
pub(crate) fn stage(batch: &PageBatch<'_>, staged: &mut Vec<Staged>) {
    staged.clear();
    staged.reserve(batch.len());
    // One allocation and one copy (no zero-fill) per entry, at the entry's own length (the
    // decoder bounded it to 1..=MAX_BLOB_SIZE).
    staged.extend(
        batch
            .iter()
            .map(|(id, version, data)| (id, version, Blob::from(data))),
    );
}

/// What a stored write batch did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Written {
    /// The change in the bytes the session holds.
    pub(crate) delta: i64,
    /// Entries not stored because the session holds a newer version of their page (a batch
    /// delivered late, after its client had written the page again).
    pub(crate) stale: u64,
}

/// One session's pages.
#[derive(Debug)]
pub(crate) struct SessionPages {
    pages: HashMap<u64, Stored, IdHashBuilder>,
    /// Sum of the lengths of the blobs in `pages` (what they hold of the [`Capacity`]).
    stored_bytes: u64,
    /// Set once the session ended: the store then refuses every further operation.
    ended: bool,
}

impl SessionPages {
    /// An empty store whose hasher is seeded with `seed`.
    pub(crate) fn new(seed: u64) -> Self {
        SessionPages {
            pages: HashMap::with_hasher(IdHashBuilder { seed }),
            stored_bytes: 0,
            ended: false,
        }
    }

    /// Pages (blobs) held.
    pub(crate) fn len(&self) -> usize {
        self.pages.len()
    }

    /// Bytes held: the sum of the blobs' lengths.
    pub(crate) fn stored_bytes(&self) -> u64 {
        self.stored_bytes
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
                Some(page) if missing.total == 0 => {
                    PageBatch::push(out, id, page.version, &page.blob[..])
                }
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

    /// Stores the staged blobs, all or nothing. Reserves the batch's net growth in bytes from
    /// `capacity` (see the module documentation); if it does not fit, stores nothing and leaves
    /// `staged` as it was. On success `staged` is drained, any bytes the batch freed (smaller
    /// blobs replacing larger ones) are released, and the blobs it replaced or skipped are moved
    /// to `dropped` so the caller can free them after unlocking. An entry older than the
    /// version stored for its page is skipped (counted as stale); an equal version replaces
    /// (the same batch sent again). `order` is scratch space.
    pub(crate) fn write(
        &mut self,
        staged: &mut Vec<Staged>,
        capacity: &Capacity,
        order: &mut Vec<(u64, usize)>,
        dropped: &mut Vec<Blob>,
    ) -> Result<Written, Full> {
        // Group the entries by id, in batch order within an id: the last entry of each group is
        // the copy that will be stored, unless the stored page is newer. Batches are at most
        // MAX_BATCH_PAGES long.
        order.clear();
        order.extend(staged.iter().enumerate().map(|(i, (id, _, _))| (*id, i)));
        order.sort_unstable();
        let (mut grow, mut shrink, mut stale) = (0u64, 0u64, 0u64);
        let mut applied = Vec::with_capacity(order.len());
        for (k, &(id, i)) in order.iter().enumerate() {
            if order.get(k + 1).is_some_and(|next| next.0 == id) {
                continue; // a later copy of this id replaces this one within the batch
            }
            let old = self.pages.get(&id);
            if old.is_some_and(|old| old.version > staged[i].1) {
                stale += 1;
                continue;
            }
            grow += staged[i].2.len() as u64;
            shrink += old.map_or(0, |old| old.blob.len() as u64);
            applied.push(i);
        }
        reserve(capacity, grow.saturating_sub(shrink))?;
        applied.sort_unstable();
        self.pages.reserve(applied.len());
        let mut next = applied.iter().peekable();
        for (i, (id, version, blob)) in staged.drain(..).enumerate() {
            if next.next_if(|&&a| a == i).is_none() {
                dropped.push(blob);
                continue;
            }
            if let Some(old) = self.pages.insert(id, Stored { version, blob }) {
                dropped.push(old.blob);
            }
        }
        // Only the last copy of each id remains: net of the earlier copies and the old blobs.
        capacity.release(shrink.saturating_sub(grow));
        self.stored_bytes = self.stored_bytes + grow - shrink;
        Ok(Written {
            delta: grow as i64 - shrink as i64,
            stale,
        })
    }

    /// A copy of this store for a forked session: the same pages, sharing their blobs (a write
    /// or free on either side replaces or drops only its own reference). The copy's bytes are
    /// reserved from `capacity` in full, all or nothing, as if they were its own: while both
    /// sessions live the memnode may hold up to twice the bytes, and never promises more than
    /// it has.
    pub(crate) fn fork(&self, capacity: &Capacity) -> Result<SessionPages, Full> {
        reserve(capacity, self.stored_bytes)?;
        Ok(SessionPages {
            pages: self.pages.clone(),
            stored_bytes: self.stored_bytes,
            ended: false,
        })
    }

    /// Removes `id`'s blob, if stored; returns its length.
    fn remove(&mut self, id: u64) -> Option<u64> {
        self.pages.remove(&id).map(|p| p.blob.len() as u64)
    }

    /// Removes the stored copy of each `(id, version)` whose stored version is the one given
    /// (a copy the client fetched and no longer needs) and releases their bytes to `capacity`;
    /// a newer copy stays, so a forget delivered late never drops what the client wrote since.
    pub(crate) fn forget(&mut self, copies: &PageVersions<'_>, capacity: &Capacity) -> Released {
        let (mut pages, mut bytes) = (0u64, 0u64);
        for (id, version) in copies.iter() {
            if self.pages.get(&id).is_some_and(|p| p.version == version) {
                bytes += self.remove(id).unwrap_or(0);
                pages += 1;
            }
        }
        self.stored_bytes -= bytes;
        capacity.release(bytes);
        Released { pages, bytes }
    }

    /// Removes every stored page in `ranges` and releases their bytes to `capacity`; returns
    /// how many pages and bytes were removed. Work is bounded by the pages held, not by the
    /// ranges' nominal size (a range may cover up to `u32::MAX` pages).
    pub(crate) fn free(&mut self, ranges: &PageRanges<'_>, capacity: &Capacity) -> Released {
        let before = self.pages.len();
        let mut bytes = 0u64;
        // At most MAX_FREE_RANGES × u32::MAX: fits a u64.
        let nominal: u64 = ranges.iter().map(|(_, n)| u64::from(n)).sum();
        if nominal <= before as u64 {
            for (start, count) in ranges.iter() {
                for id in (0..u64::from(count)).map_while(|i| start.checked_add(i)) {
                    bytes += self.remove(id).unwrap_or(0);
                }
            }
        } else {
            // The ranges cover more ids than the session holds: walk the map once instead,
            // testing each id against the sorted, merged ranges.
            let merged = merge_ranges(ranges);
            self.pages.retain(|id, page| {
                let keep = !covered(&merged, *id);
                if !keep {
                    bytes += page.blob.len() as u64;
                }
                keep
            });
        }
        self.stored_bytes -= bytes;
        capacity.release(bytes);
        Released {
            pages: (before - self.pages.len()) as u64,
            bytes,
        }
    }

    /// Ends the session: drops every page, releases their bytes to `capacity`, and refuses
    /// further operations. Returns what was released (nothing if it had already ended).
    pub(crate) fn end(&mut self, capacity: &Capacity) -> Released {
        self.ended = true;
        let released = Released {
            pages: self.pages.len() as u64,
            bytes: self.stored_bytes,
        };
        self.pages = HashMap::with_hasher(self.pages.hasher().clone());
        self.stored_bytes = 0;
        capacity.release(released.bytes);
        released
    }
}

/// Reserves `needed` bytes of `capacity`, or says why not.
fn reserve(capacity: &Capacity, needed: u64) -> Result<(), Full> {
    capacity.reserve_or_refuse(needed).map_err(|r| Full {
        needed,
        free: r.free,
        total: r.total,
        tenant: r.quota_of,
    })
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
    use gleaner_proto::{MAX_BLOB_SIZE, PAGE_SIZE};

    use super::*;

    const P: u64 = PAGE_SIZE as u64;

    /// A batch of `(id, blob length)` entries; each blob is filled with `id as u8 ^ len as u8`.
    fn batch(entries: &[(u64, usize)]) -> Vec<u8> {
        let mut out = Vec::new();
        PageBatch::begin(&mut out);
        for &(id, len) in entries {
            PageBatch::push_slot(&mut out, id, 0, len).fill(fill(id, len));
        }
        out
    }

    fn fill(id: u64, len: usize) -> u8 {
        id as u8 ^ len as u8
    }

    /// Writes blobs of the given lengths.
    fn write_blobs(
        store: &mut SessionPages,
        cap: &Capacity,
        entries: &[(u64, usize)],
    ) -> Result<i64, Full> {
        let raw = batch(entries);
        let mut staged = Vec::new();
        stage(&PageBatch::from_encoded(&raw), &mut staged);
        let mut replaced = Vec::new();
        let r = store
            .write(&mut staged, cap, &mut Vec::new(), &mut replaced)
            .map(|w| w.delta);
        if r.is_err() {
            assert_eq!(
                staged.len(),
                entries.len(),
                "a refused write keeps its staged blobs"
            );
            assert!(replaced.is_empty(), "a refused write replaces nothing");
        }
        r
    }

    /// Writes full pages.
    fn write(store: &mut SessionPages, cap: &Capacity, ids: &[u64]) -> Result<i64, Full> {
        let entries: Vec<(u64, usize)> = ids.iter().map(|&id| (id, PAGE_SIZE)).collect();
        write_blobs(store, cap, &entries)
    }

    fn free(store: &mut SessionPages, cap: &Capacity, ranges: &[(u64, u32)]) -> Released {
        let mut raw = Vec::new();
        PageRanges::encode_into(&mut raw, ranges);
        store.free(&PageRanges::from_encoded(&raw), cap)
    }

    /// The blob stored for `id`, read through `read_into`.
    fn read(store: &SessionPages, id: u64) -> Vec<u8> {
        let mut ids = Vec::new();
        PageIds::encode_into(&mut ids, &[id]);
        let mut out = Vec::new();
        store
            .read_into(&PageIds::from_encoded(&ids), &mut out)
            .unwrap();
        PageBatch::from_encoded(&out).get(0).2.to_vec()
    }

    /// Writes `(id, version, blob length, fill byte)` entries as one batch.
    fn write_versions(
        store: &mut SessionPages,
        cap: &Capacity,
        entries: &[(u64, u64, usize, u8)],
    ) -> Written {
        let mut raw = Vec::new();
        PageBatch::begin(&mut raw);
        for &(id, version, len, byte) in entries {
            PageBatch::push_slot(&mut raw, id, version, len).fill(byte);
        }
        let mut staged = Vec::new();
        stage(&PageBatch::from_encoded(&raw), &mut staged);
        let mut dropped = Vec::new();
        let w = store
            .write(&mut staged, cap, &mut Vec::new(), &mut dropped)
            .unwrap();
        assert!(staged.is_empty());
        w
    }

    #[test]
    fn a_quota_bounds_its_tenant_and_draws_on_the_memnode() {
        let memnode = Arc::new(Capacity::new(10 * P));
        let quota = Capacity::quota(4 * P, memnode.clone(), "t");
        assert_eq!(quota.try_reserve(3 * P), Ok(()));
        assert_eq!(
            memnode.used(),
            3 * P,
            "a quota's bytes are the memnode's too"
        );
        assert_eq!(
            quota.try_reserve(2 * P),
            Err(P),
            "only one page left in the quota"
        );
        assert_eq!(memnode.try_reserve(6 * P), Ok(()));
        assert_eq!(quota.free(), P, "the memnode has one page left too");
        assert_eq!(memnode.try_reserve(P), Ok(()));
        assert_eq!(quota.try_reserve(P), Err(0), "the memnode is full");
        assert_eq!(
            quota.used(),
            3 * P,
            "a refusal by the memnode reserves nothing here"
        );
        quota.release(3 * P);
        assert_eq!((quota.used(), memnode.used()), (0, 7 * P));
        let mut s = SessionPages::new(4);
        let mut staged = Vec::new();
        let raw = batch(&[(1, PAGE_SIZE), (2, PAGE_SIZE)]);
        stage(&PageBatch::from_encoded(&raw), &mut staged);
        memnode.release(7 * P);
        let small = Capacity::quota(P, memnode.clone(), "t");
        let full = s
            .write(&mut staged, &small, &mut Vec::new(), &mut Vec::new())
            .unwrap_err();
        assert_eq!(full.tenant.as_deref(), Some("t"));
        assert!(
            full.to_string()
                .starts_with("tenant t is at its quota: batch needs"),
            "{full}"
        );
        // The memnode's own capacity refusing is said so, even for a tenant's session.
        let busy = Arc::new(Capacity::new(10 * P));
        busy.try_reserve(9 * P).unwrap();
        let roomy = Capacity::quota(10 * P, busy, "t");
        let full = s
            .write(&mut staged, &roomy, &mut Vec::new(), &mut Vec::new())
            .unwrap_err();
        assert_eq!(full.tenant, None);
        assert!(
            full.to_string().starts_with("memnode full: batch needs"),
            "{full}"
        );
    }

    #[test]
    fn a_late_batch_never_overwrites_a_newer_version() {
        let cap = Capacity::new(100 * P);
        let mut s = SessionPages::new(9);
        // Version 5 of page 1 and version 2 of page 2 are stored.
        let w = write_versions(&mut s, &cap, &[(1, 5, 100, 0xA5), (2, 2, 300, 0xB2)]);
        assert_eq!(
            w,
            Written {
                delta: 400,
                stale: 0
            }
        );
        // A batch delivered late carries version 4 of page 1 (older: skipped, its bytes not
        // counted) and version 3 of page 2 (newer: stored).
        let w = write_versions(&mut s, &cap, &[(1, 4, 900, 0xA4), (2, 3, 200, 0xB3)]);
        assert_eq!(
            w,
            Written {
                delta: -100,
                stale: 1
            }
        );
        assert_eq!(read(&s, 1), vec![0xA5; 100]);
        assert_eq!(read(&s, 2), vec![0xB3; 200]);
        // The same version again (a batch sent twice) replaces; so does version 0 over 0.
        let w = write_versions(
            &mut s,
            &cap,
            &[(1, 5, 50, 0xA6), (3, 0, 10, 1), (3, 0, 20, 2)],
        );
        assert_eq!(
            w,
            Written {
                delta: -50 + 20,
                stale: 0
            }
        );
        assert_eq!(read(&s, 1), vec![0xA6; 50]);
        assert_eq!(read(&s, 3), vec![2; 20]);
        // Versions travel back on reads.
        let mut ids = Vec::new();
        PageIds::encode_into(&mut ids, &[2, 1]);
        let mut out = Vec::new();
        s.read_into(&PageIds::from_encoded(&ids), &mut out).unwrap();
        let versions: Vec<u64> = PageBatch::from_encoded(&out).iter().map(|e| e.1).collect();
        assert_eq!(versions, vec![3, 5]);
        assert_eq!(s.stored_bytes(), 200 + 50 + 20);
        assert_eq!(cap.used(), 200 + 50 + 20);
    }

    #[test]
    fn a_forgotten_copy_is_dropped_only_at_the_version_named() {
        let cap = Capacity::new(100 * P);
        let mut s = SessionPages::new(9);
        write_versions(&mut s, &cap, &[(1, 5, 100, 0xA5), (2, 2, 300, 0xB2)]);
        let forget = |s: &mut SessionPages, copies: &[(u64, u64)]| {
            let mut raw = Vec::new();
            PageVersions::encode_into(&mut raw, copies);
            s.forget(&PageVersions::from_encoded(&raw), &cap)
        };
        // Page 1's copy is at version 5, not 4 (written again since): it stays. Page 2's goes,
        // and page 3 was never stored.
        let r = forget(&mut s, &[(1, 4), (2, 2), (3, 0)]);
        assert_eq!((r.pages, r.bytes), (1, 300));
        assert_eq!(read(&s, 1), vec![0xA5; 100]);
        assert_eq!(s.stored_bytes(), 100);
        assert_eq!(cap.used(), 100);
        // The same forget again drops nothing more.
        let r = forget(&mut s, &[(2, 2)]);
        assert_eq!((r.pages, r.bytes), (0, 0));
        let r = forget(&mut s, &[(1, 5)]);
        assert_eq!((r.pages, r.bytes), (1, 100));
        assert_eq!((s.stored_bytes(), cap.used()), (0, 0));
    }

    #[test]
    fn capacity_counts_new_pages_once_and_refuses_overflow() {
        let cap = Capacity::new(4 * P);
        let mut s = SessionPages::new(1);
        assert_eq!(write(&mut s, &cap, &[1, 2, 2]), Ok(2 * P as i64));
        assert_eq!(write(&mut s, &cap, &[1, 2, 3]), Ok(P as i64));
        assert_eq!(cap.used(), 3 * P);
        let err = write(&mut s, &cap, &[1, 4, 5]).unwrap_err();
        assert_eq!(
            err,
            Full {
                needed: 2 * P,
                free: P,
                total: 4 * P,
                tenant: None,
            }
        );
        assert_eq!(s.len(), 3);
        assert_eq!(s.stored_bytes(), 3 * P);
        assert_eq!(cap.used(), 3 * P);
        assert_eq!(
            s.end(&cap),
            Released {
                pages: 3,
                bytes: 3 * P
            }
        );
        assert_eq!(cap.used(), 0);
        assert_eq!(s.stored_bytes(), 0);
        assert!(s.is_ended());
    }

    #[test]
    fn a_blob_occupies_its_length() {
        let cap = Capacity::new(10 * P);
        let mut s = SessionPages::new(2);
        assert_eq!(
            write_blobs(&mut s, &cap, &[(1, 1), (2, 100), (3, MAX_BLOB_SIZE)]),
            Ok(1 + 100 + MAX_BLOB_SIZE as i64)
        );
        assert_eq!(cap.used(), 1 + 100 + MAX_BLOB_SIZE as u64);
        assert_eq!(s.stored_bytes(), cap.used());
        assert_eq!(s.len(), 3);
        // Reads return each blob at its own length, byte-exact.
        assert_eq!(read(&s, 1), vec![fill(1, 1)]);
        assert_eq!(read(&s, 2), vec![fill(2, 100); 100]);
        assert_eq!(read(&s, 3), vec![fill(3, MAX_BLOB_SIZE); MAX_BLOB_SIZE]);
    }

    #[test]
    fn overwriting_with_a_smaller_blob_frees_bytes_and_a_larger_one_needs_bytes() {
        let cap = Capacity::new(1000);
        let mut s = SessionPages::new(3);
        assert_eq!(write_blobs(&mut s, &cap, &[(1, 600)]), Ok(600));
        // Smaller: the difference goes back to the pool at once.
        assert_eq!(write_blobs(&mut s, &cap, &[(1, 100)]), Ok(-500));
        assert_eq!(cap.used(), 100);
        assert_eq!(read(&s, 1).len(), 100);
        assert_eq!(write_blobs(&mut s, &cap, &[(2, 800)]), Ok(800));
        assert_eq!(cap.free(), 100);
        // Larger: only the growth is needed (200), and it does not fit in the 100 free.
        let err = write_blobs(&mut s, &cap, &[(1, 300)]).unwrap_err();
        assert_eq!(
            err,
            Full {
                needed: 200,
                free: 100,
                total: 1000,
                tenant: None,
            }
        );
        assert_eq!(
            read(&s, 1),
            vec![fill(1, 100); 100],
            "refused: nothing stored"
        );
        assert_eq!(cap.used(), 900);
        // Growth that fits.
        assert_eq!(write_blobs(&mut s, &cap, &[(1, 200)]), Ok(100));
        assert_eq!(cap.free(), 0);
        // One entry grows by 200, another shrinks by 200: the net growth (0) fits a full pool.
        assert_eq!(write_blobs(&mut s, &cap, &[(1, 400), (2, 600)]), Ok(0));
        assert_eq!((read(&s, 1).len(), read(&s, 2).len()), (400, 600));
        assert_eq!(cap.used(), 1000);
        assert_eq!(s.stored_bytes(), 1000);
        assert_eq!(
            free(&mut s, &cap, &[(2, 1)]),
            Released {
                pages: 1,
                bytes: 600
            }
        );
        assert_eq!(cap.used(), 400);
        assert_eq!(s.stored_bytes(), 400);
    }

    #[test]
    fn the_same_id_twice_in_a_batch_counts_once_and_the_last_copy_wins() {
        let cap = Capacity::new(1000);
        let mut s = SessionPages::new(4);
        // Only the last copy (200 bytes) is stored and counted.
        assert_eq!(
            write_blobs(&mut s, &cap, &[(7, 400), (7, 900), (7, 200)]),
            Ok(200)
        );
        assert_eq!(cap.used(), 200);
        assert_eq!(s.len(), 1);
        assert_eq!(read(&s, 7), vec![fill(7, 200); 200]);
        // 900 bytes would not fit in the 800 free, but the 100-byte copy replaces it.
        assert_eq!(write_blobs(&mut s, &cap, &[(8, 900), (8, 100)]), Ok(100));
        assert_eq!(cap.used(), 300);
        // In the other order the 900-byte copy is the one stored: 800 more, 700 free.
        let err = write_blobs(&mut s, &cap, &[(8, 100), (8, 900)]).unwrap_err();
        assert_eq!(
            err,
            Full {
                needed: 800,
                free: 700,
                total: 1000,
                tenant: None,
            }
        );
        assert_eq!(read(&s, 8).len(), 100);
        // Repeats of an id already stored replace it once, interleaved with other ids.
        assert_eq!(
            write_blobs(&mut s, &cap, &[(7, 50), (9, 10), (7, 60), (9, 20)]),
            Ok(60 - 200 + 20)
        );
        assert_eq!(cap.used(), 60 + 100 + 20);
        assert_eq!(s.stored_bytes(), cap.used());
        assert_eq!(
            s.end(&cap),
            Released {
                pages: 3,
                bytes: 180
            }
        );
        assert_eq!(cap.used(), 0);
    }

    /// Random batches (with repeats and overwrites) and frees against a model: the capacity's
    /// `used` always equals the sum of the stored blobs' lengths.
    #[test]
    fn used_bytes_always_equal_the_blobs_held() {
        let mut rng = gleaner_sys::rng::XorShift64::from_state(0x2545_F491_4F6C_DD1D);
        let mut next = move |n: u64| rng.below(n);
        let cap = Capacity::new(20 * P);
        let mut s = SessionPages::new(5);
        let mut model: HashMap<u64, usize> = HashMap::new();
        let (mut refused, mut stored) = (0, 0);
        for _ in 0..2000 {
            if next(8) == 0 {
                let start = next(64);
                let count = next(16) as u32;
                let r = free(&mut s, &cap, &[(start, count)]);
                let gone: Vec<u64> = model
                    .keys()
                    .copied()
                    .filter(|id| (start..start + u64::from(count)).contains(id))
                    .collect();
                let bytes: usize = gone.iter().map(|id| model.remove(id).unwrap()).sum();
                assert_eq!(
                    r,
                    Released {
                        pages: gone.len() as u64,
                        bytes: bytes as u64
                    }
                );
            } else {
                let n = 1 + next(12) as usize;
                let entries: Vec<(u64, usize)> = (0..n)
                    .map(|_| (next(64), 1 + next(MAX_BLOB_SIZE as u64) as usize))
                    .collect();
                let mut after = model.clone();
                for &(id, len) in &entries {
                    after.insert(id, len);
                }
                let before: usize = model.values().sum();
                let total: usize = after.values().sum();
                match write_blobs(&mut s, &cap, &entries) {
                    Ok(delta) => {
                        assert_eq!(delta, total as i64 - before as i64);
                        model = after;
                        stored += 1;
                    }
                    Err(full) => {
                        assert!(total as u64 > cap.total(), "{full}");
                        assert_eq!(full.needed, (total - before) as u64);
                        refused += 1;
                    }
                }
            }
            let held: usize = model.values().sum();
            assert_eq!(cap.used(), held as u64);
            assert_eq!(s.stored_bytes(), held as u64);
            assert_eq!(s.len(), model.len());
        }
        assert!(
            refused > 10 && stored > 100,
            "{refused} refused, {stored} stored"
        );
        for (&id, &len) in &model {
            assert_eq!(read(&s, id), vec![fill(id, len); len]);
        }
    }

    #[test]
    fn full_speaks_in_bytes() {
        let full = Full {
            needed: 8200,
            free: 4096,
            total: 1 << 20,
            tenant: None,
        };
        assert_eq!(
            full.to_string(),
            "memnode full: batch needs 8200 more bytes, 4096 of 1048576 free \
             (4.00 KiB of 1.00 MiB)"
        );
    }

    #[test]
    fn free_handles_huge_and_overlapping_ranges() {
        let cap = Capacity::new(100 * P);
        let mut s = SessionPages::new(7);
        write(&mut s, &cap, &[0, 1, 2, 10, 11, u64::MAX - 1, u64::MAX]).unwrap();
        let pages = |n: u64| Released {
            pages: n,
            bytes: n * P,
        };
        assert_eq!(free(&mut s, &cap, &[(1, 2)]), pages(2));
        assert_eq!(free(&mut s, &cap, &[(u64::MAX - 1, u32::MAX)]), pages(2));
        assert_eq!(
            free(&mut s, &cap, &[(5, u32::MAX), (9, 3), (0, 0)]),
            pages(2)
        );
        assert_eq!(s.len(), 1);
        assert_eq!(cap.used(), P);
        assert_eq!(free(&mut s, &cap, &[(0, 1)]), pages(1));
        assert_eq!(cap.used(), 0);
        assert_eq!(s.stored_bytes(), 0);
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
        let cap = Capacity::new(100 * P);
        let mut s = SessionPages::new(3);
        write(&mut s, &cap, &[1, 2]).unwrap();
        let mut ids = Vec::new();
        PageIds::encode_into(&mut ids, &[2, 1]);
        let mut out = Vec::new();
        s.read_into(&PageIds::from_encoded(&ids), &mut out).unwrap();
        let b = PageBatch::from_encoded(&out);
        assert_eq!(b.get(0).0, 2);
        assert_eq!(b.get(0).2, &[fill(2, PAGE_SIZE); PAGE_SIZE][..]);
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
