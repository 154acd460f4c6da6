//! The shared-memory store: for a memnode on this host. The memnode grants the session slabs
//! (sealed memfds passed over the Unix socket); this client maps them side by side into one
//! reserved range, the *far arena*, and keeps its own index from page to slot. Fetching a page is
//! then a `UFFDIO_COPY` straight out of the arena, and writing one back a copy into its slot: no
//! request and no memnode wake-up on the data path. The socket carries only grants and the
//! session's end.
//!
//! # Slots
//!
//! Slot `s` is the 4 KiB at `arena + s * PAGE_SIZE`. A page keeps its slot from its first
//! write-back until the program discards it, so a clean page is evicted with no copy at all and
//! a dirty one is rewritten in place. Only the thread that owns a page (the page-state table's
//! owned states: FETCHING, PREFETCHING, EVICTING, DISCARDING) reads or writes its slot or its
//! index entry, so neither needs a lock; the state table's compare-and-swap orders them. Free
//! slots and grants sit behind one mutex, taken once per write-back batch.
//!
//! # Failure
//!
//! The memnode never maps a slab; once granted, the memory is the client's to use until the
//! session ends. If the memnode dies, the slabs stay mapped here, so every page already written
//! stays readable; the first write-back that needs a new grant then fails and the program stops
//! with exit 86 naming the memnode. A full memnode refuses the grant: the batch is undone like a
//! refused socket write.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use gleaner_proto::ErrorCode;

use super::socket::Session;
use super::{PageStore, StoreError, StoreHandle, StoreStats};
use crate::{PagerError, PAGE_SIZE};

/// The first grant asks for this many pages (64 MiB); later ones for half of what the session
/// already holds, at most [`MAX_GRANT_PAGES`].
const FIRST_GRANT_PAGES: u64 = 16 * 1024;
/// The largest grant asked for (1 GiB).
const MAX_GRANT_PAGES: u64 = 256 * 1024;

/// The store.
pub(crate) struct ShmStore {
    inner: Arc<Inner>,
}

struct Inner {
    session: Session,
    /// The reserved range the slabs are mapped into, one slot per page of the region at most.
    arena: Arena,
    /// Per region page: its slot plus one, or 0 when it has none.
    slot_of: Box<[AtomicU32]>,
    slots: Mutex<Slots>,
    grants_refused: AtomicU64,
}

/// Free slots and the slabs behind them.
struct Slots {
    /// Slots given back by discards, reused first.
    free: Vec<u32>,
    /// Slots below this were handed out at least once.
    next: u32,
    /// Slots granted (mapped) so far.
    granted: u32,
    /// The slabs, in slot order: (first slot, pages, memfd).
    slabs: Vec<(u32, u32, OwnedFd)>,
}

impl ShmStore {
    /// A store over `session` for a region of `region_pages` pages.
    pub(crate) fn new(session: Session, region_pages: usize) -> Result<ShmStore, PagerError> {
        let slots = u32::try_from(region_pages).map_err(|_| {
            PagerError::Config(format!(
                "a region of {region_pages} pages is too large for the shared-memory store \
                 (at most {} pages)",
                u32::MAX
            ))
        })?;
        let arena =
            Arena::reserve(slots as usize * PAGE_SIZE).map_err(|source| PagerError::Os {
                op: "reserving the far arena",
                source,
            })?;
        let slot_of = Box::<[AtomicU32]>::new_zeroed_slice(region_pages);
        // SAFETY: an all-zero u32 is a valid AtomicU32 holding 0 ("no slot").
        let slot_of = unsafe { slot_of.assume_init() };
        Ok(ShmStore {
            inner: Arc::new(Inner {
                session,
                arena,
                slot_of,
                slots: Mutex::new(Slots {
                    free: Vec::new(),
                    next: 0,
                    granted: 0,
                    slabs: Vec::new(),
                }),
                grants_refused: AtomicU64::new(0),
            }),
        })
    }
}

impl PageStore for ShmStore {
    fn handle(&self) -> Result<Box<dyn StoreHandle>, PagerError> {
        Ok(Box::new(ShmHandle {
            inner: self.inner.clone(),
            pending: Vec::new(),
            spare: Vec::new(),
        }))
    }

    fn release(&self, ranges: &[(u64, u32)]) {
        let inner = &self.inner;
        let mut freed = Vec::new();
        for &(first, count) in ranges {
            for page in first..first + u64::from(count) {
                let Some(entry) = inner.slot_of.get(page as usize) else {
                    continue;
                };
                let s = entry.swap(0, Ordering::Relaxed);
                if s != 0 {
                    freed.push(s - 1);
                }
            }
        }
        if freed.is_empty() {
            return;
        }
        freed.sort_unstable();
        let mut slots = inner.slots.lock().expect("slot lock");
        // Give the memory back: punch the freed slots out of their slabs, one call per run.
        for (start, len) in crate::evict::runs(freed.iter().map(|&s| s as usize)) {
            punch(&slots.slabs, start as u32, len as u32);
        }
        slots.free.extend_from_slice(&freed);
    }

    fn close(&self) {
        self.inner.session.close();
    }

    fn describe(&self) -> String {
        self.inner.session.endpoint().to_string()
    }

    fn capacity_pages(&self) -> u64 {
        self.inner.session.capacity_pages()
    }

    fn stats(&self) -> StoreStats {
        let slots = self.inner.slots.lock().expect("slot lock");
        StoreStats {
            data_path: "shm",
            slabs: slots.slabs.len() as u64,
            slab_pages: u64::from(slots.granted),
            slots_used: u64::from(slots.next) - slots.free.len() as u64,
            grants_refused: self.inner.grants_refused.load(Ordering::Relaxed),
        }
    }
}

/// Punches slots `start..start+len` (a run of consecutive slots) out of the slabs holding them.
fn punch(slabs: &[(u32, u32, OwnedFd)], start: u32, len: u32) {
    let end = start + len;
    for (first, pages, fd) in slabs {
        let (a, b) = (start.max(*first), end.min(first + pages));
        if a >= b {
            continue;
        }
        let r = rustix::fs::fallocate(
            fd.as_fd(),
            rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
            u64::from(a - first) * PAGE_SIZE as u64,
            u64::from(b - a) * PAGE_SIZE as u64,
        );
        if let Err(e) = r {
            log::debug!("punching freed slots out of a slab: {e}");
        }
    }
}

impl Inner {
    /// The slot of `page`, if it has one.
    fn slot(&self, page: u64) -> Option<u32> {
        match self.slot_of.get(page as usize)?.load(Ordering::Relaxed) {
            0 => None,
            s => Some(s - 1),
        }
    }

    /// Takes `n` free slots into `out`, asking the memnode for more when none are left. On
    /// failure nothing is taken.
    fn take_slots(&self, n: usize, out: &mut Vec<u32>) -> Result<(), StoreError> {
        let mut slots = self.slots.lock().expect("slot lock");
        let start = out.len();
        while out.len() - start < n {
            if let Some(s) = slots.free.pop() {
                out.push(s);
            } else if slots.next < slots.granted {
                out.push(slots.next);
                slots.next += 1;
            } else if let Err(e) = self.grant(&mut slots) {
                slots.free.extend(out.drain(start..));
                return Err(e);
            }
        }
        Ok(())
    }

    /// Asks the memnode for one more slab and maps it after the others.
    fn grant(&self, slots: &mut Slots) -> Result<(), StoreError> {
        let room = self.arena.len / PAGE_SIZE - slots.granted as usize;
        if room == 0 {
            // Cannot happen: a region never needs more slots than it has pages.
            return Err(StoreError::Lost(
                "the far arena is full although every page has at most one slot".into(),
            ));
        }
        let want = (u64::from(slots.granted) / 2)
            .clamp(FIRST_GRANT_PAGES, MAX_GRANT_PAGES)
            .min(room as u64);
        let reply = self
            .session
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
        let pages = u32::try_from(g.pages)
            .ok()
            .filter(|&p| p as usize <= room)
            .ok_or_else(|| {
                StoreError::Lost(format!(
                    "the memnode granted {} pages where at most {room} fit",
                    g.pages
                ))
            })?;
        self.arena
            .map_slab(slots.granted as usize, pages as usize, &g.memfd)
            .map_err(|e| StoreError::Lost(format!("mapping a granted slab: {e}")))?;
        slots.slabs.push((slots.granted, pages, g.memfd));
        slots.granted += pages;
        Ok(())
    }
}

/// One thread's access: no connection, only the shared index and arena.
struct ShmHandle {
    inner: Arc<Inner>,
    /// The pages of the last request.
    pending: Vec<u64>,
    /// Slots set aside by `reserve` for pages that have none yet.
    spare: Vec<u32>,
}

impl StoreHandle for ShmHandle {
    fn request(&mut self, pages: &[u64]) -> Result<(), StoreError> {
        self.pending.clear();
        self.pending.extend_from_slice(pages);
        Ok(())
    }

    fn receive(&mut self, f: &mut dyn FnMut(usize, &[u8])) -> Result<(), StoreError> {
        for (i, &page) in self.pending.iter().enumerate() {
            let slot = self.inner.slot(page).ok_or_else(|| {
                StoreError::Lost(format!(
                    "page {page} has no slot in the shared-memory store"
                ))
            })?;
            // SAFETY: the slot lies in a mapped slab (slots are handed out only below
            // `granted`). The caller owns the page, so no thread writes this slot meanwhile, and
            // the memnode never maps slabs: the bytes are stable while the reference lives.
            let data = unsafe { self.inner.arena.slot(slot) };
            f(i, data);
        }
        Ok(())
    }

    fn reserve(&mut self, pages: &[u64]) -> Result<(), StoreError> {
        let inner = &*self.inner;
        let need = pages.iter().filter(|&&p| inner.slot(p).is_none()).count();
        if need > self.spare.len() {
            inner.take_slots(need - self.spare.len(), &mut self.spare)?;
        }
        Ok(())
    }

    fn stage(
        &mut self,
        pages: &[u64],
        fill: &mut dyn FnMut(usize, &mut [u8]) -> io::Result<()>,
    ) -> Result<(), StoreError> {
        let inner = &*self.inner;
        for (i, &page) in pages.iter().enumerate() {
            let slot = match inner.slot(page) {
                Some(s) => s,
                None => {
                    let s = self
                        .spare
                        .pop()
                        .expect("stage() takes only pages reserve() set slots aside for");
                    inner.slot_of[page as usize].store(s + 1, Ordering::Relaxed);
                    s
                }
            };
            // SAFETY: as in `receive`; the caller owns the page (it is being evicted), so this
            // slot is written by this thread alone.
            let dst = unsafe { inner.arena.slot_mut(slot) };
            fill(i, dst).map_err(|e| {
                StoreError::Lost(format!("reading page {page} for write-back failed: {e}"))
            })?;
        }
        Ok(())
    }

    fn commit(&mut self) -> Result<(), StoreError> {
        // The slots were written in place: nothing left to make durable.
        Ok(())
    }

    fn matches(&self, page: u64, data: &[u8]) -> bool {
        match self.inner.slot(page) {
            // SAFETY: as in `receive`: a slot of a page the caller owns.
            Some(slot) => {
                // SAFETY: as in `receive`: a slot of a page the caller owns.
                let far = unsafe { self.inner.arena.slot(slot) };
                far == data
            }
            None => false,
        }
    }
}

impl Drop for ShmHandle {
    fn drop(&mut self) {
        if !self.spare.is_empty() {
            let mut slots = self.inner.slots.lock().expect("slot lock");
            slots.free.append(&mut self.spare);
        }
    }
}

/// The far arena: a `PROT_NONE` reservation that slabs are mapped into, side by side.
struct Arena {
    addr: usize,
    len: usize,
}

impl Arena {
    /// Reserves `len` bytes of address space (never touched until a slab is mapped there).
    fn reserve(len: usize) -> io::Result<Arena> {
        let len = len.max(PAGE_SIZE);
        // SAFETY: a fresh private anonymous reservation with no address hint: the kernel picks
        // a free range, so no existing mapping is affected.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::empty(),
                rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::NORESERVE,
            )
        }?;
        let arena = Arena {
            addr: p as usize,
            len,
        };
        // A fork child has no use for it (its pager, if any, is its own).
        // SAFETY: advice on the range this struct owns; DONTFORK changes no contents.
        unsafe { rustix::mm::madvise(p, len, rustix::mm::Advice::LinuxDontFork) }?;
        Ok(arena)
    }

    /// Maps `pages` pages of `memfd` at slot `first`, over the reservation.
    fn map_slab(&self, first: usize, pages: usize, memfd: &OwnedFd) -> io::Result<()> {
        assert!(
            (first + pages) * PAGE_SIZE <= self.len,
            "slab outside the arena"
        );
        let at = (self.addr + first * PAGE_SIZE) as *mut std::ffi::c_void;
        // SAFETY: MAP_FIXED over a part of our own PROT_NONE reservation that no slab occupies
        // yet (slabs are mapped once each, at increasing slots), so nothing live is replaced.
        unsafe {
            rustix::mm::mmap(
                at,
                pages * PAGE_SIZE,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED | rustix::mm::MapFlags::FIXED,
                memfd.as_fd(),
                0,
            )
        }?;
        // SAFETY: advice on the range just mapped; DONTFORK changes no contents.
        unsafe { rustix::mm::madvise(at, pages * PAGE_SIZE, rustix::mm::Advice::LinuxDontFork) }?;
        Ok(())
    }

    /// The bytes of slot `s`.
    ///
    /// # Safety
    /// `s` must lie in a mapped slab, and nothing may write the slot while the slice lives.
    unsafe fn slot(&self, s: u32) -> &[u8] {
        // SAFETY: as the caller guarantees.
        unsafe {
            std::slice::from_raw_parts((self.addr + s as usize * PAGE_SIZE) as *const u8, PAGE_SIZE)
        }
    }

    /// The bytes of slot `s`, to write.
    ///
    /// # Safety
    /// `s` must lie in a mapped slab, and nothing else may read or write the slot while the
    /// slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slot_mut(&self, s: u32) -> &mut [u8] {
        // SAFETY: as the caller guarantees.
        unsafe {
            std::slice::from_raw_parts_mut(
                (self.addr + s as usize * PAGE_SIZE) as *mut u8,
                PAGE_SIZE,
            )
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the range reserved (and the slabs mapped inside it), once,
        // after every handle (which holds the Arc owning this arena) is gone.
        if let Err(e) = unsafe { rustix::mm::munmap(self.addr as *mut _, self.len) } {
            log::warn!("unmapping the far arena: {e}");
        }
    }
}
