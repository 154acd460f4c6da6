//! The local budget: how many pages may be resident, how many are, and the waits around it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::fault::state::PageTable;

/// Resident pages against the budget, and the signal that eviction made progress.
pub(crate) struct Budget {
    /// Resident pages plus installs in flight; never above the limit.
    pub(crate) resident: AtomicUsize,
    /// The most pages resident at once ([`Budget::pages`]; it grows with [`Budget::grow`], and
    /// only an elastic budget's shrink lowers it: [`Budget::lower`]).
    pages: AtomicUsize,
    /// How far past the budget the region may grow while the memnode refuses writes.
    pub(crate) overflow: usize,
    /// Set while the memnode refuses writes (full).
    pub(crate) memnode_full: AtomicBool,
    /// Set around `fork`: no new eviction batch starts.
    pub(crate) evict_paused: AtomicBool,
    /// Bumped after every eviction batch (or undo); waiters re-check their condition.
    progress: (Mutex<u64>, Condvar),
    /// Where periodic threads sleep ([`Budget::nap_unless`]): signalled only when the region
    /// stops, so that they do not wake at every eviction batch as `progress`'s waiters do.
    quiet: (Mutex<()>, Condvar),
}

/// Sleeps on `(m, cv)` for `d` or until `stopping()`, re-checked at each signal of `cv`;
/// returns whether it is stopping.
fn sleep_on<T>((m, cv): &(Mutex<T>, Condvar), d: Duration, stopping: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + d;
    let mut g = m.lock().expect("sleep lock");
    loop {
        if stopping() {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        g = cv.wait_timeout(g, deadline - now).expect("sleep lock").0;
    }
}

impl Budget {
    /// A budget of `pages` pages that may overflow by `overflow` while the memnode is full.
    pub(crate) fn new(pages: usize, overflow: usize) -> Budget {
        Budget {
            resident: AtomicUsize::new(0),
            pages: AtomicUsize::new(pages),
            overflow,
            memnode_full: AtomicBool::new(false),
            evict_paused: AtomicBool::new(false),
            progress: (Mutex::new(0), Condvar::new()),
            quiet: (Mutex::new(()), Condvar::new()),
        }
    }

    /// The most pages resident at once.
    pub(crate) fn pages(&self) -> usize {
        self.pages.load(Ordering::Acquire)
    }

    /// Raises the budget to `pages` (never lowers it); whether it rose. Threads waiting for
    /// room are told.
    pub(crate) fn grow(&self, pages: usize) -> bool {
        let grew = self.pages.fetch_max(pages, Ordering::AcqRel) < pages;
        if grew {
            self.notify_progress();
        }
        grew
    }

    /// Lowers the budget to `pages` (never raises it): an elastic budget's shrink
    /// (`evict/elastic.rs`), which evicts first, so that what is resident stays about as far
    /// below the budget as before and no fault waits for the shrink.
    pub(crate) fn lower(&self, pages: usize) {
        self.pages.fetch_min(pages, Ordering::AcqRel);
    }

    /// Pages resident now (installs in flight included).
    pub(crate) fn resident(&self) -> usize {
        self.resident.load(Ordering::Acquire)
    }

    /// The most pages the region may hold now: the budget, plus the overflow allowance while the
    /// memnode refuses writes.
    pub(crate) fn limit(&self) -> usize {
        if self.memnode_full.load(Ordering::Relaxed) {
            self.pages() + self.overflow
        } else {
            self.pages()
        }
    }

    /// Charges one page unconditionally (over the limit if need be).
    pub(crate) fn charge_over(&self) {
        self.resident.fetch_add(1, Ordering::AcqRel);
    }

    /// Gives `n` pages back.
    pub(crate) fn release(&self, n: usize) {
        if n > 0 {
            self.resident.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// Records that the memnode refused a write for lack of room (`why`): the region may now
    /// keep pages locally beyond the budget, up to the overflow allowance.
    pub(crate) fn note_memnode_full(&self, why: &str) {
        if !self.memnode_full.swap(true, Ordering::Relaxed) {
            log::warn!(
                "memnode full ({why}); keeping pages locally beyond the budget while the \
                 overflow allowance lasts"
            );
        }
    }

    /// Wakes everyone waiting for eviction progress.
    pub(crate) fn notify_progress(&self) {
        let (m, cv) = &self.progress;
        *m.lock().expect("progress lock") += 1;
        cv.notify_all();
    }

    /// Waits for eviction progress, at most `t`.
    pub(crate) fn wait_progress(&self, t: Duration) {
        let (m, cv) = &self.progress;
        let g = m.lock().expect("progress lock");
        let _ = cv.wait_timeout(g, t).expect("progress lock");
    }

    /// Sleeps for `d` or until `stopping()` (re-checked at every progress signal); returns
    /// whether it is stopping.
    pub(crate) fn sleep_unless(&self, d: Duration, stopping: impl Fn() -> bool) -> bool {
        sleep_on(&self.progress, d, stopping)
    }

    /// Wakes the threads in [`Budget::nap_unless`] (the region is stopping).
    pub(crate) fn wake_nappers(&self) {
        let (m, cv) = &self.quiet;
        let _g = m.lock().expect("nap lock");
        cv.notify_all();
    }

    /// Sleeps for `d` or until `stopping()`, re-checked only when [`Budget::wake_nappers`] is
    /// called: for periodic threads, which eviction batches need not wake (the status thread,
    /// sleeping on the progress signal, woke hundreds of times a second on the program's CPU in
    /// memcached's harness cell). Returns whether it is stopping.
    pub(crate) fn nap_unless(&self, d: Duration, stopping: impl Fn() -> bool) -> bool {
        sleep_on(&self.quiet, d, stopping)
    }

    /// Blocks until `page` leaves the state another thread owns (EVICTING, DISCARDING, ...).
    pub(crate) fn wait_while_busy(
        &self,
        table: &PageTable,
        page: usize,
        stopping: impl Fn() -> bool,
    ) {
        // An install or a prefetch (a few microseconds, and no progress signal at its end)
        // is waited out by yielding; an eviction batch, which signals progress, on the
        // condition variable. (A fork child's redis, discarding each object right after reading
        // it, met prefetches in flight on every other discard: 10 ms sleeps instead made its save
        // several times slower.)
        let spin_until = Instant::now() + Duration::from_micros(200);
        while table.is_busy(page) && Instant::now() < spin_until {
            std::thread::yield_now();
        }
        let (m, cv) = &self.progress;
        let mut g = m.lock().expect("progress lock");
        while table.is_busy(page) && !stopping() {
            g = cv
                .wait_timeout(g, Duration::from_millis(1))
                .expect("progress lock")
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_only_grows_and_its_limit_follows() {
        let b = Budget::new(100, 25);
        assert!(!b.grow(50), "lowering is refused");
        assert_eq!(b.pages(), 100);
        assert!(b.grow(400));
        assert_eq!((b.pages(), b.limit()), (400, 400));
        b.memnode_full.store(true, Ordering::Relaxed);
        assert_eq!(b.limit(), 425, "the overflow allowance stays on top");
        assert!(!b.grow(400), "the same budget again is no growth");
    }
}
