//! The shared-memory store: for a memnode on this host. The memnode grants the session slabs
//! (sealed memfds passed over the Unix socket); this client maps them side by side into one
//! reserved range, the far arena ([`Arena`]), and keeps its own index of where each page's blob
//! lives. Fetching a page is then a decode straight out of the arena, and writing one back an
//! encode into a place the client allocates ([`Blobs`]): no request and no memnode wake-up on the
//! data path. The socket carries only grants and the session's end.
//!
//! # Blobs
//!
//! Pages are stored as the codec's blobs (compressed, sealed: see `codec/mod.rs`; the codec layer,
//! `store/coded.rs`, makes them and opens them), packed by size class, so the memory the host
//! spends on far pages follows their compressed size. A page made of one repeated word is not
//! stored at all: its index entry marks it, and the codec layer's table keeps the word. Only the thread that
//! owns a page (the page-state table's owned states: FETCHING, PREFETCHING, EVICTING,
//! DISCARDING) reads or writes its index entry or its blob, so neither needs a lock; the state
//! table's compare-and-swap orders them. The allocator and the grants sit behind one mutex,
//! taken once per write-back batch.
//!
//! # Fork
//!
//! A fork child inherits the arena (the parent's slabs, mapped shared) and a copy of the index:
//! together, a snapshot of the parent's far pages at the fork. [`ShmStore::hold_for_child`]
//! makes the parent keep every blob it frees from then on (its pages rewritten elsewhere, dropped
//! or discarded) until the child has exited or exec'd, so the snapshot stays intact without a
//! copy; [`ShmStore::fork_child`] gives the child a store of its own on that snapshot: it reads
//! the parent's blobs in place (opening them with the parent's key), never writes or frees
//! anything below the parent's last slab, and places the blobs it writes in slabs granted to a
//! session of its own, mapped after the parent's.
//!
//! # Failure
//!
//! The memnode never maps a slab; once granted, the memory is the client's to use until the
//! session ends. If the memnode dies, the slabs stay mapped here, so every page already written
//! stays readable; the first write-back that needs a new grant then fails and the program stops
//! with exit 86 naming the memnode. A full memnode refuses the grant: the batch is undone like a
//! refused socket write. Whatever reads the slabs (the memnode, anyone it gives them to) sees only
//! sealed blobs, and a blob changed behind the client's back fails authentication on its next
//! fetch: exit 86, never wrong data.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use gleaner_proto::ErrorCode;

use super::arena::Arena;
use super::blobs::{Blobs, Loc, MAX_CHUNK_PAGES};
use super::socket::{LazySession, MemnodeSession};
use super::{zeroed_atomics, BlobHandle, BlobStore, FarCopy, StoreError, StoreStats};
use crate::codec::{Encoded, ENCODE_ROOM, MAX_BLOB_LEN};
use crate::{PagerError, PAGE_SIZE};

/// The first grant asks for this many pages (64 MiB); later ones for half of what the session
/// already holds, at most [`MAX_GRANT_PAGES`].
const FIRST_GRANT_PAGES: u64 = 16 * 1024;
/// The largest grant asked for (1 GiB).
const MAX_GRANT_PAGES: u64 = 256 * 1024;

/// The far arena's size, in pages, for a region of `region_pages`: twice the region, and room
/// for two grants beside.
pub(crate) fn far_arena_pages(region_pages: usize) -> usize {
    region_pages * 2 + 2 * grant_cap(region_pages as u64) as usize
}

/// The largest grant a region of `region_pages` asks for: [`MAX_GRANT_PAGES`], or the region's
/// size where that is smaller (but never below [`FIRST_GRANT_PAGES`]).
fn grant_cap(region_pages: u64) -> u64 {
    MAX_GRANT_PAGES.min(region_pages.max(FIRST_GRANT_PAGES))
}

/// An index entry: 0 when the page has no far copy, [`SAME_FILLED`] when its far copy is one
/// repeated word (kept in the codec layer's table: `store/coded.rs`), else `offset << 16 | len`
/// of its blob.
const SAME_FILLED: u64 = u64::MAX;

fn pack(loc: Loc) -> u64 {
    debug_assert!(loc.offset < 1 << 47 && loc.len > 0 && loc.len < 1 << 16);
    loc.offset << 16 | u64::from(loc.len)
}

fn unpack(e: u64) -> Loc {
    Loc {
        offset: e >> 16,
        len: (e & 0xffff) as u32,
    }
}

/// The store (a clone is the same store).
#[derive(Clone)]
pub(crate) struct ShmStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// Opened at the first grant in a fork child's store ([`LazySession`]).
    session: LazySession,
    /// The reserved range the slabs are mapped into (shared with a fork child's store, in the
    /// child).
    arena: Arc<Arena>,
    /// Per region page: its index entry (see [`SAME_FILLED`]).
    loc: Arc<Box<[AtomicU64]>>,
    /// In a fork child: the bytes of arena below which blobs are the parent's snapshot; 0
    /// otherwise (see [`Space::snapshot_bytes`]).
    snapshot_bytes: u64,
    /// `Space::granted`, readable without the lock: a fork child reads it, and the lock may
    /// have been held by a thread of the parent (the status publisher's) at the fork.
    granted: AtomicU64,
    /// Pages with a far copy.
    stored: AtomicU64,
    /// Far copies dropped when their pages were fetched.
    dropped: AtomicU64,
    /// Their blobs, until the next `free` gives them back.
    forgotten: Mutex<Vec<Loc>>,
    space: Mutex<Space>,
    grants_refused: AtomicU64,
}

/// The allocator and the slabs behind it.
struct Space {
    blobs: Blobs,
    /// Pages granted (mapped) so far.
    granted: u64,
    /// The slabs, in arena order: (first page, pages). Their memfds are closed once mapped
    /// (freed pages are punched out through the mapping): a store holds no descriptor per
    /// slab, where a program may need every one it is allowed.
    slabs: Vec<(u64, u64)>,
    /// Where the slabs are mapped.
    arena: Arc<Arena>,
    /// One read end per fork child that may still read this store's blobs: it reports the end
    /// of file once the child has exited or exec'd.
    children: Vec<OwnedFd>,
    /// Blobs freed while a child holds the snapshot: given back once none does.
    held: Vec<Loc>,
    /// In a fork child: the bytes of arena below which blobs are the parent's snapshot (read
    /// only, never freed here); 0 otherwise.
    snapshot_bytes: u64,
}

impl ShmStore {
    /// A store over `session` for a region of `region_pages` pages.
    pub(crate) fn new(
        session: MemnodeSession,
        region_pages: usize,
    ) -> Result<ShmStore, PagerError> {
        // Blobs of incompressible pages are a little larger than a page and each chunk size
        // keeps its own released pages: twice the region's size in address space (nothing is
        // committed) is room enough, and two grants beside (a grant asks for no more than a
        // small region's size, so a small region, sized to the process's address-space limit,
        // leaves the program room: `far_arena_pages`).
        let arena = Arc::new(
            Arena::reserve(far_arena_pages(region_pages) * PAGE_SIZE).map_err(|source| {
                PagerError::Os {
                    op: "reserving the far arena",
                    source,
                }
            })?,
        );
        Ok(ShmStore {
            inner: Arc::new(Inner {
                session: LazySession::opened(session),
                arena: arena.clone(),
                loc: Arc::new(zeroed_atomics(region_pages)),
                snapshot_bytes: 0,
                granted: AtomicU64::new(0),
                stored: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
                forgotten: Mutex::new(Vec::new()),
                space: Mutex::new(Space {
                    blobs: Blobs::new(MAX_BLOB_LEN),
                    granted: 0,
                    slabs: Vec::new(),
                    arena,
                    children: Vec::new(),
                    held: Vec::new(),
                    snapshot_bytes: 0,
                }),
                grants_refused: AtomicU64::new(0),
            }),
        })
    }

    /// In a fork child (its only thread, before the program goes on): this store's twin for the
    /// child, on the snapshot the fork left it (see the module's notes), with a session of its
    /// own named `client_name` for the blobs it writes.
    pub(crate) fn fork_child(&self, client_name: &str) -> Result<ShmStore, PagerError> {
        let parent = &*self.inner;
        // Opened at its first grant: a child that execs or exits first never needs it.
        let session = parent.session.deferred_another(client_name);
        // The parent's allocator (and its lock, which a vanished thread may hold) is a copy of
        // its state at the fork and stays unused: the parent goes on allocating in its own
        // slabs, which this process must never write.
        let granted = parent.granted.load(Ordering::Acquire);
        let snapshot_bytes = granted * PAGE_SIZE as u64;
        Ok(ShmStore {
            inner: Arc::new(Inner {
                session,
                arena: parent.arena.clone(),
                loc: parent.loc.clone(),
                snapshot_bytes,
                granted: AtomicU64::new(granted),
                stored: AtomicU64::new(parent.stored.load(Ordering::Relaxed)),
                dropped: AtomicU64::new(0),
                forgotten: Mutex::new(Vec::new()),
                space: Mutex::new(Space {
                    blobs: Blobs::above(MAX_BLOB_LEN, granted),
                    granted,
                    slabs: Vec::new(),
                    arena: parent.arena.clone(),
                    children: Vec::new(),
                    held: Vec::new(),
                    snapshot_bytes,
                }),
                grants_refused: AtomicU64::new(0),
            }),
        })
    }
}

impl BlobStore for ShmStore {
    fn handle(&self) -> Result<Box<dyn BlobHandle>, PagerError> {
        Ok(Box::new(ShmHandle {
            inner: self.inner.clone(),
            pending: Vec::new(),
            staged: Vec::new(),
            batch: Vec::new(),
            batch_used: 0,
            placed: Vec::new(),
        }))
    }

    fn release(&self, ranges: &[(u64, u32)]) {
        let inner = &self.inner;
        let mut freed = Vec::new();
        let mut dropped = 0;
        for &(first, count) in ranges {
            for page in first..first + u64::from(count) {
                let Some(entry) = inner.loc.get(page as usize) else {
                    continue;
                };
                match entry.swap(0, Ordering::Relaxed) {
                    0 => continue,
                    SAME_FILLED => {}
                    e => freed.push(unpack(e)),
                }
                dropped += 1;
            }
        }
        inner.stored.fetch_sub(dropped, Ordering::Relaxed);
        inner.free(&freed);
    }

    fn forget(&self, page: u64) {
        let inner = &*self.inner;
        let Some(entry) = inner.loc.get(page as usize) else {
            return;
        };
        let e = entry.load(Ordering::Relaxed);
        if e != SAME_FILLED && e != 0 && unpack(e).offset < inner.snapshot_bytes {
            // A fork child keeps the far copies of its snapshot: dropping one frees nothing
            // (the parent holds it), and the page would have to be written back again.
            return;
        }
        let old = entry.swap(0, Ordering::Relaxed);
        match old {
            0 => return,
            SAME_FILLED => {}
            // Freed by the next write-back or release (off the fault path, which calls this).
            e => inner
                .forgotten
                .lock()
                .expect("forgotten lock")
                .push(unpack(e)),
        }
        inner.stored.fetch_sub(1, Ordering::Relaxed);
        inner.dropped.fetch_add(1, Ordering::Relaxed);
    }

    fn close(&self) {
        self.inner.session.close();
    }

    fn can_share_with_child(&self) -> bool {
        true
    }

    fn hold_for_child(&self, alive: OwnedFd) -> Result<(), StoreError> {
        self.inner
            .space
            .lock()
            .expect("space lock")
            .children
            .push(alive);
        Ok(())
    }

    fn fork_child(&self, client_name: &str) -> Result<Box<dyn BlobStore>, PagerError> {
        Ok(Box::new(ShmStore::fork_child(self, client_name)?))
    }

    fn describe(&self) -> String {
        self.inner.session.endpoint().to_string()
    }

    fn capacity_pages(&self) -> u64 {
        self.inner.session.capacity_pages()
    }

    fn stats(&self) -> StoreStats {
        let space = self.inner.space.lock().expect("space lock");
        StoreStats {
            data_path: "shm",
            slabs: space.slabs.len() as u64,
            slab_pages: space.granted,
            pages_stored: self.inner.stored.load(Ordering::Relaxed),
            copies_dropped: self.inner.dropped.load(Ordering::Relaxed),
            resident_bytes: space.blobs.resident_pages() * PAGE_SIZE as u64,
            peak_resident_bytes: space.blobs.peak_resident_pages() * PAGE_SIZE as u64,
            blob_bytes_at_peak: space.blobs.blob_bytes_at_peak(),
            blobs_at_peak: space.blobs.blobs_at_peak(),
            blob_bytes: space.blobs.blob_bytes(),
            pages_punched: space.blobs.punched_pages(),
            pages_fresh: space.blobs.fresh_pages(),
            grants_refused: self.inner.grants_refused.load(Ordering::Relaxed),
            blobs_held_for_children: space.held.len() as u64,
            reconnects: 0,
            pool: None,
            codec: Default::default(),
        }
    }
}

impl Inner {
    /// Gives blobs back, punching the pages no live blob reaches any more out of their slabs
    /// (under the lock, so nothing is placed there before they are punched), and the blobs of
    /// far copies dropped since the last call with them.
    fn free(&self, locs: &[Loc]) {
        let forgotten = std::mem::take(&mut *self.forgotten.lock().expect("forgotten lock"));
        let mut space = self.space.lock().expect("space lock");
        space.free(locs.iter().chain(&forgotten).copied());
    }

    /// Places blobs of `lens` bytes, asking the memnode for more memory as needed; all or
    /// nothing.
    fn place(
        &self,
        lens: impl Iterator<Item = usize>,
        out: &mut Vec<Loc>,
    ) -> Result<(), StoreError> {
        out.clear();
        let mut space = self.space.lock().expect("space lock");
        for len in lens {
            let l = loop {
                match space.blobs.alloc(len) {
                    Ok(l) => break l,
                    Err(_) => {
                        if let Err(e) = self.grant(&mut space) {
                            space.free(out.drain(..));
                            return Err(e);
                        }
                    }
                }
            };
            out.push(l);
        }
        Ok(())
    }

    /// Asks the memnode for one more slab and maps it after the others.
    fn grant(&self, space: &mut Space) -> Result<(), StoreError> {
        let room = self.arena.pages() - space.granted;
        if room < MAX_CHUNK_PAGES {
            return Err(StoreError::Lost(
                "the far arena is out of address space (blobs fragmented beyond twice the \
                 region's size)"
                    .into(),
            ));
        }
        let want = (space.granted / 2)
            .clamp(FIRST_GRANT_PAGES, grant_cap(self.loc.len() as u64))
            .min(room);
        let session = self.session.get().map_err(|e| {
            StoreError::Lost(format!(
                "opening this fork child's session on memnode {} failed ({e}); it may have \
                 stopped",
                self.session.endpoint()
            ))
        })?;
        // The grant makes room for the socket's clone and the slab's memfd itself, each just
        // before it is made (`Connection::grant`).
        let reply = session
            .with_control(|conn| conn.grant(want))
            .ok_or_else(|| StoreError::Lost("the memnode session is closed".into()))?;
        let g = match reply {
            Ok(g) => g,
            Err(e) if e.server_code() == Some(ErrorCode::Full) => {
                self.grants_refused.fetch_add(1, Ordering::Relaxed);
                return Err(StoreError::Full(e.to_string()));
            }
            Err(e) => {
                return Err(StoreError::Lost(format!(
                    "asking memnode {} for shared memory failed ({e}); it may have stopped",
                    self.session.endpoint()
                )))
            }
        };
        if g.pages == 0 || g.pages > room {
            return Err(StoreError::Lost(format!(
                "the memnode granted {} pages where 1 to {room} fit",
                g.pages
            )));
        }
        // The mapping keeps the slab; its descriptor closes here.
        self.arena
            .map_slab(space.granted, g.pages, &g.memfd)
            .map_err(|e| StoreError::Lost(format!("mapping a granted slab: {e}")))?;
        space.slabs.push((space.granted, g.pages));
        space.granted += g.pages;
        let granted = space.granted;
        self.granted.store(granted, Ordering::Release);
        space.blobs.set_granted(granted);
        Ok(())
    }
}

impl Space {
    /// Gives blobs back to the allocator and, once enough have gathered, punches the pages no
    /// live blob reaches any more out of their slabs (under the caller's lock, so nothing is
    /// placed there before they are).
    /// While a fork child may still read them, they are held instead; a fork child never frees
    /// its parent's.
    fn free(&mut self, locs: impl Iterator<Item = Loc>) {
        let snapshot = self.snapshot_bytes;
        let locs = locs.filter(|l| l.offset >= snapshot);
        if self.children_alive() {
            self.held.extend(locs);
            return;
        }
        let mut punch = Vec::new();
        let held = std::mem::take(&mut self.held);
        for l in locs.chain(held) {
            self.blobs.free(l);
        }
        // Freed pages wait as slack (up to a sixty-fourth of what blobs reach, at most 256
        // pages: none once nothing is stored) for the next blobs before they are punched:
        // `blobs.rs`.
        let max_slack = (self.blobs.reached_pages() / 64).min(256);
        self.blobs.take_punch(max_slack, &mut punch);
        for (first, count) in crate::runs::runs(punch.iter().map(|&p| p as usize)) {
            punch_pages(&self.arena, &self.slabs, first as u64, count as u64);
        }
    }
}

impl Space {
    /// Whether a fork child may still read the blobs: forgets the children that have exited or
    /// exec'd (their end of the pipe is closed).
    fn children_alive(&mut self) -> bool {
        self.children.retain(|fd| {
            let mut p = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll on one valid descriptor, without waiting.
            let r = unsafe { libc::poll(&mut p, 1, 0) };
            // Nothing is ever written to the pipe: any event (the end of file) means gone.
            !(r > 0 && p.revents != 0)
        });
        !self.children.is_empty()
    }
}

/// Punches arena pages `first..first+pages` out of the slabs holding them.
fn punch_pages(arena: &Arena, slabs: &[(u64, u64)], first: u64, pages: u64) {
    let end = first + pages;
    for &(start, len) in slabs {
        let (a, b) = (first.max(start), end.min(start + len));
        if a < b {
            if let Err(e) = arena.punch(a, b - a) {
                // The data is safe either way; what is lost is memory the memnode's host keeps
                // holding until the session ends.
                static SAID: AtomicBool = AtomicBool::new(false);
                if !SAID.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "freed far memory could not be handed back to the memnode's host \
                         (punching it out of a shared-memory slab: {e}); it stays allocated \
                         until this process ends (said once)"
                    );
                }
            }
        }
    }
}

/// A page staged for write-back.
enum Staged {
    /// One repeated word (the codec layer keeps it): nothing stored.
    Same,
    /// A blob at `start..start+len` of the handle's batch buffer.
    Blob { start: usize, len: usize },
}

/// One thread's access: no connection, only the shared index and arena.
struct ShmHandle {
    inner: Arc<Inner>,
    /// The pages of the last request.
    pending: Vec<u64>,
    /// The pages staged since the last commit, in order, with their blobs in
    /// `batch[..batch_used]` (the buffer keeps its length between batches).
    staged: Vec<(u64, Staged)>,
    batch: Vec<u8>,
    batch_used: usize,
    /// Scratch: the places of a commit's blobs.
    placed: Vec<Loc>,
}

impl ShmHandle {
    /// The far copy of `page` (which the caller owns), read in place.
    fn copy_of(&self, page: u64) -> Result<FarCopy<'_>, StoreError> {
        let inner = &*self.inner;
        match inner
            .loc
            .get(page as usize)
            .map_or(0, |e| e.load(Ordering::Relaxed))
        {
            0 => Err(StoreError::Lost(format!(
                "page {page} has no far copy in the shared-memory store"
            ))),
            SAME_FILLED => Ok(FarCopy::Word),
            entry => {
                let l = unpack(entry);
                // SAFETY: the blob lies in a mapped slab (the allocator places blobs only in
                // granted pages). The caller owns the page, so no thread of this client writes
                // the blob meanwhile; what the memnode might do to the bytes is what the
                // codec's authentication is for.
                Ok(FarCopy::Blob(unsafe {
                    inner.arena.bytes(l.offset, l.len as usize)
                }))
            }
        }
    }
}

impl BlobHandle for ShmHandle {
    fn request(&mut self, pages: &[u64]) -> Result<(), StoreError> {
        self.pending.clear();
        self.pending.extend_from_slice(pages);
        Ok(())
    }

    fn receive(
        &mut self,
        f: &mut dyn FnMut(usize, u64, FarCopy<'_>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        for (i, &page) in self.pending.iter().enumerate() {
            f(i, page, self.copy_of(page)?)?;
        }
        Ok(())
    }

    fn reserve(&mut self, _pages: &[u64]) -> Result<(), StoreError> {
        // Blob sizes are known only once the pages are encoded: room is found at commit, which
        // undoes the whole batch when the memnode has none.
        Ok(())
    }

    fn keeps_words(&self) -> bool {
        true
    }

    fn begin_stage(&mut self) {
        self.staged.clear();
        self.batch_used = 0;
    }

    fn room(&mut self) -> &mut [u8] {
        // The codec writes the blob straight into the batch: room for the largest blob at its
        // end, zeroed once (the buffer keeps its length between batches).
        let start = self.batch_used;
        if self.batch.len() < start + ENCODE_ROOM {
            self.batch.resize(start + ENCODE_ROOM, 0);
        }
        &mut self.batch[start..]
    }

    fn push(&mut self, page: u64, copy: Encoded) -> Result<(), StoreError> {
        let staged = match copy {
            Encoded::Word(_) => Staged::Same,
            Encoded::Blob { len, .. } => {
                let start = self.batch_used;
                self.batch_used += len;
                Staged::Blob { start, len }
            }
        };
        self.staged.push((page, staged));
        Ok(())
    }

    fn commit_watching(&mut self, _bell: Option<super::Bell<'_>>) -> Result<(), StoreError> {
        // Nothing to wait for: the bell is not watched.
        let inner = &*self.inner;
        let lens = self.staged.iter().filter_map(|(_, s)| match s {
            Staged::Blob { len, .. } => Some(*len),
            Staged::Same => None,
        });
        let placed = inner.place(lens, &mut self.placed);
        if let Err(e) = placed {
            self.staged.clear();
            self.batch_used = 0;
            return Err(e);
        }
        let mut places = self.placed.iter();
        let mut freed = Vec::new();
        let mut added = 0;
        for (page, s) in self.staged.drain(..) {
            let entry = match s {
                Staged::Same => SAME_FILLED,
                Staged::Blob { start, len } => {
                    let l = *places.next().expect("one place per blob");
                    // SAFETY: a place just allocated in a mapped slab, for this page only,
                    // which this thread owns (it is being evicted).
                    let dst = unsafe { inner.arena.bytes_mut(l.offset, len) };
                    dst.copy_from_slice(&self.batch[start..start + len]);
                    pack(l)
                }
            };
            match inner.loc[page as usize].swap(entry, Ordering::Relaxed) {
                0 => added += 1,
                SAME_FILLED => {}
                old => freed.push(unpack(old)),
            }
        }
        self.batch_used = 0;
        inner.stored.fetch_add(added, Ordering::Relaxed);
        // Also gives back the blobs of far copies dropped since the last batch.
        inner.free(&freed);
        Ok(())
    }

    fn far_copy(&mut self, page: u64) -> Option<FarCopy<'_>> {
        // None for no far copy: a blob that cannot be read is the codec layer's to judge.
        self.copy_of(page).ok()
    }

    fn has_far_copy(&self, page: u64) -> bool {
        self.inner
            .loc
            .get(page as usize)
            .is_some_and(|e| e.load(Ordering::Relaxed) != 0)
    }
}

/// Ways to play a dishonest memnode in tests: each changes the slab memory the memnode shares.
#[cfg(test)]
impl ShmStore {
    fn blob_of(&self, page: u64) -> Loc {
        unpack(self.inner.loc[page as usize].load(Ordering::Relaxed))
    }

    /// Flips one bit in the middle of `page`'s blob.
    pub(crate) fn tamper_flip(&self, page: u64) {
        let l = self.blob_of(page);
        // SAFETY: a live blob in a mapped slab; the test owns every page.
        unsafe { self.inner.arena.bytes_mut(l.offset, l.len as usize)[l.len as usize / 2] ^= 4 };
    }

    /// Makes `page`'s blob a copy of `other`'s.
    pub(crate) fn tamper_swap(&self, page: u64, other: u64) {
        let (a, b) = (self.blob_of(page), self.blob_of(other));
        let theirs = self.tamper_save(other);
        assert_eq!(a.len, b.len, "pages of one length, for a swap in place");
        // SAFETY: as above.
        unsafe { self.inner.arena.bytes_mut(a.offset, a.len as usize) }.copy_from_slice(&theirs);
    }

    /// A copy of `page`'s blob as it is now.
    pub(crate) fn tamper_save(&self, page: u64) -> Vec<u8> {
        let l = self.blob_of(page);
        // SAFETY: as above.
        unsafe { self.inner.arena.bytes(l.offset, l.len as usize) }.to_vec()
    }

    /// Puts an older blob (of the same length) back where `page`'s blob is now.
    pub(crate) fn tamper_restore(&self, page: u64, old: Vec<u8>) {
        let l = self.blob_of(page);
        assert_eq!(
            l.len as usize,
            old.len(),
            "versions of one length, for a replay in place"
        );
        // SAFETY: as above.
        unsafe { self.inner.arena.bytes_mut(l.offset, l.len as usize) }.copy_from_slice(&old);
    }
}
