//! Evicting one batch of pages (run by reclaim threads, or by a faulting thread as the last
//! resort; `reclaim.rs` decides who and when). Two protocols, one per way of tracking writes
//! (`RegionConfig::dirty_tracking`); both are race-free: a write that races with eviction is
//! never lost.
//!
//! **Asynchronous tracking** (`UFFD_FEATURE_WP_ASYNC`; pages are installed write-protected and
//! the kernel itself lets the first write through, clearing the page's protection bit):
//! 1. claim victims (CLEAN or DIRTY → EVICTING by compare-and-swap);
//! 2. make sure the store has room for them (shared memory sets slots aside);
//! 3. `MADV_FREE` every victim: this clears the pages' hardware dirty bits, and from here on any
//!    write to one of them sets its bit again (all runs in one vectored `process_madvise`);
//! 4. `PAGEMAP_SCAN` the victims: the *written* ones lost their protection since they were
//!    installed, so their far copy is stale;
//! 5. copy the written ones out through `/proc/self/mem` (never by dereferencing the region, so
//!    this thread cannot fault on memory it is responsible for) into the store;
//! 6. `MADV_PAGEOUT` every victim: the kernel drops a lazily freed page only if nobody wrote it
//!    since step 3 (it re-checks the dirty bit under the page-table lock) and keeps it otherwise;
//! 7. scan again: a dropped page goes REMOTE (its far copy is exact: it was not written since
//!    step 3, and if it was written before, step 5 copied it after step 3); a kept one stays
//!    resident and is tried again later.
//!
//! No page is write-protected and no TLB is flushed per page: two vectored calls per batch
//! replace a write-protect ioctl per run of dirty pages, and the program's first write to a
//! fetched page costs a fault handled inside the kernel instead of a round trip to a handler.
//!
//! **Synchronous tracking** (a write-protect fault per first write; the fallback where the kernel
//! lacks `WP_ASYNC`, or swap is on, see `docs/architecture.md`):
//! 1. claim victims;
//! 2. write-protect the dirty ones (clean ones already are): from here on a write to any victim
//!    blocks in a write-protect fault instead of changing the page;
//! 3. copy the dirty ones out and store them;
//! 4. only after the store acknowledges: drop every victim (`MADV_DONTNEED`, vectored), mark them
//!    REMOTE, and wake the faults that waited.
//!
//! If the memnode refuses the write (full), the batch is undone: pages go back to their
//! resident states with their data, and the region keeps them locally while it can.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::time::Instant;

use gleaner_uffd::pagemap::{
    PageRegion, Pagemap, PAGE_IS_PRESENT, PAGE_IS_SWAPPED, PAGE_IS_WRITTEN,
};

use crate::engine::{Engine, Tracking};
use crate::fatal::fatal;
use crate::mapping::Advice;
use crate::state::PageState;
use crate::stats::Counters;
use crate::store::{StoreError, StoreHandle};
use crate::PAGE_SIZE;

/// One evicting thread's tools: its view of the region's memory and its scratch lists. Reclaim
/// threads own one each; a fault handler makes one when it first has to reclaim directly.
pub(crate) struct Evictor {
    mem: File,
    pagemap: Option<Pagemap>,
    candidates: Vec<usize>,
    /// Claimed victims, sorted by page.
    victims: Vec<Victim>,
    /// Page numbers handed to the store.
    ids: Vec<u64>,
    /// Runs of consecutive victims, `(first page, count)`.
    runs: Vec<(usize, usize)>,
    scan: Vec<PageRegion>,
    /// Where victims are moved while swap is on (made at first use).
    staging: Option<Staging>,
}

/// A claimed page and what the batch learns about it.
#[derive(Debug, Clone, Copy)]
struct Victim {
    page: usize,
    /// Its state when claimed (CLEAN or DIRTY).
    was: PageState,
    /// Its far copy is stale: it must be written back.
    written: bool,
    /// Still mapped after the drop (written during eviction): it stays resident.
    kept: bool,
}

impl Evictor {
    /// Opens `/proc/self/mem` and `/proc/self/pagemap` (stopping the program if that fails: it
    /// cannot evict without them).
    pub(crate) fn new() -> Evictor {
        let mem = match File::open("/proc/self/mem") {
            Ok(f) => f,
            Err(e) => fatal(&format!("opening /proc/self/mem for eviction: {e}")),
        };
        Evictor {
            mem,
            pagemap: None,
            candidates: Vec::new(),
            victims: Vec::new(),
            ids: Vec::new(),
            runs: Vec::new(),
            scan: Vec::new(),
            staging: None,
        }
    }

    /// Evicts one batch through `store`. Returns the number of pages evicted (0 when nothing
    /// could be claimed or the memnode refused the write).
    pub(crate) fn evict_batch(&mut self, s: &Engine, store: &mut dyn StoreHandle) -> usize {
        self.claim(s);
        if self.victims.is_empty() {
            return 0;
        }
        self.runs = runs(self.victims.iter().map(|v| v.page));
        match s.tracking {
            Tracking::Sync => self.evict_sync(s, store),
            Tracking::Async if !swap_is_on() => self.evict_async(s, store),
            // MADV_FREE drops a swapped-out page's only copy: with swap on, lazily freeing a page
            // the kernel swapped out behind our back could lose its data. Move victims out
            // instead (a swapped page moves as it is).
            Tracking::Async => self.evict_by_moving(s, store),
        }
    }

    /// The synchronous protocol (see the module documentation).
    fn evict_sync(&mut self, s: &Engine, store: &mut dyn StoreHandle) -> usize {
        let c = &s.counters;
        let mem = &s.mem;
        let t0 = Instant::now();
        for v in self.victims.iter_mut() {
            v.written = v.was == PageState::Dirty;
        }
        for (start, len) in runs(self.victims.iter().filter(|v| v.written).map(|v| v.page)) {
            if let Err(e) = mem
                .uffd
                .write_protect(mem.addr_of(start), len * PAGE_SIZE, true, false)
            {
                fatal(&format!("write-protecting pages for eviction: {e}"));
            }
        }
        let t1 = Instant::now();
        self.ids.clear();
        self.ids.extend(
            self.victims
                .iter()
                .filter(|v| v.written)
                .map(|v| v.page as u64),
        );
        let mut t2 = t1;
        if !self.ids.is_empty() {
            let (file, ids) = (&self.mem, &self.ids);
            let r = store.reserve(ids).and_then(|()| {
                store.stage(ids, &mut |i, dst| {
                    file.read_exact_at(dst, mem.addr_of(ids[i] as usize) as u64)
                })?;
                t2 = Instant::now();
                store.commit()
            });
            match r {
                Ok(()) => s.budget.memnode_full.store(false, Ordering::Relaxed),
                Err(StoreError::Full(why)) => {
                    self.undo_sync(s, &why);
                    return 0;
                }
                Err(StoreError::Lost(why)) => self.lost(s, &why),
            }
        }
        let t3 = Instant::now();
        if let Err(e) = mem.mapping.discard_ranges(&self.runs) {
            fatal(&format!("dropping evicted pages: {e}"));
        }
        let t4 = Instant::now();
        self.publish(s);
        Counters::add(&c.evict_protect_ns, (t1 - t0).as_nanos() as u64);
        Counters::add(&c.evict_read_ns, (t2 - t1).as_nanos() as u64);
        Counters::add(&c.evict_send_ns, (t3 - t2).as_nanos() as u64);
        Counters::add(&c.evict_drop_ns, (t4 - t3).as_nanos() as u64);
        self.victims.len()
    }

    /// The asynchronous protocol (see the module documentation).
    fn evict_async(&mut self, s: &Engine, store: &mut dyn StoreHandle) -> usize {
        let c = &s.counters;
        let mem = &s.mem;
        let t0 = Instant::now();
        // Room first: once the pages are lazily freed, their new data must have a place to go.
        self.ids.clear();
        self.ids.extend(self.victims.iter().map(|v| v.page as u64));
        match store.reserve(&self.ids) {
            Ok(()) => {}
            Err(StoreError::Full(why)) => {
                self.undo_claim(s, &why);
                return 0;
            }
            Err(StoreError::Lost(why)) => self.lost(s, &why),
        }
        if let Err(e) = mem.mapping.advise_ranges(&self.runs, Advice::Free) {
            fatal(&format!("marking pages for eviction (MADV_FREE): {e}"));
        }
        self.scan_victims(s, true);
        let t1 = Instant::now();
        self.ids.clear();
        self.ids.extend(
            self.victims
                .iter()
                .filter(|v| v.written)
                .map(|v| v.page as u64),
        );
        if !self.ids.is_empty() {
            let (file, ids) = (&self.mem, &self.ids);
            let r = store.stage(ids, &mut |i, dst| {
                file.read_exact_at(dst, mem.addr_of(ids[i] as usize) as u64)
            });
            if let Err(e) = r {
                self.lost(s, &e.to_string());
            }
        }
        let t2 = Instant::now();
        if let Err(e) = mem.mapping.advise_ranges(&self.runs, Advice::PageOut) {
            fatal(&format!("dropping evicted pages (MADV_PAGEOUT): {e}"));
        }
        self.scan_victims(s, false);
        let t3 = Instant::now();
        let mut refused = None;
        if !self.ids.is_empty() {
            match store.commit() {
                Ok(()) => s.budget.memnode_full.store(false, Ordering::Relaxed),
                Err(StoreError::Full(why)) => refused = Some(why),
                Err(StoreError::Lost(why)) => self.lost(s, &why),
            }
        }
        if let Some(why) = refused {
            // The memnode refused the write after the pages were dropped: put the written ones
            // back from the copies staged for it (their far copies are stale); the others'
            // far copies are exact, so they may stay remote.
            // (Staged were the victims written before the drop, in order; those kept since are
            // still mapped, with newer data.)
            for (i, v) in self.victims.iter_mut().filter(|v| v.written).enumerate() {
                if !v.kept {
                    mem.install(v.page, store.staged(i), true);
                    v.kept = true;
                }
            }
            s.budget.note_memnode_full(&why);
        }
        let t4 = Instant::now();
        let evicted = self.publish(s);
        Counters::add(&c.evict_protect_ns, (t1 - t0).as_nanos() as u64);
        Counters::add(&c.evict_read_ns, (t2 - t1).as_nanos() as u64);
        Counters::add(&c.evict_drop_ns, (t3 - t2).as_nanos() as u64);
        Counters::add(&c.evict_send_ns, (t4 - t3).as_nanos() as u64);
        evicted
    }

    /// Asynchronous tracking while swap is on: every victim is moved out of the region into a
    /// staging range with `UFFDIO_MOVE` (atomic: a later access faults as missing and waits for
    /// the batch), written back whole (without the protection bits, which a move does not
    /// carry, nothing tells which were written), then the staging range is emptied. Costs a TLB
    /// flush per run of victims; used only while the host has swap.
    fn evict_by_moving(&mut self, s: &Engine, store: &mut dyn StoreHandle) -> usize {
        let c = &s.counters;
        let mem = &s.mem;
        let t0 = Instant::now();
        self.ids.clear();
        self.ids.extend(self.victims.iter().map(|v| v.page as u64));
        match store.reserve(&self.ids) {
            Ok(()) => {}
            Err(StoreError::Full(why)) => {
                self.undo_claim(s, &why);
                return 0;
            }
            Err(StoreError::Lost(why)) => self.lost(s, &why),
        }
        let mut staging = self
            .staging
            .take()
            .unwrap_or_else(|| Staging::new(mem, s.evict_batch));
        let mut at = 0;
        for &(first, count) in &self.runs {
            let (moved, err) =
                mem.uffd
                    .move_range(staging.addr(at), mem.addr_of(first), count * PAGE_SIZE);
            if let Some(e) = err {
                // A page shared with a fork child (or pinned) cannot move: it and the rest of
                // its run stay resident.
                log::debug!("moving victims out stopped after {moved} bytes: {e}");
            }
            at += count;
        }
        // Still in the region: not moved. In the staging range: moved, to write back. Neither:
        // already gone (the kernel dropped a lazily freed page, unwritten since: its far copy is
        // exact).
        self.scan_victims(s, false);
        let moved = staging.present(self.victims.len());
        for (v, &m) in self.victims.iter_mut().zip(&moved) {
            v.written = m;
        }
        let t1 = Instant::now();
        self.ids.clear();
        self.ids.extend(
            self.victims
                .iter()
                .filter(|v| v.written)
                .map(|v| v.page as u64),
        );
        let mut refused = None;
        if !self.ids.is_empty() {
            let file = &self.mem;
            let staged_at: Vec<usize> = (0..self.victims.len())
                .filter(|&i| moved[i])
                .map(|i| staging.addr(i))
                .collect();
            let r = store.stage(&self.ids, &mut |i, dst| {
                file.read_exact_at(dst, staged_at[i] as u64)
            });
            if let Err(e) = r {
                self.lost(s, &e.to_string());
            }
            match store.commit() {
                Ok(()) => s.budget.memnode_full.store(false, Ordering::Relaxed),
                Err(StoreError::Full(why)) => refused = Some(why),
                Err(StoreError::Lost(why)) => self.lost(s, &why),
            }
        }
        let t2 = Instant::now();
        if let Some(why) = refused {
            // Move the pages back: nothing of them reached the store.
            for (i, v) in self.victims.iter_mut().enumerate() {
                if moved[i] {
                    let (_, err) =
                        mem.uffd
                            .move_range(mem.addr_of(v.page), staging.addr(i), PAGE_SIZE);
                    if let Some(e) = err {
                        fatal(&format!(
                            "moving page {} back after a refused write-back: {e}",
                            v.page
                        ));
                    }
                    v.kept = true;
                }
            }
            s.budget.note_memnode_full(&why);
        }
        staging.clear();
        self.staging = Some(staging);
        let t3 = Instant::now();
        let evicted = self.publish(s);
        Counters::add(&c.evict_protect_ns, (t1 - t0).as_nanos() as u64);
        Counters::add(&c.evict_read_ns, (t2 - t1).as_nanos() as u64);
        Counters::add(&c.evict_drop_ns, (t3 - t2).as_nanos() as u64);
        evicted
    }

    /// Scans every run of victims. Before the drop (`before_drop`), it records which are
    /// written (and treats a victim already gone as dropped: the kernel discarded a page lazily
    /// freed by an earlier batch, which it does only for pages unwritten since, whose far copy
    /// is exact); after the drop, which are still there (kept).
    fn scan_victims(&mut self, s: &Engine, before_drop: bool) {
        let pm = self.pagemap.get_or_insert_with(|| match Pagemap::open() {
            Ok(p) => p,
            Err(e) => fatal(&format!("opening /proc/self/pagemap for eviction: {e}")),
        });
        let mut v = 0;
        for &(first, count) in &self.runs {
            let (start, end) = (s.mem.addr_of(first), s.mem.addr_of(first + count));
            self.scan.clear();
            self.scan.reserve(count);
            let mut at = start;
            while at < end {
                at = match pm.scan(at, end, &mut self.scan) {
                    Ok(stop) => stop.max(at + PAGE_SIZE),
                    Err(e) => fatal(&format!("PAGEMAP_SCAN over pages being evicted: {e}")),
                };
                if self.scan.len() == self.scan.capacity() {
                    self.scan.reserve(count);
                }
            }
            for page in first..first + count {
                let addr = s.mem.addr_of(page) as u64;
                let cat = self
                    .scan
                    .iter()
                    .find(|r| r.start <= addr && addr < r.end)
                    .map_or(0, |r| r.categories);
                let victim = &mut self.victims[v];
                debug_assert_eq!(victim.page, page);
                let there = cat & (PAGE_IS_PRESENT | PAGE_IS_SWAPPED) != 0;
                if before_drop {
                    victim.written = there && cat & PAGE_IS_WRITTEN != 0;
                } else {
                    victim.kept = there;
                }
                v += 1;
            }
        }
    }

    /// Publishes the batch: dropped victims go REMOTE, kept ones back to resident. Returns the
    /// pages evicted.
    fn publish(&mut self, s: &Engine) -> usize {
        let c = &s.counters;
        let now = s.reclaim.clock_ns();
        let (mut clean, mut dirty, mut kept) = (0, 0, 0);
        if s.tracking == Tracking::Async {
            // A page that came back clean and was written meanwhile is likely to be rewritten
            // on its next residency too (write prediction's evidence).
            for v in self
                .victims
                .iter()
                .filter(|v| v.written && v.was == PageState::Clean)
            {
                s.writes.on_tracked_write(v.page);
            }
        }
        let mut policy = None;
        for v in &self.victims {
            if v.kept {
                kept += 1;
                let state = if v.written { PageState::Dirty } else { v.was };
                s.mem.table.release(v.page, state);
                policy
                    .get_or_insert_with(|| s.policy.lock().expect("policy lock"))
                    .on_reject(v.page);
                continue;
            }
            if v.written {
                dirty += 1;
            } else {
                clean += 1;
            }
            s.reclaim.stamp_eviction(v.page, now);
            s.mem.table.release(v.page, PageState::Remote);
        }
        drop(policy);
        s.budget.release(clean + dirty);
        s.budget.notify_progress();
        Counters::add(&c.evicted_dirty, dirty as u64);
        Counters::add(&c.evicted_clean, clean as u64);
        Counters::add(&c.evict_kept, kept as u64);
        Counters::add(&c.evict_batches, 1);
        Counters::add(&c.evict_runs, self.runs.len() as u64);
        Counters::add(&c.bytes_out, (dirty * PAGE_SIZE) as u64);
        clean + dirty
    }

    /// Takes candidates from the policy and claims those that are resident and idle.
    fn claim(&mut self, s: &Engine) {
        self.candidates.clear();
        self.victims.clear();
        let table = &s.mem.table;
        let mut policy = s.policy.lock().expect("policy lock");
        policy.pick(s.evict_batch, &mut self.candidates);
        for &page in &self.candidates {
            match table.get(page) {
                was @ (PageState::Clean | PageState::Dirty)
                    if table.transition(page, was, PageState::Evicting) =>
                {
                    self.victims.push(Victim {
                        page,
                        was,
                        written: false,
                        kept: false,
                    })
                }
                // Resident but busy (a write is being let through, or the state just changed):
                // try it again later.
                PageState::Clean | PageState::Dirty | PageState::Marking => policy.on_reject(page),
                // Not resident: a stale candidate.
                _ => {}
            }
        }
        drop(policy);
        self.victims.sort_unstable_by_key(|v| v.page);
    }

    /// The memnode refused the write of a synchronous batch: lift the protection set for it
    /// and put every victim back as it was.
    fn undo_sync(&mut self, s: &Engine, why: &str) {
        let mem = &s.mem;
        for (start, len) in runs(self.victims.iter().filter(|v| v.written).map(|v| v.page)) {
            if let Err(e) = mem
                .uffd
                .write_protect(mem.addr_of(start), len * PAGE_SIZE, false, true)
            {
                fatal(&format!(
                    "undoing write protection after a refused write-back: {e}"
                ));
            }
        }
        self.undo_claim(s, why);
    }

    /// Puts every victim back in the state it was claimed from (nothing was changed yet).
    fn undo_claim(&mut self, s: &Engine, why: &str) {
        let mut policy = s.policy.lock().expect("policy lock");
        for v in &self.victims {
            s.mem.table.release(v.page, v.was);
            policy.on_reject(v.page);
        }
        drop(policy);
        Counters::add(&s.counters.evict_aborted, 1);
        s.budget.note_memnode_full(why);
        s.budget.notify_progress();
    }

    /// The store failed in a way that loses data: stop.
    fn lost(&self, s: &Engine, why: &str) -> ! {
        fatal(&format!(
            "writing back {} pages failed: {why}; {} pages held only on the memnode are lost",
            self.victims.len(),
            s.mem.table.census()[PageState::Remote as usize]
        ))
    }
}

/// Whether this host has swap space (the kernel may then swap out resident pages of the region).
pub(crate) fn swap_is_on() -> bool {
    // SAFETY: sysinfo(2) fills the live, zeroed struct and touches nothing else.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::sysinfo(&mut info) };
    rc != 0 || info.totalswap > 0
}

/// A range of one batch's pages, registered with the region's userfaultfd, that victims are
/// moved into while swap is on. Nothing but the evictor touches it, and only through
/// `/proc/self/mem` and ioctls.
struct Staging {
    mapping: crate::mapping::Mapping,
    pagemap: Pagemap,
    scan: Vec<PageRegion>,
}

impl Staging {
    fn new(mem: &crate::mem::Memory, pages: usize) -> Staging {
        let made = crate::mapping::Mapping::reserve(pages * PAGE_SIZE).and_then(|m| {
            mem.uffd
                .register(m.addr(), m.len(), false)
                .map_err(std::io::Error::other)?;
            Ok(m)
        });
        let mapping = match made {
            Ok(m) => m,
            Err(e) => fatal(&format!("making the eviction staging range: {e}")),
        };
        let pagemap = match Pagemap::open() {
            Ok(p) => p,
            Err(e) => fatal(&format!("opening /proc/self/pagemap for eviction: {e}")),
        };
        Staging {
            mapping,
            pagemap,
            scan: Vec::with_capacity(pages),
        }
    }

    fn addr(&self, i: usize) -> usize {
        assert!(
            i * PAGE_SIZE < self.mapping.len(),
            "staging slot {i} out of range"
        );
        self.mapping.addr() + i * PAGE_SIZE
    }

    /// Which of the first `n` staging pages hold a page (present or swapped).
    fn present(&mut self, n: usize) -> Vec<bool> {
        self.scan.clear();
        let start = self.mapping.addr();
        if let Err(e) = self
            .pagemap
            .scan(start, start + n * PAGE_SIZE, &mut self.scan)
        {
            fatal(&format!(
                "PAGEMAP_SCAN over the eviction staging range: {e}"
            ));
        }
        (0..n)
            .map(|i| {
                let a = (start + i * PAGE_SIZE) as u64;
                self.scan.iter().any(|r| r.start <= a && a < r.end)
            })
            .collect()
    }

    /// Drops whatever the staging range holds (copied to the store, or moved back, already).
    fn clear(&self) {
        if let Err(e) = self
            .mapping
            .madvise(0, self.mapping.len(), libc::MADV_DONTNEED)
        {
            fatal(&format!("emptying the eviction staging range: {e}"));
        }
    }
}

/// Groups ascending page numbers into `(first, count)` runs of consecutive pages.
pub(crate) fn runs(pages: impl Iterator<Item = usize>) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for p in pages {
        match out.last_mut() {
            Some((start, len)) if *start + *len == p => *len += 1,
            _ => out.push((p, 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_group_consecutive_pages() {
        assert_eq!(
            super::runs([1, 2, 3, 7, 9, 10].into_iter()),
            vec![(1, 3), (7, 1), (9, 2)]
        );
        assert!(super::runs(std::iter::empty()).is_empty());
    }
}
