//! The per-page state table: one atomic byte per page, changed only by compare-and-swap.
//!
//! ```text
//!            fault (first touch)                         fault (evicted page)
//!  ABSENT ───────────────► FETCHING ◄──────────────────────────────── REMOTE
//!                             │ install (zero-fill, or copy from the memnode)   ▲
//!                             ▼                                                 │
//!           write-protect  CLEAN ──WP fault──► MARKING ──► DIRTY               │
//!           fault ends ───────────┐                          │                  │
//!                                 └─────────► EVICTING ◄─────┘                  │
//!                                                 └── written back / dropped ───┘
//! ```
//!
//! A prefetch moves a REMOTE page to PREFETCHING; on arrival it is installed (CLEAN) or staged
//! (back to REMOTE, its data held locally until its first use); a demand fault meanwhile moves it
//! to FETCHING and the prefetching handler installs it.
//!
//! A page in any state but the owned ones can also go to DISCARDING (the program unmapped or
//! `MADV_DONTNEED`ed it) and from there to ABSENT, or to FOREIGN when the program maps a file or
//! shared memory over it with `MAP_FIXED` (the JVM's class-data sharing does): the pager then
//! leaves it alone (its memory is the kernel's ordinary mapping, with no userfaultfd) until the
//! program unmaps it or maps anonymous memory over it, which makes it ABSENT again.
//!
//! The middle states (FETCHING, MARKING, EVICTING, DISCARDING, PREFETCHING) are *owned*: exactly one thread moved the
//! page into them and only that thread moves it out. Everyone else either treats the fault as a
//! duplicate or waits for the owner. The kernel's "one `UFFDIO_COPY` wins, the rest get `EEXIST`"
//! backs this up for installs.
//!
//! A fault on a page another thread owns is not waited out by its handler: the handler marks
//! the page *waited for* and returns, leaving the thread asleep in the kernel, and the owner
//! wakes the marked page's threads once it has released it (they retry, and find the page
//! mapped, or fault again). For an EVICTING page that is the batch, which may also hand the
//! page back sooner from what it captured (`evict/batch.rs`): a handler that blocked for it (about a
//! millisecond) could serve no other fault meanwhile, and a batch may itself need a handler
//! (taking a page the program dropped behind the pager's back faults: `evict/batch.rs`). For
//! a FETCHING or MARKING page the owner's install or unprotect wakes the threads whose faults
//! came before it; the mark covers a fault that came after it, before the release: possible
//! only if the program dropped the page behind the pager's back in between, and then nothing
//! else would ever wake that thread.

use std::sync::atomic::{fence, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// The state of one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum PageState {
    /// Never touched (or freed): no data anywhere; a fault zero-fills it locally.
    Absent = 0,
    /// Not resident; the only copy is on the memnode.
    Remote = 1,
    /// Resident, write-protected, identical to its memnode copy: evicted without a write.
    Clean = 2,
    /// Resident and writable; must be written back before it is dropped.
    Dirty = 3,
    /// A fault handler is installing it.
    Fetching = 4,
    /// A fault handler is lifting write protection to let a write through.
    Marking = 5,
    /// The evictor is writing it back or dropping it.
    Evicting = 6,
    /// The program unmapped or discarded it (`munmap`, `MADV_DONTNEED`); becoming ABSENT.
    Discarding = 7,
    /// A handler is fetching it ahead of demand (a prefetch). When it arrives the page is
    /// installed or staged; a demand fault meanwhile moves it to FETCHING and the prefetching
    /// handler installs it (a *late* prefetch).
    Prefetching = 8,
    /// Not the pager's: the program mapped a file or shared memory over it (`MAP_FIXED`). No
    /// fault comes for it and nothing here touches it.
    Foreign = 9,
}

/// How many states there are (the length of [`PageTable::census`]).
pub(crate) const STATES: usize = 10;

impl PageState {
    fn from_u8(v: u8) -> PageState {
        match v {
            0 => PageState::Absent,
            1 => PageState::Remote,
            2 => PageState::Clean,
            3 => PageState::Dirty,
            4 => PageState::Fetching,
            5 => PageState::Marking,
            6 => PageState::Evicting,
            7 => PageState::Discarding,
            8 => PageState::Prefetching,
            9 => PageState::Foreign,
            _ => unreachable!("page state byte {v} is never stored"),
        }
    }
}

/// A flat array of page states, and one flag per page: resident when the process last forked.
pub(crate) struct PageTable {
    states: Box<[AtomicU8]>,
    /// 1 while a page resident at a fork may still be shared with the child (until it is
    /// evicted or discarded: its next install is the process's own page).
    forked: Box<[AtomicU8]>,
    /// One past the highest page that ever left ABSENT: every page from here on is ABSENT. The
    /// table spans the whole reserved region (64 GiB for the preload's heap, 16 M pages) of
    /// which a program uses the first few hundred MiB, so whole-table scans (the stats' count
    /// of remote pages, once a second; a fork) stop here: scanning all of it cost redis a visible
    /// share of its CPU (`bench/results/harness-50/README.md`, the cuts of 2026-11-26).
    touched_end: AtomicUsize,
    /// A bit per page: a fault on it while another thread owned it left its thread asleep, for
    /// the owner to wake (see the module's doc).
    waited: Box<[AtomicU64]>,
}

impl PageTable {
    /// A table of `pages` pages, all [`PageState::Absent`]. The memory comes zeroed from the
    /// allocator without being touched, so a large, sparsely used region costs little.
    pub(crate) fn new(pages: usize) -> PageTable {
        let states = Box::<[AtomicU8]>::new_zeroed_slice(pages);
        // SAFETY: an all-zero byte is a valid AtomicU8 holding 0, which is PageState::Absent.
        let states = unsafe { states.assume_init() };
        let forked = Box::<[AtomicU8]>::new_zeroed_slice(pages);
        // SAFETY: as above; 0 means "not marked".
        let forked = unsafe { forked.assume_init() };
        let waited = Box::<[AtomicU64]>::new_zeroed_slice(pages.div_ceil(64));
        // SAFETY: an all-zero u64 is a valid AtomicU64 holding 0 ("nobody waits").
        let waited = unsafe { waited.assume_init() };
        PageTable {
            states,
            forked,
            touched_end: AtomicUsize::new(0),
            waited,
        }
    }

    /// A handler met a fault on `page` while another thread owned it in state `owned`: marks it
    /// waited for and returns whether it still is in that state, in which case its owner will
    /// wake the faulting thread when it releases the page ([`PageTable::take_waited`]);
    /// otherwise the caller serves the fault itself (the owner may wake the thread too, which
    /// is harmless).
    pub(crate) fn defer_to_owner(&self, page: usize, owned: PageState) -> bool {
        self.waited[page / 64].fetch_or(1 << (page % 64), Ordering::SeqCst);
        // Either this load sees the owner's release, or the owner's `take_waited` (after its
        // release and a fence) sees the mark: never neither.
        fence(Ordering::SeqCst);
        self.get(page) == owned
    }

    /// After releasing `page` from an owned state (and a [`fence`] after the release, or after
    /// all of a batch's releases): whether a fault left a thread waiting on it, clearing the
    /// mark.
    pub(crate) fn take_waited(&self, page: usize) -> bool {
        let bit = 1u64 << (page % 64);
        let word = &self.waited[page / 64];
        word.load(Ordering::SeqCst) & bit != 0 && word.fetch_and(!bit, Ordering::SeqCst) & bit != 0
    }

    /// Marks every resident page as resident at a fork (the caller holds eviction paused).
    pub(crate) fn mark_resident_forked(&self) {
        let end = self.touched_end();
        for (s, f) in self.states[..end].iter().zip(self.forked.iter()) {
            let state = s.load(Ordering::Acquire);
            if state == PageState::Clean as u8 || state == PageState::Dirty as u8 {
                f.store(1, Ordering::Relaxed);
            }
        }
    }

    /// Whether `page` was resident at a fork and may still be shared with the child.
    pub(crate) fn is_forked(&self, page: usize) -> bool {
        self.forked[page].load(Ordering::Relaxed) != 0
    }

    /// `page`, resident, may be shared with a fork child or parent until it leaves memory.
    pub(crate) fn mark_forked(&self, page: usize) {
        self.forked[page].store(1, Ordering::Relaxed);
    }

    /// `page` leaves memory (evicted or discarded): its next install is the process's own.
    pub(crate) fn clear_forked(&self, page: usize) {
        self.forked[page].store(0, Ordering::Relaxed);
    }

    /// Whether the page is in a state owned by another thread that will soon leave it.
    pub(crate) fn is_busy(&self, page: usize) -> bool {
        matches!(
            self.get(page),
            PageState::Fetching
                | PageState::Marking
                | PageState::Evicting
                | PageState::Discarding
                | PageState::Prefetching
        )
    }

    /// One past the highest page that ever left [`PageState::Absent`]: all pages from here on
    /// are absent.
    pub(crate) fn touched_end(&self) -> usize {
        self.touched_end.load(Ordering::Acquire)
    }

    /// The current state of `page`.
    pub(crate) fn get(&self, page: usize) -> PageState {
        PageState::from_u8(self.states[page].load(Ordering::Acquire))
    }

    /// Moves `page` from `from` to `to`; false if it was not in `from`.
    pub(crate) fn transition(&self, page: usize, from: PageState, to: PageState) -> bool {
        let moved = self.states[page]
            .compare_exchange(from as u8, to as u8, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        // Every way out of ABSENT is a transition (a release only ever sets a page its caller
        // owns, which left ABSENT through one).
        if moved && from == PageState::Absent && page >= self.touched_end.load(Ordering::Relaxed) {
            self.touched_end.fetch_max(page + 1, Ordering::AcqRel);
        }
        moved
    }

    /// Sets the state of a page the caller owns (it holds it in an owned state).
    pub(crate) fn release(&self, page: usize, to: PageState) {
        self.states[page].store(to as u8, Ordering::Release);
    }

    /// Counts pages per state (for stats and tests; not atomic across pages).
    pub(crate) fn census(&self) -> [usize; STATES] {
        let end = self.touched_end();
        let mut c = [0usize; STATES];
        for s in self.states[..end].iter() {
            c[s.load(Ordering::Relaxed) as usize] += 1;
        }
        c[PageState::Absent as usize] += self.states.len() - end;
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions_are_exclusive() {
        let t = PageTable::new(4);
        assert_eq!(t.get(2), PageState::Absent);
        assert!(t.transition(2, PageState::Absent, PageState::Fetching));
        assert!(!t.transition(2, PageState::Absent, PageState::Fetching));
        t.release(2, PageState::Dirty);
        assert_eq!(t.get(2), PageState::Dirty);
        assert_eq!(t.census()[PageState::Dirty as usize], 1);
        assert_eq!(t.census()[PageState::Absent as usize], 3);
    }

    #[test]
    fn counts_cover_every_page_that_ever_left_absent() {
        let t = PageTable::new(1000);
        assert_eq!(t.touched_end(), 0);
        assert!(t.transition(700, PageState::Absent, PageState::Fetching));
        t.release(700, PageState::Dirty);
        assert!(t.transition(3, PageState::Absent, PageState::Fetching));
        t.release(3, PageState::Remote);
        assert_eq!(
            t.touched_end(),
            701,
            "the highest page that left ABSENT bounds the scans"
        );
        // A failed transition out of ABSENT moves nothing.
        assert!(!t.transition(900, PageState::Remote, PageState::Fetching));
        assert!(!t.transition(700, PageState::Absent, PageState::Fetching));
        assert_eq!(t.touched_end(), 701);
        let c = t.census();
        assert_eq!(c[PageState::Dirty as usize], 1);
        assert_eq!(c[PageState::Remote as usize], 1);
        assert_eq!(
            c[PageState::Absent as usize],
            998,
            "the untouched tail counts as absent"
        );
        assert_eq!(c.iter().sum::<usize>(), 1000);
    }
}
