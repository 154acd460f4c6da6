//! Resolving one fault message: the page-state machine of `fault/state.rs` driven from a handler.
//!
//! A handler never dereferences the region: it installs pages with `UFFDIO_COPY` from memory
//! outside it (the zero page, a store's data, a staging buffer) and changes protection with
//! ioctls. So it can never fault on memory it is itself responsible for serving.

use std::time::Instant;

use gleaner_uffd::{Event, FaultKind};

use crate::engine::Engine;
use crate::evict::batch::Evictor;
use crate::fatal::fatal;
use crate::fault::fetch::{self, lost, PrefetchBufs};
use crate::fault::state::PageState;
use crate::memory::mem::MAX_ZERO_RUN;
use crate::observe::counters::RegionCounters;
use crate::store::{page_buf, PageBuf, StoreHandle};

/// What one handler thread owns: its store handle and scratch state.
pub(crate) struct Handler {
    pub(crate) store: Box<dyn StoreHandle>,
    /// Opened on the first direct reclaim (the last resort, or every fault in `direct` mode).
    pub(crate) evictor: Option<Evictor>,
    /// Prefetch candidates and the pages claimed for a prefetch.
    prefetch: PrefetchBufs,
    /// A copy of a fetched page, kept while a direct reclaim reuses the store handle.
    stash: PageBuf,
    /// Sequential first touches: the page expected next if the program keeps filling memory in
    /// order, and how far ahead the last fill went.
    zero_next: usize,
    zero_window: usize,
    /// Remote faults served, to pick the ones whose install is timed.
    remote_served: u32,
    /// Serving the faults of a thread that forks ([`Handler::serve_forker`]): no prefetch, which
    /// would go on installing pages after the faulting thread is woken, and so during its fork.
    skip_prefetch: bool,
}

/// One remote fault in this many is timed: its steps (`fault_breakdown`), its install and its whole
/// service time (`remote_fault_latency`). Timing the install takes a separate wake, one more system
/// call ([`crate::memory::mem::Memory::install_timed`]), and the steps' clock reads and counters
/// cost every fault a measurable share of a handler's time when all are timed (`bench micro
/// --pattern random` on the 2-vCPU VM, alternated against timing every fault:
/// `bench/results/sampled-timing/README.md`).
pub(crate) const TIMED_INSTALL_EVERY: u32 = 8;

impl Handler {
    /// A handler using `store`.
    pub(crate) fn new(store: Box<dyn StoreHandle>) -> Handler {
        Handler {
            store,
            evictor: None,
            prefetch: PrefetchBufs::default(),
            stash: page_buf(),
            zero_next: usize::MAX,
            zero_window: 0,
            remote_served: 0,
            skip_prefetch: false,
        }
    }

    /// Around a fork, with the gate closed (`engine.rs`'s `Gate`): serves the faults of the
    /// thread that forks (`forker`) among `events`, taking them out, and leaves the others. Each
    /// is done when its thread wakes: nothing of it runs on into the fork.
    pub(crate) fn serve_forker(&mut self, engine: &Engine, forker: u32, events: &mut Vec<Event>) {
        self.skip_prefetch = true;
        events.retain(|ev| match *ev {
            Event::Fault { kind, addr, tid } if tid == forker => {
                self.on_fault(engine, kind, addr, tid);
                false
            }
            _ => true,
        });
        self.skip_prefetch = false;
    }

    /// Serves `events` (read from the userfaultfd, drained here). The evicting threads' faults
    /// go first: the batch of one of them may be what another fault of `events` would wait for
    /// (its budget slot), and a handler holding that message while it waits would wait forever.
    pub(crate) fn serve(&mut self, engine: &Engine, events: &mut Vec<Event>) {
        if events.len() > 1 {
            // Stable, and without allocating for a batch of this size.
            events.sort_by_key(
                |ev| !matches!(ev, Event::Fault { tid, .. } if engine.evictors.contains(*tid)),
            );
        }
        for ev in events.drain(..) {
            match ev {
                Event::Fault { kind, addr, tid } => self.on_fault(engine, kind, addr, tid),
                other => log::warn!("unexpected userfaultfd event {other:?}; ignored"),
            }
        }
    }

    /// Resolves one fault message.
    pub(crate) fn on_fault(&mut self, engine: &Engine, kind: FaultKind, addr: usize, tid: u32) {
        if crate::observe::stuck::is_test_page(addr) {
            return; // The test hook's page is never served (`observe/stuck.rs`).
        }
        let Some(page) = engine.mem.page_of(addr) else {
            log::warn!("fault at {addr:#x} outside the region; ignored");
            return;
        };
        log::trace!(
            "fault {kind:?} at {addr:#x} (page {page}, {:?})",
            engine.mem.table.get(page)
        );
        engine.trace_fault(page, tid, kind);
        match kind {
            FaultKind::WriteProtect => on_write_protect(engine, page),
            FaultKind::MissingRead => self.on_missing(engine, page, tid, false),
            FaultKind::MissingWrite => self.on_missing(engine, page, tid, true),
            FaultKind::Minor => log::warn!("unexpected minor fault at {addr:#x}"),
        }
        // Only now, with the faulting thread on its way, may a reclaim thread this fault's
        // charges asked for take the CPU.
        engine.reclaim.wake_deferred();
    }

    /// A missing page was touched.
    fn on_missing(&mut self, engine: &Engine, page: usize, tid: u32, write: bool) {
        if let Some(zeroed) = engine.evictors.serve_fault(&engine.mem, tid, page) {
            // An evicting thread (a reclaim thread, or a handler reclaiming directly) found
            // nothing mapped on a page it was taking into its pipe: the program dropped it
            // behind the pager's back (a raw madvise system call), so it reads as zeros, which
            // the batch then writes back. Waiting for that batch would wait forever; fetching
            // the page for it (the message already served: stale) would be wasted.
            // (`evict/evictors.rs` has the details.)
            if zeroed {
                engine.note_dropped_behind_back(page);
            }
            return;
        }
        // Read the clock only if the next remote fault is timed (this one, should it be remote).
        let started = self
            .remote_served
            .wrapping_add(1)
            .is_multiple_of(TIMED_INSTALL_EVERY)
            .then(Instant::now);
        let c = &engine.counters;
        let table = &engine.mem.table;
        loop {
            match table.get(page) {
                PageState::Absent => {
                    if !table.transition(page, PageState::Absent, PageState::Fetching) {
                        continue;
                    }
                    crate::evict::reclaimer::charge(
                        engine,
                        &mut *self.store,
                        &mut self.evictor,
                        None,
                    );
                    // First touch never goes to the network. A program filling memory in order
                    // (upward or downward) gets the neighbouring pages zero-filled with this one.
                    let (first, count) = self.zero_run(engine, page);
                    if count == 1 {
                        engine.mem.install_zero(page);
                    } else {
                        engine.mem.install_zero_run(first, count);
                    }
                    for q in first..first + count {
                        engine.installed(q, PageState::Dirty, false);
                    }
                    RegionCounters::add(&c.zero_fills, 1);
                    RegionCounters::add(&c.zero_filled_ahead, count as u64 - 1);
                    return;
                }
                PageState::Remote => {
                    if !table.transition(page, PageState::Remote, PageState::Fetching) {
                        continue;
                    }
                    if let Some(st) = engine.prefetch.take_staged(page) {
                        // A prefetched page's first use: its data is here and it holds its slot.
                        let writable = if write {
                            engine.writes.on_write_fetch(page);
                            true
                        } else {
                            engine.writes.install_writable(page)
                        };
                        fetch::install_fetched(engine, page, &st.data[..], writable, false);
                        RegionCounters::add(&c.prefetch_hit_faults, 1);
                        self.prefetch.candidates.clear();
                        engine.prefetch.on_fault(
                            page,
                            tid,
                            Some(&st.window),
                            &mut self.prefetch.candidates,
                        );
                        if !self.skip_prefetch {
                            fetch::prefetch(engine, &mut *self.store, &mut self.prefetch);
                        }
                        return;
                    }
                    self.fetch_remote(engine, page, tid, write, started);
                    return;
                }
                PageState::Prefetching => {
                    // Its prefetch is in flight: do not fetch it again. Claiming it makes the
                    // prefetching handler install it (and wake this thread) on arrival.
                    if table.transition(page, PageState::Prefetching, PageState::Fetching) {
                        engine.prefetch.count_late();
                        return;
                    }
                }
                st @ (PageState::Fetching | PageState::Marking) => {
                    // Another handler owns this page; its install (or unprotect) wakes our
                    // thread, or its release does (see `fault/state.rs`), unless it just ended.
                    if table.defer_to_owner(page, st) {
                        RegionCounters::add(&c.duplicate_faults, 1);
                        return;
                    }
                }
                st @ (PageState::Clean | PageState::Dirty) => {
                    // Installed since this message was queued (the installer's wake may have
                    // raced with the thread going to sleep: wake again), or dropped behind the
                    // pager's back (a raw madvise system call): then nothing is mapped there and
                    // it reads as zeros, as after the program's own drop.
                    if !table.transition(page, st, PageState::Fetching) {
                        continue;
                    }
                    if engine.mem.install_zero_if_missing(page) {
                        engine.note_dropped_behind_back(page);
                        engine.mem.release(page, PageState::Dirty);
                    } else {
                        RegionCounters::add(&c.duplicate_faults, 1);
                        engine.mem.release(page, st);
                    }
                    return;
                }
                PageState::Evicting => {
                    // Left asleep for the batch to wake (see `fault/state.rs`), unless it just ended;
                    // the batch hands the page back early if it can (`evict/batch.rs`).
                    if table.defer_to_owner(page, PageState::Evicting) {
                        RegionCounters::add(&c.waited_on_eviction, 1);
                        engine.evictors.page_wanted();
                        return;
                    }
                }
                PageState::Discarding => {
                    RegionCounters::add(&c.waited_on_eviction, 1);
                    engine.wait_while_busy(page);
                }
                PageState::Foreign => {
                    // A fault queued just before the program mapped something else here: its
                    // retry reaches that mapping (or faults again until it is in place).
                    RegionCounters::add(&c.duplicate_faults, 1);
                    engine.mem.wake(page);
                    return;
                }
            }
        }
    }

    /// The run of pages to zero-fill with `page` (a first touch being served), as its first page
    /// and length, `page` in it: `page` alone unless the first touches come in order. Upward:
    /// where this one continues the fill this handler served last, a window doubling from 8 to
    /// [`MAX_ZERO_RUN`]` - 1` pages after `page` while the fill goes on, like readahead; else,
    /// where the pages just before `page` are touched already (the fill went on through another
    /// handler, or another fill came between), as many pages after it as that run of touched
    /// pages is long, rounded up to a power of two, from 8. Downward, the same by the pages just
    /// after `page`: memory is filled from its end too (glibc's `memmove` of a large block into
    /// fresh memory copied so here). Claims the pages (ABSENT → FETCHING) and their budget
    /// slots, stopping at the first page already touched or the first slot only direct reclaim
    /// could free.
    fn zero_run(&mut self, engine: &Engine, page: usize) -> (usize, usize) {
        let table = &engine.mem.table;
        let pages = engine.mem.pages();
        let below = |d: usize| page.checked_sub(d);
        let above = |d: usize| Some(page + d).filter(|&q| q < pages);
        // How many pages in a row, going one way from `page`, are touched already.
        let touched = |at: &dyn Fn(usize) -> Option<usize>| {
            (1..MAX_ZERO_RUN)
                .take_while(|&d| at(d).is_some_and(|q| table.get(q) != PageState::Absent))
                .count()
        };
        let window = |run: usize| match run {
            0 => 0,
            run => run.next_power_of_two().clamp(8, MAX_ZERO_RUN - 1),
        };
        self.zero_window = if page == self.zero_next {
            (self.zero_window * 2).clamp(8, MAX_ZERO_RUN - 1)
        } else {
            window(touched(&below))
        };
        if self.zero_window > 0 {
            let ahead = claim_zero_fill(engine, self.zero_window, &above);
            self.zero_next = page + ahead + 1;
            return (page, 1 + ahead);
        }
        let behind = claim_zero_fill(engine, window(touched(&above)), &below);
        self.zero_next = page + 1;
        (page - behind, 1 + behind)
    }

    /// Fetches `page` (owned in FETCHING) from the store and installs it.
    fn fetch_remote(
        &mut self,
        engine: &Engine,
        page: usize,
        tid: u32,
        write: bool,
        started: Option<Instant>,
    ) {
        let c = &engine.counters;
        // The request goes out first; the budget bookkeeping (and asking the prefetcher)
        // overlaps with the memnode's answer where there is one.
        let ids = [page as u64];
        if let Err(e) = self.store.request(&ids) {
            lost(engine, page, &e);
        }
        let charged = engine.try_charge(Some(page));
        self.prefetch.candidates.clear();
        engine
            .prefetch
            .on_fault(page, tid, None, &mut self.prefetch.candidates);
        // `on_missing` read the clock for this fault if it is the one in TIMED_INSTALL_EVERY.
        self.remote_served = self.remote_served.wrapping_add(1);
        let timed = started.is_some();
        debug_assert_eq!(
            timed,
            self.remote_served.is_multiple_of(TIMED_INSTALL_EVERY)
        );
        let looked_up = started.map(|_| Instant::now());
        // A page seen rewritten goes in writable (no write-protect fault to follow).
        let writable = if write {
            engine.writes.on_write_fetch(page);
            true
        } else {
            engine.writes.install_writable(page)
        };
        // The install of an untimed fault wakes its thread itself.
        let install = |data: &[u8]| {
            if timed {
                Some(fetch::install_fetched_timed(engine, page, data, writable))
            } else {
                fetch::install_fetched(engine, page, data, writable, false);
                None
            }
        };
        let mut fetched = None;
        let mut mapped = None;
        let stash = &mut self.stash;
        let r = self.store.receive(&mut |_, data| {
            if timed {
                fetched = Some(Instant::now());
            }
            if charged {
                mapped = install(data);
            } else {
                // Only a direct reclaim makes room, and it needs the store handle whose buffer
                // holds the page: keep a copy meanwhile.
                stash.copy_from_slice(data);
            }
        });
        if let Err(e) = r {
            lost(engine, page, &e);
        }
        if !charged {
            crate::evict::reclaimer::charge(
                engine,
                &mut *self.store,
                &mut self.evictor,
                Some(page),
            );
            if timed {
                fetched = Some(Instant::now());
            }
            mapped = install(&self.stash[..]);
        }
        RegionCounters::add(&c.remote_faults, 1);
        RegionCounters::add(&c.bytes_in, crate::PAGE_SIZE as u64);
        if let (Some(started), Some(looked_up), Some(fetched), Some(mapped)) =
            (started, looked_up, fetched, mapped)
        {
            RegionCounters::add(&c.timed_faults, 1);
            RegionCounters::add(&c.lookup_ns, (looked_up - started).as_nanos() as u64);
            RegionCounters::add(&c.fetch_ns, (fetched - looked_up).as_nanos() as u64);
            RegionCounters::add(&c.timed_installs, 1);
            RegionCounters::add(&c.install_ns, (mapped - fetched).as_nanos() as u64);
            engine.remote_latency.record(mapped - started);
        }
        if !self.skip_prefetch {
            fetch::prefetch(engine, &mut *self.store, &mut self.prefetch);
        }
    }
}

/// A write hit a write-protected (clean) page.
fn on_write_protect(engine: &Engine, page: usize) {
    let c = &engine.counters;
    let mem = &engine.mem;
    loop {
        match mem.table.get(page) {
            PageState::Clean => {
                if !mem
                    .table
                    .transition(page, PageState::Clean, PageState::Marking)
                {
                    continue;
                }
                // Unprotect (and wake the writer) *before* publishing DIRTY: the evictor claims
                // only CLEAN or DIRTY pages, so it can never write-protect this page in between
                // and then see its protection lifted underneath it.
                if let Err(e) =
                    mem.uffd
                        .write_protect(mem.addr_of(page), crate::PAGE_SIZE, false, true)
                {
                    fatal(&format!("lifting write protection on page {page}: {e}"));
                }
                engine.writes.on_tracked_write(page);
                // Still ours (MARKING): its far copy is stale now.
                engine.drop_far_copy(page, true, false);
                mem.release(page, PageState::Dirty);
                engine.policy.lock().expect("policy lock").on_access(page);
                RegionCounters::add(&c.wp_faults, 1);
                return;
            }
            PageState::Evicting => {
                // Being written back or dropped: the batch wakes the thread when it is done
                // (see `fault/state.rs`); the retry finds the page kept or missing (refetched).
                if mem.table.defer_to_owner(page, PageState::Evicting) {
                    RegionCounters::add(&c.waited_on_eviction, 1);
                    engine.evictors.page_wanted();
                    return;
                }
            }
            PageState::Discarding => {
                // Being discarded. Wait, then let the thread retry: it finds the page missing
                // (zero-fill).
                RegionCounters::add(&c.waited_on_eviction, 1);
                engine.wait_while_busy(page);
                mem.wake(page);
                return;
            }
            PageState::Marking => {
                // Another handler is lifting the protection; that ioctl wakes our thread, or
                // its release does (see `fault/state.rs`), unless it just ended.
                if mem.table.defer_to_owner(page, PageState::Marking) {
                    RegionCounters::add(&c.duplicate_faults, 1);
                    return;
                }
            }
            PageState::Fetching => {
                // A read fault's install maps the page write-protected and wakes the thread
                // *before* its handler publishes CLEAN; a write that follows at once lands here.
                // Nobody else will wake this thread: wait for CLEAN (a few instructions away on
                // the other handler), then lift the protection like any other WP fault.
                while mem.table.get(page) == PageState::Fetching {
                    std::thread::yield_now();
                }
            }
            PageState::Dirty
            | PageState::Remote
            | PageState::Absent
            | PageState::Prefetching
            | PageState::Foreign => {
                // Stale message: already writable, or gone (the retry will fault as missing, or
                // reach what the program mapped there).
                RegionCounters::add(&c.duplicate_faults, 1);
                mem.wake(page);
                return;
            }
        }
    }
}

/// Claims up to `window` pages for a zero-fill run, the `d`-th at `at(d)` (`None`: beyond the
/// region): each ABSENT → FETCHING with its budget slot, stopping at the first page already
/// touched or the first slot only direct reclaim could free. Returns how many it claimed.
fn claim_zero_fill(engine: &Engine, window: usize, at: &dyn Fn(usize) -> Option<usize>) -> usize {
    let mut claimed = 0;
    while claimed < window {
        let Some(q) = at(claimed + 1) else { break };
        if !engine
            .mem
            .table
            .transition(q, PageState::Absent, PageState::Fetching)
        {
            break;
        }
        if !engine.try_charge(None) {
            engine.mem.release(q, PageState::Absent);
            break;
        }
        claimed += 1;
    }
    claimed
}
