//! The engine: what a region's threads share, as separate parts with one job each.
//!
//! | part | job | used by |
//! |---|---|---|
//! | [`Memory`] | the mapping, its userfaultfd, the page-state table; installing pages | everyone |
//! | [`Budget`] | resident pages against the budget; waiting for eviction | faults, reclaim |
//! | [`Reclaim`] | who evicts and when (Hermit's scheduler, the pool) | faults (charges), reclaim |
//! | policy | eviction order | installs, eviction |
//! | [`Prefetch`] | what to fetch ahead, the staging buffer | faults |
//! | [`WritePredictor`] | which read fetches go in writable | faults |
//! | store | where far pages live ([`PageStore`]) | every thread, through its own handle |
//! | [`RegionCounters`], latency, trace | observation | everyone |
//!
//! Threads get an `Arc<Engine>` but each activity lives in its own module (`fault/handler.rs`,
//! `fault/resolve.rs`, `fault/fetch.rs`, `evict/batch.rs`, `evict/reclaimer.rs`, `evict/watchdog.rs`, `fault/hint_thread.rs`) and
//! touches only the parts above it needs. No part, and not this module, uses an activity's
//! module (`crates/cli/tests/module_graph.rs` checks that no modules import each other in a
//! circle).

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use gleaner_uffd::{FaultKind, Mode};

use crate::config::FarCopies;
use crate::evict::budget::Budget;
use crate::evict::order::EvictionPolicy;
use crate::evict::reclaim::Reclaim;
use crate::fault::predict::WritePredictor;
use crate::fault::prefetch::Prefetch;
use crate::fault::state::PageState;
use crate::memory::mem::Memory;
use crate::observe::counters::{LatencyHistogram, RegionCounters};
use crate::observe::stats::{EvictionStats, FaultStats, RegionStats};
use crate::observe::trace::FaultTrace;
use crate::store::PageStore;

/// Everything a region's threads share.
pub(crate) struct Engine {
    pub(crate) mem: Memory,
    pub(crate) budget: Budget,
    pub(crate) reclaim: Reclaim,
    pub(crate) policy: Mutex<Box<dyn EvictionPolicy>>,
    pub(crate) prefetch: Prefetch,
    pub(crate) writes: WritePredictor,
    pub(crate) store: Box<dyn PageStore>,
    pub(crate) counters: RegionCounters,
    /// Service time of remote faults, from reading the message to waking the thread.
    pub(crate) remote_latency: LatencyHistogram,
    pub(crate) trace: Option<FaultTrace>,
    /// How many pages each eviction batch takes.
    pub(crate) batch: crate::evict::batch_size::BatchSize,
    /// Under `--compress auto` over a link: which compressor each batch uses.
    pub(crate) compressor: crate::codec::choice::CompressorChoice,
    /// Each batch's time from claiming its victims to publishing them: the longest a fault on
    /// one of its pages waits.
    pub(crate) batch_time: LatencyHistogram,
    /// How writes to resident pages are tracked.
    pub(crate) tracking: Tracking,
    /// Which pages drop their far copy when fetched and installed (asynchronous tracking only:
    /// see [`PageStore::forget`]).
    pub(crate) drop_far_copies: crate::config::FarCopies,
    pub(crate) stop: Stop,
    /// Where handlers block in `read` on the userfaultfd: what stops them (`fault/doorbell.rs`).
    /// `None` where the kernel cannot make one read not block: handlers then `poll`.
    pub(crate) doorbell: Option<crate::fault::doorbell::Doorbell>,
    /// Prefetch hints from the program (`Region::prefetch_hint`), for the hint thread.
    pub(crate) hints: crate::fault::hint::Hints,
    /// Closed around a fork: no handler starts on a fault meanwhile.
    pub(crate) gate: Gate,
    /// The threads that evict (fault handlers and reclaim threads), told apart in fault messages.
    pub(crate) evictors: crate::evict::evictors::Evictors,
    /// The program's allocator's memory it can give up without a write-back
    /// ([`crate::RegionConfig::release_hook`]).
    pub(crate) release_hook: Option<fn(usize) -> usize>,
    /// In a fork child: the budget it takes once its parent exits (`evict/inherit.rs`).
    pub(crate) heir: crate::evict::inherit::Heir,
    /// Which resident pages the program wrote since the last look (`evict/access.rs`).
    pub(crate) access: crate::evict::access::AccessScan,
}

/// A gate the fault handlers (and the hint thread) pass to work on pages: a fork closes it and
/// waits until nobody is inside, so the child inherits no page in the middle of an install.
///
/// While it is closed, the faults of the thread that forks are still served, outside the gate
/// (`fault/handler.rs`): between the fork handlers and the fork itself the C library's fork reads and
/// locks memory the program's threads allocated (its name-service state), and that thread then
/// waits for a page that only a handler can fetch. Serving it is safe: the thread is stopped
/// until its page is installed, and only that thread makes the fork.
#[derive(Default)]
pub(crate) struct Gate {
    closed: AtomicBool,
    inside: std::sync::atomic::AtomicUsize,
    /// The thread id of the thread that forks, while the gate is closed (0: none).
    forker: std::sync::atomic::AtomicU32,
    /// When the gate was last closed (for the watchdog: a fork that never ends).
    closed_at: Mutex<Option<std::time::Instant>>,
}

/// Being inside the [`Gate`]; leaving when dropped.
pub(crate) struct Inside<'a>(&'a Gate);

impl Gate {
    /// Waits while the gate is closed, then enters.
    pub(crate) fn enter(&self) -> Inside<'_> {
        loop {
            while self.closed.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_micros(50));
            }
            if let Some(inside) = self.try_enter() {
                return inside;
            }
        }
    }

    /// Enters if the gate is open.
    pub(crate) fn try_enter(&self) -> Option<Inside<'_>> {
        self.inside.fetch_add(1, Ordering::SeqCst);
        if !self.closed.load(Ordering::SeqCst) {
            return Some(Inside(self));
        }
        self.inside.fetch_sub(1, Ordering::SeqCst);
        None
    }

    /// Closes the gate for a fork made by the calling thread (its faults are still served, see
    /// the type's documentation) and waits until everyone inside has left.
    pub(crate) fn close(&self) {
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() } as u32;
        self.forker.store(me, Ordering::SeqCst);
        *self.closed_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::time::Instant::now());
        self.closed.store(true, Ordering::SeqCst);
        while self.inside.load(Ordering::SeqCst) > 0 {
            std::thread::yield_now();
        }
    }

    /// Opens the gate again.
    pub(crate) fn open(&self) {
        self.closed.store(false, Ordering::SeqCst);
        self.forker.store(0, Ordering::SeqCst);
    }

    /// The thread that forks, while the gate is closed.
    pub(crate) fn forker(&self) -> Option<u32> {
        if !self.closed.load(Ordering::SeqCst) {
            return None;
        }
        Some(self.forker.load(Ordering::SeqCst)).filter(|&tid| tid != 0)
    }

    /// How long the gate has been closed (zero when open).
    pub(crate) fn closed_for(&self) -> Duration {
        if !self.closed.load(Ordering::SeqCst) {
            return Duration::ZERO;
        }
        let at = *self.closed_at.lock().unwrap_or_else(|e| e.into_inner());
        at.map_or(Duration::ZERO, |t| t.elapsed())
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How writes to resident pages are tracked (resolved from `RegionConfig::dirty_tracking`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tracking {
    /// A write-protect fault, served by a handler, at a clean page's first write.
    Sync,
    /// `UFFD_FEATURE_WP_ASYNC`: the kernel lets the first write through itself; eviction
    /// learns which pages were written with `PAGEMAP_SCAN`.
    Async,
}

impl Engine {
    /// Whether the region is shutting down.
    pub(crate) fn stopping(&self) -> bool {
        self.stop.requested()
    }

    /// Publishes a completed install (the caller owned `page`) and hands the page to the policy
    /// (`prefetched`: installed ahead of demand).
    pub(crate) fn installed(&self, page: usize, state: PageState, prefetched: bool) {
        let mut policy = self.policy.lock().expect("policy lock");
        self.mem.release(page, state);
        policy.on_install(page, prefetched);
    }

    /// Appends a fault to the fault trace, if one is being recorded.
    pub(crate) fn trace_fault(&self, page: usize, tid: u32, kind: FaultKind) {
        if let Some(t) = &self.trace {
            t.record(self.reclaim.clock_ns(), page, tid, kind);
        }
    }

    /// Blocks until `page` leaves a state another thread owns.
    pub(crate) fn wait_while_busy(&self, page: usize) {
        self.budget
            .wait_while_busy(&self.mem.table, page, || self.stopping());
    }

    /// Tells the reclaim scheduler and the eviction order that the budget is now `pages` (it
    /// grew or shrank at run time: an orphaned fork child's, an elastic one's).
    pub(crate) fn budget_changed(&self, pages: usize) {
        self.reclaim.set_budget(pages);
        self.policy
            .lock()
            .expect("eviction policy lock")
            .set_capacity(pages);
    }

    /// Charges one budget slot to a page about to be installed (a remote page when `refault`
    /// names it), unless room can only be made by reclaiming directly: then it returns false
    /// and takes nothing. Never waits.
    pub(crate) fn try_charge(&self, refault: Option<usize>) -> bool {
        let b = &self.budget;
        loop {
            if b.evict_paused.load(Ordering::SeqCst) {
                // Around fork nothing is evicted, and prepare_fork waits for in-flight installs:
                // they must not wait for budget in turn.
                b.charge_over();
                return true;
            }
            let r = b.resident();
            let full = b.memnode_full.load(Ordering::Relaxed);
            if !full && self.reclaim.direct_need(r) > 0 {
                return false;
            }
            if r >= b.limit() {
                // Past the overflow allowance too (the memnode full): only a demand fault's
                // charge decides whether the program must stop, after trying the memnode once
                // more ([`crate::evict::reclaimer::charge`]); a prefetch or a zero-fill ahead just does without.
                return false;
            }
            if b.resident
                .compare_exchange(r, r + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.reclaim.on_charge(r + 1, refault);
                return true;
            }
        }
    }

    /// `page`, resident by the pager's count, has nothing mapped: the program dropped it behind
    /// the pager's back (a raw madvise system call). Reports it (the first time; the stats count
    /// every one); the caller zero-fills it, what the program's own drop left.
    pub(crate) fn note_dropped_behind_back(&self, page: usize) {
        let level = if RegionCounters::add_first(&self.counters.dropped_behind_back) {
            log::Level::Warn
        } else {
            log::Level::Debug
        };
        log::log!(
            level,
            "page {page} was resident but is gone from memory (dropped behind the pager's back, \
             e.g. by a raw madvise system call): it reads as zeros (`evictions.dropped_behind_back` \
             in the stats counts such pages)"
        );
    }

    /// Drops the far copy of `page`, resident now and owned by the caller (FETCHING, MARKING or
    /// EVICTING), where it is of no further use, as `drop_far_copies` allows (`none` keeps
    /// every copy): a `dirty` page's copy is stale (the page is written back at its next
    /// eviction, whatever the tracking); under asynchronous tracking a fetched page's copy goes
    /// too (`all`, or `demand` for pages not prefetched), since eviction then compares or
    /// rewrites the page anyway. The store drops it: shared memory at once, a socket in batches.
    pub(crate) fn drop_far_copy(&self, page: usize, dirty: bool, prefetched: bool) {
        if !self.keeps_far_copy(dirty, prefetched) {
            self.store.forget(page as u64);
        }
    }

    /// Whether a page just installed keeps its far copy ([`Engine::drop_far_copy`]): `dirty`
    /// when it goes in writable, `prefetched` when a prefetch brought it.
    pub(crate) fn keeps_far_copy(&self, dirty: bool, prefetched: bool) -> bool {
        match (self.drop_far_copies, self.tracking) {
            (FarCopies::None, _) => true,
            (_, Tracking::Sync) => !dirty,
            (FarCopies::All, Tracking::Async) => false,
            (FarCopies::Demand, Tracking::Async) => prefetched,
        }
    }

    /// A snapshot of the region's statistics.
    pub(crate) fn snapshot(&self) -> RegionStats {
        let c = &self.counters;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let remote = get(&c.remote_faults);
        RegionStats {
            size_bytes: self.mem.mapping.len() as u64,
            budget_pages: self.budget.pages() as u64,
            resident_pages: self.budget.resident() as u64,
            remote_pages: self.mem.table.census()[PageState::Remote as usize] as u64,
            faults: FaultStats {
                zero_fill: get(&c.zero_fills),
                zero_filled_ahead: get(&c.zero_filled_ahead),
                remote,
                concurrent_duplicate: get(&c.duplicate_faults),
                write_protect: get(&c.wp_faults),
                waited_on_eviction: get(&c.waited_on_eviction),
                waited_on_budget: get(&c.waited_on_budget),
                prefetch_hit: get(&c.prefetch_hit_faults),
            },
            fault_breakdown: c.breakdown(self.doorbell.is_some()),
            reclaim: self.reclaim.stats(get(&c.zero_fills) + remote),
            evictions: EvictionStats {
                clean: get(&c.evicted_clean),
                dirty: get(&c.evicted_dirty),
                batches: get(&c.evict_batches),
                runs: get(&c.evict_runs),
                aborted: get(&c.evict_aborted),
                raced_writes: get(&c.evict_raced),
                handed_back: get(&c.evict_handed_back),
                scanned_runs: get(&c.evict_scanned_runs),
                dropped_behind_back: get(&c.dropped_behind_back),
                dropped_served_by_watchdog: self.evictors.rescued(),
                watchdog_looks: self.evictors.looked_at(),
                protect_ns: get(&c.evict_protect_ns),
                read_ns: get(&c.evict_read_ns),
                send_ns: get(&c.evict_send_ns),
                drop_ns: get(&c.evict_drop_ns),
                vectored_drop: crate::memory::mapping::vectored_drops(),
                batch_pages_next: self.batch.next(),
                batch_us_per_page: self.batch.us_per_page(),
                lz4_us_per_page: self.compressor.us_per_page()[0],
                zstd_us_per_page: self.compressor.us_per_page()[1],
                batch_time: self.batch_time.summary(),
            },
            discarded_pages: get(&c.discarded),
            reused_pages: get(&c.reused),
            reused_far_pages: get(&c.reused_far),
            surrendered_pages: get(&c.surrendered),
            bytes_in: get(&c.bytes_in),
            bytes_out: get(&c.bytes_out),
            remote_fault_latency: self.remote_latency.summary(),
            policy: self.policy.lock().expect("policy lock").name(),
            access: self.access.stats(),
            prefetch: self
                .prefetch
                .stats(remote, self.batch.prefetch_window_cap()),
            write_prediction: self.writes.stats(),
            hints: crate::observe::stats::HintStats {
                pages_hinted: self.hints.pages_hinted.load(Ordering::Relaxed),
                pages_fetched: self.hints.pages_fetched.load(Ordering::Relaxed),
            },
            memnode: self.store.describe(),
            store: self.store.stats(),
            dirty_tracking: match self.tracking {
                Tracking::Async => "async",
                Tracking::Sync => "sync",
            },
            uffd_mode: match self.mem.uffd.mode() {
                Mode::Full => "full",
                Mode::UserOnly => "user-only",
            },
        }
    }
}

/// The stop signal: a flag, and an eventfd that wakes threads blocked in `poll`.
pub(crate) struct Stop {
    flag: AtomicBool,
    fd: OwnedFd,
}

impl Stop {
    /// A stop signal not yet given.
    pub(crate) fn new() -> std::io::Result<Stop> {
        Ok(Stop {
            flag: AtomicBool::new(false),
            fd: gleaner_fds::make_held(|| gleaner_sys::eventfd::eventfd(true))?,
        })
    }

    /// Whether stopping was requested.
    pub(crate) fn requested(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// The descriptor that becomes readable once stopping is requested.
    pub(crate) fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Requests stopping and wakes every thread polling [`Stop::fd`].
    pub(crate) fn request(&self) {
        self.flag.store(true, Ordering::Release);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our own eventfd.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}
