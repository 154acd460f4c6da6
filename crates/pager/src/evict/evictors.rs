//! The pager threads that evict, what each is taking into its pipe, and the watchdog for the one
//! way their batches can get stuck.
//!
//! Fault handlers (reclaiming directly) and reclaim threads take a batch's victims into a pipe
//! with `vmsplice`, which faults, inside the kernel, on a victim with nothing mapped: one the
//! program dropped behind the pager's back (a raw `madvise` system call) after the batch
//! claimed it. That fault waits in the kernel until another thread installs the page. A fault
//! handler reading its message installs zeros, what the program's drop left (`fault/resolve.rs`). But
//! the handlers may all be stuck at once: each in its own batch's `vmsplice`, or one waiting for
//! budget that only the stuck batch would free while it holds that batch's message unread. Then
//! nobody would; the watchdog thread (`evict/watchdog.rs`) looks every [`WATCH_PERIOD`] for a batch
//! that has been taking pages into its pipe for longer than [`STUCK_AFTER`] and zero-fills that
//! batch's victims that have nothing mapped (a stuck batch's program waits that long). A batch
//! merely slow (its thread preempted) loses nothing by it: a victim with nothing mapped before
//! the batch's pipe took it is one the program dropped, whoever installs its zeros.
//!
//! Each thread's capture sits behind a lock that the thread takes to end its capture, before it
//! drops its victims: so a page is zero-filled only while its batch has not yet dropped it
//! (zeros installed on a dropped victim would be read in place of its far data).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::event::{eventfd, EventfdFlags};

use crate::fatal::fatal;
use crate::fault::state::PageState;
use crate::memory::mem::Memory;

/// How often the watchdog looks for a stuck batch.
pub(crate) const WATCH_PERIOD: Duration = Duration::from_millis(50);

/// How long a batch may take its pages into its pipe before the watchdog looks at it. A capture
/// takes microseconds, but a thread preempted in one on a busy CPU may hold it for
/// milliseconds; a stuck one never ends (and its program waits about this long).
pub(crate) const STUCK_AFTER: Duration = Duration::from_millis(50);

/// The evicting threads of a region, one slot each.
pub(crate) struct Evictors {
    slots: Box<[Slot]>,
    next: AtomicUsize,
    /// Pages the watchdog zero-filled.
    rescued: AtomicU64,
    /// Captures the watchdog looked at (past [`STUCK_AFTER`]).
    looked_at: AtomicU64,
}

struct Slot {
    /// The thread's kernel id (0 until it registers, and once it unregisters).
    tid: AtomicU32,
    capture: Mutex<Capture>,
    /// A fault waited for an evicting page since the thread last asked
    /// ([`Evictors::take_wanted`]): perhaps one of its batch's.
    wanted: AtomicBool,
    /// The thread waits for its memnode to acknowledge a write-back and watches `bell`.
    committing: AtomicBool,
    /// An eventfd, written when a fault waits while the thread is committing.
    bell: OwnedFd,
}

/// What one thread is taking into its pipe.
#[derive(Default)]
struct Capture {
    /// Since when (`None`: not capturing).
    since: Option<Instant>,
    /// The victims, as runs of pages (first, count).
    runs: Vec<(usize, usize)>,
}

impl Capture {
    fn holds(&self, page: usize) -> bool {
        self.since.is_some()
            && self
                .runs
                .iter()
                .any(|&(first, n)| (first..first + n).contains(&page))
    }
}

impl Evictors {
    /// Room for `capacity` evicting threads.
    pub(crate) fn new(capacity: usize) -> std::io::Result<Evictors> {
        let slots = (0..capacity)
            .map(|_| {
                Ok(Slot {
                    tid: AtomicU32::new(0),
                    capture: Mutex::new(Capture::default()),
                    wanted: AtomicBool::new(false),
                    committing: AtomicBool::new(false),
                    bell: gleaner_fds::make_held(|| {
                        eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
                    })?,
                })
            })
            .collect::<std::io::Result<_>>()?;
        Ok(Evictors {
            slots,
            next: AtomicUsize::new(0),
            rescued: AtomicU64::new(0),
            looked_at: AtomicU64::new(0),
        })
    }

    /// Records the calling thread, before it evicts anything; returns its slot.
    pub(crate) fn register_current(&self) -> usize {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        let slot = self.next.fetch_add(1, Ordering::Relaxed);
        match self.slots.get(slot) {
            Some(s) => s.tid.store(tid, Ordering::Release),
            // A bug, not a user error: the region sized this for every thread it starts.
            None => fatal("more evicting pager threads than the region made room for"),
        }
        slot
    }

    /// Forgets slot `slot`'s thread: it evicts no more (a fork child's first thread, which
    /// goes on as the program's).
    pub(crate) fn unregister(&self, slot: usize) {
        self.slots[slot].tid.store(0, Ordering::Release);
    }

    /// Whether `tid` (a faulting thread's id from a userfaultfd message; 0 when unknown) is an
    /// evicting thread's.
    pub(crate) fn contains(&self, tid: u32) -> bool {
        self.slot_of(tid).is_some()
    }

    fn slot_of(&self, tid: u32) -> Option<&Slot> {
        if tid == 0 {
            return None;
        }
        self.slots
            .iter()
            .find(|s| s.tid.load(Ordering::Acquire) == tid)
    }

    fn lock(slot: &Slot) -> MutexGuard<'_, Capture> {
        slot.capture.lock().expect("evictor capture lock")
    }

    /// Slot `slot`'s thread starts taking the pages of `runs` into its pipe.
    pub(crate) fn begin_capture(&self, slot: usize, runs: &[(usize, usize)]) {
        let mut c = Self::lock(&self.slots[slot]);
        c.runs.clear();
        c.runs.extend_from_slice(runs);
        c.since = Some(Instant::now());
    }

    /// Slot `slot`'s thread has taken its pages; it may drop them once this returns.
    pub(crate) fn end_capture(&self, slot: usize) {
        Self::lock(&self.slots[slot]).since = None;
    }

    /// Serves a fault that thread `tid` raised on `page` if it is an evicting thread's: one
    /// taking `page` into its pipe, which found nothing mapped there (an evicting thread touches
    /// the region only through its pipe). Zero-fills the page then (what the program's drop
    /// left) and returns `Some(true)`; `Some(false)` when the fault was already served (by the
    /// watchdog); `None` when `tid` is not an evicting thread.
    pub(crate) fn serve_fault(&self, mem: &Memory, tid: u32, page: usize) -> Option<bool> {
        let slot = self.slot_of(tid)?;
        let c = Self::lock(slot);
        Some(c.holds(page) && mem.install_zero_if_missing(page))
    }

    /// The watchdog's pass: zero-fills the victims with nothing mapped of every batch that has
    /// been taking pages into its pipe for `stuck_after` or more, calling `on_filled` for each.
    /// Which victims are mapped it asks `mincore`, a system call per run: a batch merely slow
    /// costs no more than that.
    pub(crate) fn rescue(
        &self,
        mem: &Memory,
        stuck_after: Duration,
        mut on_filled: impl FnMut(usize),
    ) {
        let mut mapped = Vec::new();
        for slot in self.slots.iter() {
            let c = Self::lock(slot);
            if c.since.is_none_or(|t| t.elapsed() < stuck_after) {
                continue;
            }
            self.looked_at.fetch_add(1, Ordering::Relaxed);
            for &(first, n) in &c.runs {
                if let Err(e) = mem.mapped(first, n, &mut mapped) {
                    fatal(&format!("mincore over pages being evicted: {e}"));
                }
                for (page, &m) in (first..first + n).zip(&mapped) {
                    if m & 1 == 0
                        && mem.table.get(page) == PageState::Evicting
                        && mem.install_zero_if_missing(page)
                    {
                        self.rescued.fetch_add(1, Ordering::Relaxed);
                        on_filled(page);
                    }
                }
            }
        }
    }

    /// A fault waits for an evicting page (its thread is left asleep for the batch: `fault/state.rs`):
    /// tells every evicting thread, and rings the bell of those waiting for their memnode,
    /// which can hand the page back from what their batch captured (`evict/batch.rs`).
    pub(crate) fn page_wanted(&self) {
        for slot in self.slots.iter() {
            if slot.tid.load(Ordering::Relaxed) == 0 {
                continue;
            }
            // Dekker-style with `begin_commit`: either this load sees the thread committing
            // (and rings), or the thread's `take_wanted` after it began sees the flag.
            slot.wanted.store(true, Ordering::SeqCst);
            if slot.committing.load(Ordering::SeqCst) {
                // An eventfd write fails only when its counter would overflow: it is readable
                // then anyway.
                let _ = rustix::io::write(&slot.bell, &1u64.to_ne_bytes());
            }
        }
    }

    /// Slot `slot`'s thread: whether a fault waited for an evicting page since it last asked
    /// (clearing the flag).
    pub(crate) fn take_wanted(&self, slot: usize) -> bool {
        // Sequentially consistent, to pair with `page_wanted` after `begin_commit` (a few times
        // a batch). Were a flag missed, its fault would only wait for the next look or the
        // batch's end, as before hand-backs.
        self.slots[slot].wanted.swap(false, Ordering::SeqCst)
    }

    /// Slot `slot`'s thread starts waiting for its memnode to acknowledge a write-back: from
    /// now on a fault that waits rings its bell, which this returns. The caller asks
    /// [`Evictors::take_wanted`] after this, for faults that came just before.
    pub(crate) fn begin_commit(&self, slot: usize) -> BorrowedFd<'_> {
        let s = &self.slots[slot];
        s.committing.store(true, Ordering::SeqCst);
        s.bell.as_fd()
    }

    /// Silences slot `slot`'s bell after it rang.
    pub(crate) fn reset_bell(&self, slot: usize) {
        let mut count = [0u8; 8];
        // Non-blocking: an unrung bell reads EAGAIN, which is as good as reset.
        let _ = rustix::io::read(&self.slots[slot].bell, &mut count);
    }

    /// Slot `slot`'s thread has its acknowledgement: its bell rings no more. A ring left unread
    /// is answered at the thread's next commit (a look that finds nothing), which costs less
    /// than reading the bell after every batch.
    pub(crate) fn end_commit(&self, slot: usize) {
        self.slots[slot].committing.store(false, Ordering::SeqCst);
    }

    /// Pages the watchdog zero-filled so far.
    pub(crate) fn rescued(&self) -> u64 {
        self.rescued.load(Ordering::Relaxed)
    }

    /// Slow captures the watchdog looked at so far.
    pub(crate) fn looked_at(&self) -> u64 {
        self.looked_at.load(Ordering::Relaxed)
    }
}
