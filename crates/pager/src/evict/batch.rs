//! Evicting one batch of pages (run by reclaim threads, or by a faulting thread as the last
//! resort; `evict/reclaim.rs` decides who and when, `evict/reclaimer.rs` runs them).
//!
//! # The drop: a pipe holds the pages, one TLB flush drops them all
//!
//! A batch must never lose a write that races with it, and on a VM every TLB flush that reaches
//! another CPU is expensive (an inter-processor interrupt through the hypervisor). Victims of a
//! real program are scattered: write-protecting or moving them costs a flush per run of consecutive
//! pages (memcached's victims are nearly all runs of one). So the batch takes the victims' pages
//! into a pipe first (`vmsplice`: the pipe holds references to the pages themselves, no copy), then
//! drops every victim with one vectored `MADV_DONTNEED` (one flush for the batch), then reads the
//! pages out of the pipe. A write that lands before the drop is in the page the pipe holds; one
//! after it finds the page missing and waits for the batch to finish (its state is EVICTING), then
//! fetches it back. What the pipe gives back is therefore exactly the page's last contents.
//! (Measured on the 2-vCPU VM with writers on both CPUs, several times cheaper per scattered page
//! than write-protecting one or lazily freeing and paging out one:
//! `docs/decisions/0003-eviction-through-a-pipe.md`.)
//!
//! This needs the pages to be the program's own (a write must land in the page the pipe holds,
//! not in a copy): never the shared zero page (first touches get private zero pages), and no page
//! still shared with a fork child. Pages resident at a fork are marked; before they are taken
//! into the pipe a write fault is forced on them (`MADV_POPULATE_WRITE`), which gives the program
//! its own copy, or they are write-protected first (synchronous tracking).
//!
//! # Which pages are written back
//!
//! * **Asynchronous tracking** (`UFFD_FEATURE_WP_ASYNC`): pages are installed write-protected and
//!   the kernel lets the first write through itself. A `PAGEMAP_SCAN` before the drop says which
//!   victims were written since they were installed, or since the access scan last protected
//!   them again (`evict/access.rs`); those are written back. The others are compared with their far
//!   copy after the drop (a write could have landed between the scan and the drop, or before
//!   an access scan) and written back only if they differ; where the far copy cannot be
//!   compared (a socket), they are written back. The written bit is therefore only a shortcut:
//!   no victim's data depends on it.
//!
//!   A victim without a far copy (the default drops a page's far copy when it is fetched) is
//!   written back whatever the scan says, and so is every victim over a socket: a reclaim
//!   thread scans only the runs that hold a victim whose far copy the store can compare. The
//!   scan was one system call per run of consecutive victims (memcached's runs are short), a
//!   measurable share of the reclaim thread's time per evicted page
//!   (`bench/results/scan-skip-ab/README.md`). What it also told, that a victim is still
//!   mapped, is then learnt otherwise: a page the program dropped behind the pager's back (a raw
//!   `madvise` system call) faults when the pipe takes it, and the fault handler, seeing the
//!   fault come from a reclaim thread on a page being evicted, installs zeros there (what the
//!   program would read after its own drop), which are written back. (Handlers never wait for a
//!   batch: `fault/state.rs`.) A fault handler reclaiming directly scans every run, so that a fault
//!   of its own, which another handler must serve, stays rare: only a page dropped between that
//!   scan and the pipe (microseconds) makes its pipe fault. Should every handler be stuck at
//!   once, a watchdog thread zero-fills the victims of a batch stuck in its pipe
//!   (`evict/evictors.rs`).
//! * **Synchronous tracking**: a clean page is write-protected, so a write to a victim blocks in a
//!   write-protect fault until the batch is over; only dirty victims go through the pipe and back.
//!
//! # A fault on a victim: handed back, not kept waiting
//!
//! A fault on a victim is left waiting for the batch (`fault/state.rs`), but not necessarily for
//! all of it. Once the pipe is read, the batch holds each captured victim's latest contents, as
//! Linux's swap cache holds a page whose write-out is in flight: the handler that leaves the fault
//! waiting tells the evicting threads (`evict/evictors.rs`: a flag, and a bell for a thread waiting
//! on its memnode), and the batch installs the page again from its copy, writable, at once: after
//! reading the pipe, before each page it encodes (over a slow link zstd encoding a batch takes long
//! enough to matter: `bench/results/handback-staging/README.md`), whenever the bell rings while its
//! write-back is in flight, and before publishing ([`hand_back_if_wanted`]). The page stays
//! resident and dirty. Clean victims that synchronous tracking did not capture have exact far
//! copies, stored long before: they are published as soon as they are dropped
//! ([`Evictor::publish_clean_early`]), and a fault waiting on one fetches it without waiting for
//! the others' write-back.
//!
//! If the memnode refuses the write (full), the dropped pages whose far copy is stale are put
//! back from the copies read out of the pipe, and the region keeps them locally while it can.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gleaner_uffd::pagemap::{
    PageRegion, Pagemap, PAGE_IS_PRESENT, PAGE_IS_SWAPPED, PAGE_IS_WRITTEN,
};

use crate::codec::choice::Compressor;
use crate::engine::{Engine, Tracking};
use crate::fatal::fatal;
use crate::fault::state::PageState;
use crate::observe::counters::RegionCounters;
use crate::runs::runs;
use crate::store::{Bell, StoreError, StoreHandle};
use crate::PAGE_SIZE;

/// One evicting thread's tools: the capture pipe, its views of the region's memory and its
/// scratch lists. Reclaim threads own one each; a fault handler makes one when it first has to
/// reclaim directly.
pub(crate) struct Evictor {
    /// This thread's slot among the region's evicting threads (`evict/evictors.rs`).
    slot: usize,
    /// Scan every run, not only those with a far copy to compare (an evictor running in a
    /// fault handler: see the module's doc).
    scan_all: bool,
    pipe: Pipe,
    pagemap: Pagemap,
    candidates: Vec<usize>,
    /// Claimed victims, sorted by page.
    victims: Vec<Victim>,
    /// Page numbers handed to the store.
    ids: Vec<u64>,
    /// Runs of consecutive victims, `(first page, count)`.
    runs: Vec<(usize, usize)>,
    scan: Vec<PageRegion>,
    /// The captured pages, in victim order (only the captured ones).
    scratch: Vec<u8>,
}

/// A claimed page and what the batch learns about it.
#[derive(Debug, Clone, Copy)]
struct Victim {
    page: usize,
    /// Its state when claimed (CLEAN or DIRTY).
    was: PageState,
    /// Written since installed (asynchronous tracking's scan).
    written: bool,
    /// Taken into the pipe: its last contents are in `scratch` at `captured_at`.
    captured: Option<usize>,
    /// Its far copy is stale: written back (or put back if the store refuses).
    stale: bool,
    /// Resident at a fork of the process (may still be shared with the child).
    forked: bool,
    /// The pipe could not take it (the program made it inaccessible, e.g. `PROT_NONE`): it
    /// stays resident, as it was.
    skipped: bool,
    /// A fault waited for it and the batch installed it again from its captured contents
    /// ([`hand_back_if_wanted`]): it stays resident, dirty.
    handed_back: bool,
    /// Already published REMOTE, ahead of the batch ([`Evictor::publish_clean_early`]).
    published: bool,
}

impl Evictor {
    /// Opens what eviction needs (stopping the program if that fails: it cannot evict without).
    /// Called on the thread that will use it, which it registers as an evicting thread of
    /// `s`. `in_handler`: the evictor runs in a fault handler (direct reclaim), whose own faults
    /// no other handler may be free to serve.
    pub(crate) fn new(s: &Engine, in_handler: bool) -> Evictor {
        Evictor::try_new(s, in_handler).unwrap_or_else(|e| fatal(&e))
    }

    /// As [`Evictor::new`], but says what failed instead of stopping the program.
    pub(crate) fn try_new(s: &Engine, in_handler: bool) -> Result<Evictor, String> {
        let batch = s.batch.max();
        // Three descriptors, made mid-run where the program may hold all the others.
        let (pipe, pagemap) = gleaner_fds::with_room_retrying(
            3,
            || {
                let pipe = Pipe::new(batch).map_err(|e| ("making the eviction pipe", e))?;
                let pagemap =
                    Pagemap::open().map_err(|e| ("opening /proc/self/pagemap for eviction", e))?;
                Ok((pipe, pagemap))
            },
            |(_, e)| gleaner_fds::is_out_of_numbers(e),
        )
        .map_err(|(what, e)| format!("{what}: {e}"))?;
        Ok(Evictor {
            slot: s.evictors.register_current(),
            scan_all: in_handler,
            pipe,
            pagemap,
            candidates: Vec::new(),
            victims: Vec::new(),
            ids: Vec::new(),
            runs: Vec::new(),
            scan: Vec::new(),
            scratch: Vec::new(),
        })
    }

    /// This thread's slot among the region's evicting threads.
    pub(crate) fn slot(&self) -> usize {
        self.slot
    }

    /// The pagemap file this evictor scans victims through (the access scan uses it too).
    pub(crate) fn pagemap(&self) -> &Pagemap {
        &self.pagemap
    }

    /// Evicts one batch through `store`. Returns the number of pages evicted (0 when nothing
    /// could be claimed or the memnode refused the write).
    pub(crate) fn evict_batch(&mut self, s: &Engine, store: &mut dyn StoreHandle) -> usize {
        let c = &s.counters;
        let mem = &s.mem;
        let started = Instant::now();
        self.claim(s);
        if self.victims.is_empty() {
            return 0;
        }
        self.runs = runs(self.victims.iter().map(|v| v.page));
        let t0 = Instant::now();
        // Which victims may be written back: all of them under asynchronous tracking (a clean
        // one may be written meanwhile), dirty ones under synchronous tracking.
        let async_wp = s.tracking == Tracking::Async;
        for v in self.victims.iter_mut() {
            v.stale = !async_wp && v.was == PageState::Dirty;
        }
        // Room first: once dropped, a page's new contents must have a place to go.
        self.ids.clear();
        self.ids.extend(
            self.victims
                .iter()
                .filter(|v| async_wp || v.stale)
                .map(|v| v.page as u64),
        );
        match store.reserve(&self.ids) {
            Ok(()) => {}
            Err(StoreError::Full(why)) => {
                self.undo_claim(s, &why);
                return 0;
            }
            // Only a prefetch is ever late.
            Err(StoreError::Lost(why) | StoreError::Late(why)) => self.lost(s, &why),
        }
        self.prepare_forked(s, async_wp);
        self.scan_victims(s, store);
        let t1 = Instant::now();
        // Take the pages that may be written back into the pipe, then drop every victim.
        let mut captured = 0;
        for v in self.victims.iter_mut() {
            if async_wp || v.stale {
                v.captured = Some(captured);
                captured += 1;
            }
        }
        let take = runs(
            self.victims
                .iter()
                .filter(|v| v.captured.is_some())
                .map(|v| v.page),
        );
        s.evictors.begin_capture(self.slot, &take);
        let refused = match self.pipe.capture(|p| mem.addr_of(p), &take) {
            Ok(refused) => refused,
            Err(e) => fatal(&format!("taking pages being evicted into the pipe: {e}")),
        };
        // Before any victim is dropped: the watchdog zero-fills a page only while it is here.
        s.evictors.end_capture(self.slot);
        if !refused.is_empty() {
            captured = self.skip(&refused);
        }
        let dropped = if refused.is_empty() {
            std::mem::take(&mut self.runs)
        } else {
            runs(self.victims.iter().filter(|v| !v.skipped).map(|v| v.page))
        };
        if let Err(e) = mem.mapping.discard_ranges(&dropped) {
            fatal(&format!("dropping evicted pages: {e}"));
        }
        if refused.is_empty() {
            self.runs = dropped;
        }
        // Grown (and zeroed) only up to the largest batch so far: the read overwrites the part
        // in use, and batches of varying size do not pay a memset each.
        let need = captured * PAGE_SIZE;
        if self.scratch.len() < need {
            self.scratch.resize(need, 0);
        }
        if let Err(e) = self.pipe.read(&mut self.scratch[..need]) {
            fatal(&format!("reading evicted pages back from the pipe: {e}"));
        }
        hand_back_if_wanted(s, self.slot, &mut self.victims, &self.scratch);
        if !async_wp {
            self.publish_clean_early(s);
        }
        let t2 = Instant::now();
        // Decide what goes back, then store it.
        let mut raced = 0;
        for v in self.victims.iter_mut() {
            let Some(i) = v.captured else { continue };
            if async_wp {
                let data = &self.scratch[i * PAGE_SIZE..][..PAGE_SIZE];
                v.stale = v.written
                    || match store.far_copy_matches(v.page as u64, data) {
                        Some(true) => false,
                        // Written between the scan and the drop.
                        Some(false) => {
                            raced += 1;
                            true
                        }
                        // No far copy (dropped when fetched, or a socket that cannot compare).
                        None => true,
                    };
            }
        }
        self.ids.clear();
        self.ids.extend(
            self.victims
                .iter()
                .filter(|v| v.stale && v.captured.is_some())
                .map(|v| v.page as u64),
        );
        let mut refused = None;
        let written = self.ids.len();
        let mut committing = None;
        // `--compress auto` over a link: this batch's compressor, and what encoding took.
        let compressor = s.compressor.pick();
        let choosing = store.choose_compressor(compressor == Compressor::Zstd);
        let mut encoding = Duration::ZERO;
        if !self.ids.is_empty() {
            let scratch: &[u8] = &self.scratch;
            let (slot, victims) = (self.slot, &mut self.victims);
            // The staged pages are the stale captured victims, in victim order.
            let mut next = 0;
            let staging = Instant::now();
            let r = store.stage(&self.ids, &mut move |_| {
                // A fault waiting for a page of the batch gets it back now, not once the whole
                // batch is encoded.
                hand_back_if_wanted(s, slot, victims, scratch);
                while !(victims[next].stale && victims[next].captured.is_some()) {
                    next += 1;
                }
                let i = victims[next].captured.expect("one victim per staged page");
                next += 1;
                &scratch[i * PAGE_SIZE..][..PAGE_SIZE]
            });
            if let Err(e) = r {
                self.lost(s, &e.to_string());
            }
            committing = Some(Instant::now());
            encoding = staging.elapsed();
            // While the memnode has the write (long over a slow link), a fault that waits for a
            // page of the batch rings the bell, and the page is handed back at once.
            let slot = self.slot;
            let bell = s.evictors.begin_commit(slot);
            let (victims, scratch) = (&mut self.victims, &self.scratch);
            hand_back_if_wanted(s, slot, victims, scratch);
            let mut on_ring = || {
                s.evictors.reset_bell(slot);
                hand_back_if_wanted(s, slot, victims, scratch);
            };
            let r = store.commit_watching(Some(Bell {
                fd: bell,
                on_ring: &mut on_ring,
            }));
            s.evictors.end_commit(slot);
            match r {
                Ok(()) => s.budget.memnode_full.store(false, Ordering::Relaxed),
                Err(StoreError::Full(why)) => refused = Some(why),
                Err(StoreError::Lost(why) | StoreError::Late(why)) => self.lost(s, &why),
            }
        }
        hand_back_if_wanted(s, self.slot, &mut self.victims, &self.scratch);
        let t3 = Instant::now();
        // A refused write-back says nothing about how long one takes.
        let committed = if refused.is_none() { written } else { 0 };
        let kept = if let Some(why) = refused {
            // Nothing reached the store: put the stale pages back (writable, dirty) from what the
            // pipe gave; the others' far copies are exact, so they may stay remote.
            let mut kept = Vec::new();
            for v in self.victims.iter().filter(|v| v.stale && !v.handed_back) {
                if let Some(i) = v.captured {
                    mem.install(v.page, &self.scratch[i * PAGE_SIZE..][..PAGE_SIZE], true);
                    kept.push(v.page);
                }
            }
            s.budget.note_memnode_full(&why);
            RegionCounters::add(&c.evict_aborted, 1);
            kept
        } else {
            Vec::new()
        };
        let evicted = self.publish(s, &kept);
        // The store's time per page written sizes the next batch; the whole batch's time is how
        // long a fault on one of its pages may have waited.
        let commit_time = committing.map_or(Duration::ZERO, |c| t3 - c);
        s.batch.observed(committed, commit_time);
        if choosing {
            s.compressor
                .observed(compressor, committed, encoding, commit_time);
        }
        s.batch_time.record(started.elapsed());
        RegionCounters::add(&c.evict_raced, raced);
        RegionCounters::add(&c.evict_protect_ns, (t1 - t0).as_nanos() as u64);
        RegionCounters::add(&c.evict_drop_ns, (t2 - t1).as_nanos() as u64);
        RegionCounters::add(&c.evict_send_ns, (t3 - t2).as_nanos() as u64);
        evicted
    }

    /// Leaves the victims whose pages the pipe refused resident (they are not dropped and keep
    /// their state) and renumbers the captured ones. Returns how many are captured.
    fn skip(&mut self, refused: &[usize]) -> usize {
        let mut captured = 0;
        for v in self.victims.iter_mut() {
            if refused.binary_search(&v.page).is_ok() {
                v.skipped = true;
                v.stale = false;
                v.captured = None;
            } else if v.captured.is_some() {
                v.captured = Some(captured);
                captured += 1;
            }
        }
        log::debug!(
            "{} pages being evicted could not be taken into the pipe (inaccessible to the \
             program, e.g. PROT_NONE): left resident",
            refused.len()
        );
        captured
    }

    /// Victims resident at a fork may still be shared with the child: a write to one would go
    /// to a new copy, not to the page the pipe holds. Give the program its own copy first: a
    /// forced write fault under asynchronous tracking (the kernel resolves it, unsharing the
    /// page), or write protection under synchronous tracking (a write then blocks in a
    /// write-protect fault until the batch is over). Rare: only after a fork, once per page.
    fn prepare_forked(&mut self, s: &Engine, async_wp: bool) {
        if !self.victims.iter().any(|v| v.forked) {
            return;
        }
        let mem = &s.mem;
        let forked = runs(
            self.victims
                .iter()
                .filter(|v| v.forked && (async_wp || v.stale))
                .map(|v| v.page),
        );
        for (first, count) in forked {
            let r = if async_wp {
                mem.mapping.madvise(
                    first * PAGE_SIZE,
                    count * PAGE_SIZE,
                    libc::MADV_POPULATE_WRITE,
                )
            } else {
                mem.uffd
                    .write_protect(mem.addr_of(first), count * PAGE_SIZE, true, false)
                    .map_err(std::io::Error::other)
            };
            if let Err(e) = r {
                fatal(&format!(
                    "preparing pages shared with a fork child for eviction: {e}"
                ));
            }
        }
    }

    /// Scans the runs of victims that need it: which are mapped, and (asynchronous tracking)
    /// which were written since they were installed. A run is skipped when no victim in it has
    /// a far copy the store can compare, unless the evictor scans all (see the module's doc):
    /// its victims count as unwritten, and are written back (having no far copy to keep).
    fn scan_victims(&mut self, s: &Engine, store: &dyn StoreHandle) {
        let mut v = 0;
        for &(first, count) in &self.runs {
            if !self.scan_all
                && !self.victims[v..v + count]
                    .iter()
                    .any(|x| store.has_far_copy(x.page as u64))
            {
                for victim in &mut self.victims[v..v + count] {
                    victim.written = false;
                }
                v += count;
                continue;
            }
            RegionCounters::add(&s.counters.evict_scanned_runs, 1);
            let (start, end) = (s.mem.addr_of(first), s.mem.addr_of(first + count));
            self.scan.clear();
            self.scan.reserve(count);
            let mut at = start;
            while at < end {
                at = match self.pagemap.scan(at, end, &mut self.scan) {
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
                let mapped = cat & (PAGE_IS_PRESENT | PAGE_IS_SWAPPED) != 0;
                victim.written = mapped && cat & PAGE_IS_WRITTEN != 0;
                if !mapped {
                    // Dropped behind the pager's back (a raw madvise system call): it reads as
                    // zeros now, and zeros are what goes back (the batch owns the page).
                    s.note_dropped_behind_back(page);
                    s.mem.install_zero(page);
                    victim.written = true;
                    victim.stale = true;
                }
                v += 1;
            }
        }
    }

    /// Publishes the clean victims that were dropped without being captured (synchronous
    /// tracking): their far copies are exact and already stored, so they go REMOTE now, and a
    /// fault waiting for one fetches it at once instead of waiting for the other victims'
    /// write-back. Returns how many.
    fn publish_clean_early(&mut self, s: &Engine) -> usize {
        let now = s.reclaim.clock_ns();
        let mut n = 0;
        for v in self.victims.iter_mut() {
            if v.captured.is_some() || v.skipped || v.stale {
                continue;
            }
            s.mem.table.clear_forked(v.page);
            s.reclaim.stamp_eviction(v.page, now);
            s.mem.table.release(v.page, PageState::Remote);
            v.published = true;
            n += 1;
        }
        if n == 0 {
            return 0;
        }
        s.mem
            .wake_deferred(self.victims.iter().filter(|v| v.published).map(|v| v.page));
        s.budget.release(n);
        s.budget.notify_progress();
        RegionCounters::add(&s.counters.evicted_clean, n as u64);
        n
    }

    /// Publishes the batch: dropped victims go REMOTE, `kept` ones (put back) resident and
    /// dirty. Returns the pages evicted.
    fn publish(&mut self, s: &Engine, kept: &[usize]) -> usize {
        let c = &s.counters;
        let now = s.reclaim.clock_ns();
        let (mut clean, mut dirty, mut handed_back) = (0, 0, 0);
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
        let mut early = 0;
        for v in &self.victims {
            if v.published {
                early += 1;
                continue;
            }
            if v.skipped {
                s.mem.table.release(v.page, v.was);
                policy
                    .get_or_insert_with(|| s.policy.lock().expect("policy lock"))
                    .on_reject(v.page);
                continue;
            }
            if kept.contains(&v.page) {
                s.mem.table.release(v.page, PageState::Dirty);
                policy
                    .get_or_insert_with(|| s.policy.lock().expect("policy lock"))
                    .on_reject(v.page);
                continue;
            }
            if v.handed_back {
                // Installed afresh (the program's own page now, writable): resident and dirty,
                // its budget slot still held; just used, as a demand fault's page is. Its far
                // copy goes as a dirty page's does (it is rewritten at its next eviction).
                s.drop_far_copy(v.page, true, false);
                s.mem.table.clear_forked(v.page);
                s.mem.table.release(v.page, PageState::Dirty);
                policy
                    .get_or_insert_with(|| s.policy.lock().expect("policy lock"))
                    .on_install(v.page, false);
                handed_back += 1;
                continue;
            }
            if v.stale {
                dirty += 1;
            } else {
                clean += 1;
            }
            s.mem.table.clear_forked(v.page);
            s.reclaim.stamp_eviction(v.page, now);
            s.mem.table.release(v.page, PageState::Remote);
        }
        drop(policy);
        self.wake_waiters(s);
        s.budget.release(clean + dirty);
        s.budget.notify_progress();
        RegionCounters::add(&c.evicted_dirty, dirty as u64);
        RegionCounters::add(&c.evicted_clean, clean as u64);
        RegionCounters::add(&c.evict_handed_back, handed_back);
        RegionCounters::add(&c.evict_batches, 1);
        RegionCounters::add(&c.evict_runs, self.runs.len() as u64);
        RegionCounters::add(&c.bytes_out, (dirty * PAGE_SIZE) as u64);
        clean + dirty + early
    }

    /// Takes candidates from the policy and claims those that are resident and idle.
    fn claim(&mut self, s: &Engine) {
        self.candidates.clear();
        self.victims.clear();
        let table = &s.mem.table;
        let mut policy = s.policy.lock().expect("policy lock");
        policy.pick(s.batch.next().min(self.pipe.pages), &mut self.candidates);
        for &page in &self.candidates {
            match table.get(page) {
                was @ (PageState::Clean | PageState::Dirty)
                    if table.transition(page, was, PageState::Evicting) =>
                {
                    self.victims.push(Victim {
                        page,
                        was,
                        written: false,
                        captured: None,
                        stale: false,
                        forked: table.is_forked(page),
                        skipped: false,
                        handed_back: false,
                        published: false,
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
        self.victims.dedup_by_key(|v| v.page);
    }

    /// Puts every victim back in the state it was claimed from (nothing was changed yet).
    fn undo_claim(&mut self, s: &Engine, why: &str) {
        let mut policy = s.policy.lock().expect("policy lock");
        for v in &self.victims {
            s.mem.table.release(v.page, v.was);
            policy.on_reject(v.page);
        }
        drop(policy);
        self.wake_waiters(s);
        RegionCounters::add(&s.counters.evict_aborted, 1);
        s.budget.note_memnode_full(why);
        s.budget.notify_progress();
    }

    /// Wakes the threads whose faults on the victims, released just now, were left to the batch
    /// (`fault/state.rs`).
    fn wake_waiters(&self, s: &Engine) {
        s.mem.wake_deferred(self.victims.iter().map(|v| v.page));
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

/// If a fault waited for an evicting page since evicting thread `slot` last looked, hands back
/// the captured victims that a fault waits for: installs each again (writable, which wakes its
/// waiting threads) from its captured contents, the page's latest, so the fault needs neither
/// the write-back's acknowledgement nor a fetch. Called by the batch's thread, which owns every
/// victim (EVICTING), after the drop: such a victim has nothing mapped. The page is published
/// dirty ([`Evictor::publish`]), so it is written back again at its next eviction.
fn hand_back_if_wanted(s: &Engine, slot: usize, victims: &mut [Victim], scratch: &[u8]) {
    if !s.evictors.take_wanted(slot) {
        return;
    }
    for v in victims.iter_mut() {
        let Some(i) = v.captured else { continue };
        if v.handed_back || !s.mem.table.take_waited(v.page) {
            continue;
        }
        s.mem
            .install(v.page, &scratch[i * PAGE_SIZE..][..PAGE_SIZE], true);
        v.handed_back = true;
    }
}

/// Set once a pipe had to be smaller than a batch asked for (said once per process).
static SMALLER_PIPE_SAID: AtomicBool = AtomicBool::new(false);

/// The pipe a batch's pages are taken into: `vmsplice` puts references to the pages themselves
/// in it (no copy), reading gives their contents as they are then.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// How many pages it holds: the most one batch of its evictor takes.
    pages: usize,
}

impl Pipe {
    /// A pipe that holds `pages` pages, or, where the kernel refuses that size, the largest
    /// power of two of pages that it grants, down to one page. A user without
    /// `CAP_SYS_RESOURCE` cannot have a pipe larger than `/proc/sys/fs/pipe-max-size` (1 MiB by
    /// default), nor enlarge any pipe once their pipes hold `pipe-user-pages-soft` pages (64
    /// MiB by default: many processes under `gleaner run`, each with an evicting thread per
    /// reclaim thread and handler); that evictor's batches are then smaller (said once), where
    /// the program used to be stopped.
    fn new(pages: usize) -> std::io::Result<Pipe> {
        let (read, write) = {
            let _making = gleaner_fds::making();
            let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
            (gleaner_fds::adopt(read), gleaner_fds::adopt(write))
        };
        let wanted = pages.max(1);
        let mut ask = wanted;
        loop {
            let want = (ask * PAGE_SIZE) as libc::c_int;
            // SAFETY: F_SETPIPE_SZ on our own pipe; the kernel rounds the size up to a power of
            // two.
            let got = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, want) };
            if got >= want {
                let pages = (got as usize / PAGE_SIZE).min(wanted);
                if pages < wanted && !SMALLER_PIPE_SAID.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "eviction batches of at most {pages} pages instead of {wanted}: the \
                         kernel refused a larger pipe (/proc/sys/fs/pipe-max-size, \
                         pipe-user-pages-soft)"
                    );
                }
                return Ok(Pipe { read, write, pages });
            }
            if ask == 1 {
                return Err(std::io::Error::other(format!(
                    "the kernel refused even a one-page pipe: {}",
                    std::io::Error::last_os_error()
                )));
            }
            ask = ask.next_power_of_two() / 2;
        }
    }

    /// Takes the pages of `runs` (mapped pages of the region) into the pipe, in order. Returns
    /// the pages it could not take, sorted: pages the program made inaccessible (`PROT_NONE`:
    /// the JVM does this to parts of its heap), which `vmsplice` refuses with `EFAULT`; the
    /// others are in the pipe, in order.
    fn capture(
        &self,
        addr_of: impl Fn(usize) -> usize,
        runs: &[(usize, usize)],
    ) -> std::io::Result<Vec<usize>> {
        let mut refused = Vec::new();
        let mut pending: std::collections::VecDeque<(usize, usize)> =
            runs.iter().copied().collect();
        while !pending.is_empty() {
            let iov: Vec<libc::iovec> = pending
                .iter()
                .take(1024)
                .map(|&(first, count)| libc::iovec {
                    iov_base: addr_of(first) as *mut libc::c_void,
                    iov_len: count * PAGE_SIZE,
                })
                .collect();
            let want: usize = iov.iter().map(|v| v.iov_len).sum();
            // SAFETY: the iovecs name pages of the region the caller owns (EVICTING), live
            // across the call: one the program dropped behind the pager's back faults and is
            // zero-filled by a fault handler (a reclaim thread), or was found by the scan and
            // zero-filled first (a handler reclaiming directly, which scans every run). The pipe
            // was sized for a whole batch, so the call does not block on a full pipe. Nothing
            // is copied: the pipe holds references to the pages.
            let n = unsafe {
                libc::vmsplice(
                    self.write.as_raw_fd(),
                    iov.as_ptr(),
                    iov.len(),
                    libc::SPLICE_F_NONBLOCK,
                )
            };
            let took = if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EFAULT) {
                    return Err(e);
                }
                0
            } else {
                n as usize
            };
            if took % PAGE_SIZE != 0 {
                return Err(std::io::Error::other(format!(
                    "vmsplice took {took} of {want} bytes, not whole pages"
                )));
            }
            // Skip what was taken; the page after it (if the call stopped short) was refused.
            let mut pages = took / PAGE_SIZE;
            while pages > 0 {
                let (first, count) = pending.pop_front().expect("taken pages were asked for");
                let used = pages.min(count);
                if used < count {
                    pending.push_front((first + used, count - used));
                }
                pages -= used;
            }
            if took < want {
                let (first, count) = pending.pop_front().expect("a refused page was asked for");
                refused.push(first);
                if count > 1 {
                    pending.push_front((first + 1, count - 1));
                }
            }
        }
        Ok(refused)
    }

    /// Reads exactly `buf.len()` bytes out of the pipe.
    fn read(&self, buf: &mut [u8]) -> std::io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            // SAFETY: reads into the live, writable rest of `buf`.
            let n = unsafe {
                libc::read(
                    self.read.as_raw_fd(),
                    buf[done..].as_mut_ptr().cast(),
                    buf.len() - done,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            done += n as usize;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::mapping::Mapping;
    use std::sync::{Mutex, MutexGuard, PoisonError};

    /// Held by every test here that forks, and by the one whose pages must not be shared with
    /// a child while it runs: a fork in another test's thread makes every page of this process
    /// copy-on-write, and a write then goes to a new copy instead of the captured page (the
    /// hazard `a_write_between_capture_and_drop_...` checks). CI saw that once, when the pipe
    /// test's child lived through the capture test's write.
    static FORKING: Mutex<()> = Mutex::new(());

    /// Takes the turn [`FORKING`] guards.
    fn forking() -> MutexGuard<'static, ()> {
        FORKING.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes `v` to the first byte of `page` of `m` through a raw pointer.
    fn poke(m: &Mapping, page: usize, v: u8) {
        // SAFETY: the page lies inside the live mapping, readable and writable.
        unsafe { *((m.addr() + page * PAGE_SIZE) as *mut u8) = v };
    }

    /// Takes `pages` pages of `m` into `pipe` (the part of the batch that only needs a mapping).
    fn capture(pipe: &Pipe, m: &Mapping, first: usize, count: usize) {
        let iov = libc::iovec {
            iov_base: (m.addr() + first * PAGE_SIZE) as *mut libc::c_void,
            iov_len: count * PAGE_SIZE,
        };
        // SAFETY: the iovec names mapped pages of `m`, live across the call.
        let n = unsafe { libc::vmsplice(pipe.write.as_raw_fd(), &iov, 1, 0) };
        assert_eq!(n as usize, count * PAGE_SIZE);
    }

    /// A user without `CAP_SYS_RESOURCE` cannot have a pipe larger than
    /// `/proc/sys/fs/pipe-max-size`, nor enlarge one once their pipes hold
    /// `pipe-user-pages-soft` pages: an evictor then gets the largest pipe the kernel grants,
    /// and batches that size, instead of stopping the program. Checked in a forked child that
    /// gives up root (when run as root) before it asks, then uses up its user's pipe pages.
    #[test]
    fn a_pipe_larger_than_the_kernel_allows_becomes_the_largest_it_allows() {
        let _turn = forking();
        let read_usize = |path: &str| -> usize {
            std::fs::read_to_string(path)
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        };
        let max_bytes = read_usize("/proc/sys/fs/pipe-max-size");
        // 0: no soft limit on this machine (its part of the check is skipped).
        let soft_pages = read_usize("/proc/sys/fs/pipe-user-pages-soft");
        if max_bytes > 64 << 20 {
            eprintln!(
                "SKIPPED LOUDLY: pipe-max-size is {max_bytes}, too large to ask for 4 times over"
            );
            return;
        }
        let allowed = max_bytes / PAGE_SIZE;
        let asked = allowed * 4;
        // The largest power of two of pages within the limit.
        let expected = if allowed.is_power_of_two() {
            allowed
        } else {
            allowed.next_power_of_two() / 2
        };
        // Said already, so the child logs nothing.
        SMALLER_PIPE_SAID.store(true, Ordering::Relaxed);
        // SAFETY: the child only makes system calls (and formats an error on failure, which
        // glibc's allocator allows after fork) before `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: plain system calls in the child; it ends with _exit either way.
            unsafe {
                if libc::geteuid() == 0 && libc::setuid(65534) != 0 {
                    libc::_exit(2);
                }
                // Over pipe-max-size: the largest size allowed.
                let code = match Pipe::new(asked) {
                    Ok(p) if p.pages == expected => {
                        let sz = libc::fcntl(p.write.as_raw_fd(), libc::F_GETPIPE_SZ);
                        if sz as usize == expected * PAGE_SIZE {
                            0
                        } else {
                            4
                        }
                    }
                    Ok(_) => 3,
                    Err(_) => 1,
                };
                if code != 0 || soft_pages == 0 {
                    libc::_exit(code);
                }
                // Past the soft limit: hold pipes of the largest size until growing one more
                // is refused, then ask for a batch's pipe.
                let mut held = Vec::new();
                let most = soft_pages / expected + 2;
                for _ in 0..most {
                    let mut fds = [0; 2];
                    if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                        libc::_exit(5);
                    }
                    held.push(fds);
                    let want = (expected * PAGE_SIZE) as libc::c_int;
                    if libc::fcntl(fds[1], libc::F_SETPIPE_SZ, want) < want {
                        break;
                    }
                }
                if held.len() >= most {
                    libc::_exit(6);
                }
                let code = match Pipe::new(128) {
                    Ok(p) if p.pages >= 1 && p.pages < 128 => 0,
                    Ok(_) => 7,
                    Err(_) => 8,
                };
                libc::_exit(code);
            }
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "child status {status:#x}");
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "pipe-max-size {max_bytes}, pipe-user-pages-soft {soft_pages}: 1 = a pipe over the \
             maximum refused outright, 2 = could not drop root, 3 = wrong size, 4 = pipe not \
             that size, 5 = pipe2 failed, 6 = never reached the soft limit, 7 = a pipe past the \
             soft limit as large as asked, 8 = refused outright past the soft limit"
        );
        // A request the kernel grants is kept as asked (no larger than the batch).
        assert_eq!(Pipe::new(20).unwrap().pages, 20);
        assert_eq!(Pipe::new(128).unwrap().pages, 128);
    }

    /// A page the program made inaccessible is refused by the pipe; the others are taken, in
    /// order, and the refused one is named so eviction can leave it resident.
    #[test]
    fn the_pipe_names_a_protected_page_it_cannot_take_and_takes_the_rest() {
        let pipe = Pipe::new(16).unwrap();
        let m = Mapping::reserve(5 * PAGE_SIZE).unwrap();
        for p in 0..5 {
            poke(&m, p, p as u8 + 10);
        }
        // SAFETY: changes the protection of one page of our own mapping, which nothing else
        // touches during the test.
        let r = unsafe {
            libc::mprotect(
                (m.addr() + 2 * PAGE_SIZE) as *mut libc::c_void,
                PAGE_SIZE,
                libc::PROT_NONE,
            )
        };
        assert_eq!(r, 0);
        let refused = pipe
            .capture(|p| m.addr() + p * PAGE_SIZE, &[(0, 3), (3, 2)])
            .unwrap();
        assert_eq!(refused, vec![2]);
        let mut buf = vec![0u8; 4 * PAGE_SIZE];
        pipe.read(&mut buf).unwrap();
        let firsts: Vec<u8> = buf.chunks(PAGE_SIZE).map(|c| c[0]).collect();
        assert_eq!(firsts, vec![10, 11, 13, 14]);
    }

    /// The kernel contract the drop relies on, checked on this kernel: a write that lands
    /// between taking a page into the pipe and dropping it is in what the pipe gives back, as
    /// long as the page is the program's own; after a fork it goes to a new copy instead (so
    /// the pager unshares pages resident at a fork first), and a forced write fault
    /// (`MADV_POPULATE_WRITE`) restores the contract.
    #[test]
    fn a_write_between_capture_and_drop_is_captured_unless_the_page_is_shared_with_a_child() {
        let _turn = forking();
        let pipe = Pipe::new(16).unwrap();
        let m = Mapping::reserve(3 * PAGE_SIZE).unwrap();
        for p in 0..3 {
            poke(&m, p, 1);
        }
        let mut buf = vec![0u8; PAGE_SIZE];
        // Own page: captured.
        capture(&pipe, &m, 0, 1);
        poke(&m, 0, 42);
        m.discard_ranges(&[(0, 1)]).unwrap();
        pipe.read(&mut buf).unwrap();
        assert_eq!(
            buf[0], 42,
            "a write before the drop is in the captured page"
        );
        // Shared with a fork child: lost; unshared first: captured.
        // SAFETY: the child only sleeps and exits (async-signal-safe), touching nothing.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let ts = libc::timespec {
                tv_sec: 1,
                tv_nsec: 0,
            };
            // SAFETY: nanosleep and _exit are async-signal-safe.
            unsafe {
                libc::nanosleep(&ts, std::ptr::null_mut());
                libc::_exit(0)
            }
        }
        assert!(child > 0);
        capture(&pipe, &m, 1, 1);
        poke(&m, 1, 42);
        m.discard_ranges(&[(1, 1)]).unwrap();
        pipe.read(&mut buf).unwrap();
        assert_eq!(
            buf[0], 1,
            "a shared page's write went to a new copy (the hazard)"
        );
        m.madvise(2 * PAGE_SIZE, PAGE_SIZE, libc::MADV_POPULATE_WRITE)
            .unwrap();
        capture(&pipe, &m, 2, 1);
        poke(&m, 2, 42);
        m.discard_ranges(&[(2, 1)]).unwrap();
        pipe.read(&mut buf).unwrap();
        assert_eq!(buf[0], 42, "unshared first, the page is captured again");
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    }
}
