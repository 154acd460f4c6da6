//! Evicting one batch of pages (run by reclaim threads, or by a faulting thread as the last
//! resort; `reclaim.rs` decides who and when).
//!
//! A batch is made race-free by its order of steps:
//! 1. claim victims (CLEAN or DIRTY → EVICTING by compare-and-swap);
//! 2. write-protect the dirty ones (clean ones already are): from here on a write to any victim
//!    blocks in a write-protect fault instead of changing the page;
//! 3. copy the dirty ones out through `/proc/self/mem` (never by dereferencing the region, so this
//!    thread cannot fault on memory it is responsible for) and send them in one batched write;
//! 4. only after the memnode acknowledges: drop every victim (`MADV_DONTNEED` on each contiguous
//!    run, all runs in one vectored `process_madvise` where the kernel allows it), mark them
//!    REMOTE, and wake the faults that waited.
//!
//! If the memnode refuses the write (full), the batch is undone: pages go back to their
//! resident states, nothing is dropped, and the region keeps them locally while it can.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::engine::Engine;
use crate::fatal::fatal;
use crate::state::PageState;
use crate::stats::Counters;
use crate::store::{StoreError, StoreHandle};
use crate::PAGE_SIZE;

/// One evicting thread's tools: its view of the region's memory and its scratch lists. Reclaim
/// threads own one each; a fault handler makes one when it first has to reclaim directly.
pub(crate) struct Evictor {
    mem: File,
    candidates: Vec<usize>,
    /// Claimed victims, sorted by page: (page, was dirty).
    victims: Vec<(usize, bool)>,
    /// The dirty victims' page numbers, for the store.
    dirty: Vec<u64>,
}

impl Evictor {
    /// Opens `/proc/self/mem` (stopping the program if that fails: it cannot evict without it).
    pub(crate) fn new() -> Evictor {
        let mem = match File::open("/proc/self/mem") {
            Ok(f) => f,
            Err(e) => fatal(&format!("opening /proc/self/mem for eviction: {e}")),
        };
        Evictor {
            mem,
            candidates: Vec::new(),
            victims: Vec::new(),
            dirty: Vec::new(),
        }
    }

    /// Evicts one batch through `store`. Returns the number of pages evicted (0 when nothing
    /// could be claimed or the memnode refused the write).
    pub(crate) fn evict_batch(&mut self, s: &Engine, store: &mut dyn StoreHandle) -> usize {
        let c = &s.counters;
        let mem = &s.mem;
        self.claim(s);
        if self.victims.is_empty() {
            return 0;
        }
        let t0 = Instant::now();
        for (start, len) in runs(self.victims.iter().filter(|v| v.1).map(|v| v.0)) {
            if let Err(e) = mem
                .uffd
                .write_protect(mem.addr_of(start), len * PAGE_SIZE, true, false)
            {
                fatal(&format!("write-protecting pages for eviction: {e}"));
            }
        }
        let t1 = Instant::now();
        self.dirty.clear();
        self.dirty
            .extend(self.victims.iter().filter(|v| v.1).map(|v| v.0 as u64));
        let dirty = self.dirty.len();
        // Copying out (t1..t2) happens inside the store's write, which also sends (t2..t3); the
        // copy is timed from the fill callback.
        let mut copy_ns = 0u64;
        if dirty > 0 {
            let file = &self.mem;
            let pages = &self.dirty;
            let r = store.write(pages, &mut |i, dst| {
                let t = Instant::now();
                let r = file.read_exact_at(dst, mem.addr_of(pages[i] as usize) as u64);
                copy_ns += t.elapsed().as_nanos() as u64;
                r
            });
            match r {
                Ok(()) => s.budget.memnode_full.store(false, Ordering::Relaxed),
                Err(StoreError::Full(why)) => {
                    self.undo(s, &why);
                    return 0;
                }
                Err(StoreError::Lost(why)) => fatal(&format!(
                    "writing back {dirty} pages failed: {why}; {} pages held only on the \
                     memnode are lost",
                    mem.table.census()[PageState::Remote as usize]
                )),
            }
        }
        let t2 = t1 + std::time::Duration::from_nanos(copy_ns);
        let t3 = Instant::now();
        if let Err(e) = mem
            .mapping
            .discard_ranges(&runs(self.victims.iter().map(|v| v.0)))
        {
            fatal(&format!("dropping evicted pages: {e}"));
        }
        let now = s.reclaim.clock_ns();
        for &(page, _) in &self.victims {
            s.reclaim.stamp_eviction(page, now);
            mem.table.release(page, PageState::Remote);
        }
        s.budget.release(self.victims.len());
        let t4 = Instant::now();
        s.budget.notify_progress();
        Counters::add(&c.evicted_dirty, dirty as u64);
        Counters::add(&c.evicted_clean, (self.victims.len() - dirty) as u64);
        Counters::add(&c.evict_batches, 1);
        Counters::add(&c.bytes_out, (dirty * PAGE_SIZE) as u64);
        Counters::add(&c.evict_protect_ns, (t1 - t0).as_nanos() as u64);
        Counters::add(&c.evict_read_ns, (t2 - t1).as_nanos() as u64);
        Counters::add(&c.evict_send_ns, (t3 - t2).as_nanos() as u64);
        Counters::add(&c.evict_drop_ns, (t4 - t3).as_nanos() as u64);
        self.victims.len()
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
                PageState::Clean
                    if table.transition(page, PageState::Clean, PageState::Evicting) =>
                {
                    self.victims.push((page, false))
                }
                PageState::Dirty
                    if table.transition(page, PageState::Dirty, PageState::Evicting) =>
                {
                    self.victims.push((page, true))
                }
                // Resident but busy (a write is being let through, or the state just changed):
                // try it again later.
                PageState::Clean | PageState::Dirty | PageState::Marking => policy.on_reject(page),
                // Not resident: a stale candidate.
                _ => {}
            }
        }
        drop(policy);
        self.victims.sort_unstable();
    }

    /// The memnode refused the write: put every victim back as it was.
    fn undo(&mut self, s: &Engine, why: &str) {
        let mem = &s.mem;
        for (start, len) in runs(self.victims.iter().filter(|v| v.1).map(|v| v.0)) {
            if let Err(e) = mem
                .uffd
                .write_protect(mem.addr_of(start), len * PAGE_SIZE, false, true)
            {
                fatal(&format!(
                    "undoing write protection after a refused write-back: {e}"
                ));
            }
        }
        let mut policy = s.policy.lock().expect("policy lock");
        for &(page, dirty) in &self.victims {
            mem.table.release(
                page,
                if dirty {
                    PageState::Dirty
                } else {
                    PageState::Clean
                },
            );
            policy.on_reject(page);
        }
        drop(policy);
        Counters::add(&s.counters.evict_aborted, 1);
        if !s.budget.memnode_full.swap(true, Ordering::Relaxed) {
            log::warn!(
                "memnode full ({why}); keeping pages locally beyond the budget while the \
                 overflow allowance lasts"
            );
        }
        s.budget.notify_progress();
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
