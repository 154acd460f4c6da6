//! [`Region`]: the public handle, and the state its threads share.

use std::fs::File;
use std::io::BufWriter;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use gleaner_policy::trace::{Header as TraceHeader, Kind as TraceKind, TraceWriter};
use gleaner_proto::{ConnectOptions, Connection};
use gleaner_uffd::{features, Mode, Uffd, UffdOptions};

use crate::config::{MemnodeTarget, RegionConfig};
use crate::embedded::EmbeddedMemnode;
use crate::evict::Evictor;
use crate::fatal::fatal;
use crate::link::{load_token, SessionTarget};
use crate::mapping::Mapping;
use crate::policy::EvictionPolicy;
use crate::predict::{WritePrediction, WritePredictor};
use crate::prefetch::Prefetch;
use crate::reclaim::Reclaim;
use crate::state::{PageState, PageTable};
use crate::stats::{Counters, EvictionStats, FaultStats, LatencyHistogram, RegionStats};
use crate::thread::PagerThread;
use crate::{PagerError, PAGE_SIZE};

/// State shared by a region's handler threads, its evictor and its handle.
pub(crate) struct Shared {
    pub(crate) mapping: Mapping,
    pub(crate) uffd: Uffd,
    pub(crate) table: PageTable,
    pub(crate) policy: Mutex<Box<dyn EvictionPolicy>>,
    pub(crate) counters: Counters,
    pub(crate) remote_latency: LatencyHistogram,
    /// Resident pages plus installs in flight; never above the budget (unless the memnode is full).
    pub(crate) resident: AtomicUsize,
    pub(crate) budget: usize,
    pub(crate) evict_batch: usize,
    /// Who evicts and when: the reclaim scheduler, its thread pool, direct reclaim.
    pub(crate) reclaim: Reclaim,
    /// What to fetch ahead of demand, and the staging buffer.
    pub(crate) prefetch: Prefetch,
    /// Which read fetches to install writable (pages seen rewritten).
    pub(crate) writes: WritePredictor,
    /// The fault trace being recorded (`RegionConfig::trace`).
    trace: Option<Mutex<TraceWriter<BufWriter<File>>>>,
    /// How far past the budget the region may grow while the memnode refuses writes.
    full_overflow: usize,
    pub(crate) memnode_full: AtomicBool,
    /// Set around `fork`: no new eviction batch starts.
    pub(crate) evict_paused: AtomicBool,
    stop: AtomicBool,
    stop_fd: OwnedFd,
    /// Bumped after every eviction batch (or undo); waiters re-check their condition.
    evict_progress: (Mutex<u64>, Condvar),
    /// The session's first connection: session-wide requests (free, goodbye) from any thread.
    control: Mutex<Option<Connection>>,
}

impl Shared {
    pub(crate) fn page_of(&self, addr: usize) -> Option<usize> {
        let base = self.mapping.addr();
        (addr >= base && addr < base + self.mapping.len()).then(|| (addr - base) / PAGE_SIZE)
    }

    pub(crate) fn addr_of(&self, page: usize) -> usize {
        self.mapping.addr() + page * PAGE_SIZE
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Blocks until the userfaultfd has events (true) or the region is stopping (false).
    pub(crate) fn wait_for_events(&self) -> bool {
        loop {
            if self.stopping() {
                return false;
            }
            let mut fds = [
                libc::pollfd {
                    fd: self.uffd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.stop_fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: poll on two valid descriptors in an array that lives across the call.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if r > 0 && fds[0].revents & libc::POLLIN != 0 {
                return !self.stopping();
            }
            if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                fatal(&format!(
                    "poll on the userfaultfd failed: {}",
                    std::io::Error::last_os_error()
                ));
            }
        }
    }

    /// Wakes threads blocked on faults in `page`.
    pub(crate) fn wake(&self, page: usize) {
        if let Err(e) = self.uffd.wake(self.addr_of(page), PAGE_SIZE) {
            fatal(&format!("waking faulting threads on page {page}: {e}"));
        }
    }

    /// The most pages the region may hold now: the budget, plus the overflow allowance while the
    /// memnode refuses writes.
    fn limit(&self) -> usize {
        if self.memnode_full.load(Ordering::Relaxed) {
            self.budget + self.full_overflow
        } else {
            self.budget
        }
    }

    /// Charges one budget slot to a page about to be installed (a remote page when `refault`
    /// names it), unless room can only be made by reclaiming directly: then it returns false and
    /// takes nothing. Never waits.
    pub(crate) fn try_take_slot(&self, refault: Option<usize>) -> bool {
        loop {
            if self.evict_paused.load(Ordering::SeqCst) {
                // Around fork nothing is evicted, and prepare_fork waits for in-flight installs:
                // they must not wait for budget in turn.
                self.resident.fetch_add(1, Ordering::AcqRel);
                return true;
            }
            let r = self.resident.load(Ordering::Acquire);
            let full = self.memnode_full.load(Ordering::Relaxed);
            if !full && self.reclaim.direct_need(r) > 0 {
                return false;
            }
            if r >= self.limit() {
                if full {
                    fatal(&format!(
                        "the memnode is full and the region has used its local budget ({} \
                         pages) plus the overflow allowance ({} pages); there is nowhere left \
                         to keep the program's data",
                        self.budget, self.full_overflow
                    ));
                }
                return false;
            }
            if self
                .resident
                .compare_exchange(r, r + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.reclaim.on_charge(r + 1, refault);
                return true;
            }
        }
    }

    /// Charges one budget slot to a page about to be installed, reclaiming directly through
    /// `conn` first when the scheduler says so (the budget is exhausted, or the mode is
    /// `direct`). While the memnode refuses writes the region may overflow the budget by the
    /// configured allowance; past that the program is stopped rather than lose data.
    pub(crate) fn take_slot(
        &self,
        conn: &mut Connection,
        evictor: &mut Option<Evictor>,
        refault: Option<usize>,
    ) {
        let mut waited = false;
        loop {
            if self.try_take_slot(refault) || self.stopping() {
                return;
            }
            let r = self.resident.load(Ordering::Acquire);
            let need = self.reclaim.direct_need(r);
            if need > 0 {
                let ev = evictor.get_or_insert_with(Evictor::new);
                if crate::reclaim::reclaim_directly(self, ev, conn, need) > 0 {
                    self.notify_evict_progress();
                    continue;
                }
            }
            // Nothing could be reclaimed right now (every resident page is busy, or the memnode
            // refused the write): wait for other threads to move.
            if !waited {
                waited = true;
                Counters::add(&self.counters.waited_on_budget, 1);
            }
            self.reclaim.wake_pool();
            self.wait_evict_progress_or_timeout(Duration::from_millis(10));
        }
    }

    /// Records a completed install: publishes the page state and hands the page to the policy
    /// (`prefetched`: installed ahead of demand).
    pub(crate) fn installed(&self, page: usize, state: PageState, prefetched: bool) {
        let mut policy = self.policy.lock().expect("policy lock");
        self.table.release(page, state);
        policy.on_install(page, prefetched);
    }

    /// Appends a fault to the fault trace, if one is being recorded.
    pub(crate) fn trace_fault(&self, page: usize, tid: u32, kind: gleaner_uffd::FaultKind) {
        let Some(trace) = &self.trace else { return };
        let kind = match kind {
            gleaner_uffd::FaultKind::MissingRead => TraceKind::MissingRead,
            gleaner_uffd::FaultKind::MissingWrite => TraceKind::MissingWrite,
            gleaner_uffd::FaultKind::WriteProtect => TraceKind::WriteProtect,
            gleaner_uffd::FaultKind::Minor => return,
        };
        let t = self.reclaim.clock_ns();
        let mut w = trace.lock().expect("trace lock");
        if let Err(e) = w.record_fault(t, page as u64, tid, kind) {
            log::warn!("fault trace: {e}");
        }
    }

    pub(crate) fn notify_evict_progress(&self) {
        let (m, cv) = &self.evict_progress;
        *m.lock().expect("progress lock") += 1;
        cv.notify_all();
    }

    pub(crate) fn wait_evict_progress_or_timeout(&self, t: Duration) {
        let (m, cv) = &self.evict_progress;
        let g = m.lock().expect("progress lock");
        let _ = cv.wait_timeout(g, t).expect("progress lock");
    }

    /// Sleeps for `d` or until the region stops; returns whether it is stopping.
    pub(crate) fn sleep_unless_stopping(&self, d: Duration) -> bool {
        let (m, cv) = &self.evict_progress;
        let deadline = std::time::Instant::now() + d;
        let mut g = m.lock().expect("progress lock");
        loop {
            if self.stopping() {
                return true;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            g = cv.wait_timeout(g, deadline - now).expect("progress lock").0;
        }
    }

    /// Blocks until `page` leaves the state another thread owns (EVICTING, DISCARDING, ...).
    pub(crate) fn wait_while_busy(&self, page: usize) {
        let (m, cv) = &self.evict_progress;
        let mut g = m.lock().expect("progress lock");
        while self.table.is_busy(page) && !self.stopping() {
            g = cv
                .wait_timeout(g, Duration::from_millis(10))
                .expect("progress lock")
                .0;
        }
    }

    fn snapshot(&self, memnode: String) -> RegionStats {
        let c = &self.counters;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        RegionStats {
            size_bytes: self.mapping.len() as u64,
            budget_pages: self.budget as u64,
            resident_pages: self.resident.load(Ordering::Relaxed) as u64,
            remote_pages: self.table.census()[PageState::Remote as usize] as u64,
            faults: FaultStats {
                zero_fill: get(&c.zero_fills),
                remote: get(&c.remote_faults),
                concurrent_duplicate: get(&c.duplicate_faults),
                write_protect: get(&c.wp_faults),
                waited_on_eviction: get(&c.waited_on_eviction),
                waited_on_budget: get(&c.waited_on_budget),
                prefetch_hit: get(&c.prefetch_hit_faults),
            },
            reclaim: self
                .reclaim
                .stats(get(&c.zero_fills) + get(&c.remote_faults)),
            evictions: EvictionStats {
                clean: get(&c.evicted_clean),
                dirty: get(&c.evicted_dirty),
                batches: get(&c.evict_batches),
                aborted: get(&c.evict_aborted),
                protect_ns: get(&c.evict_protect_ns),
                read_ns: get(&c.evict_read_ns),
                send_ns: get(&c.evict_send_ns),
                drop_ns: get(&c.evict_drop_ns),
                vectored_drop: crate::mapping::vectored_drops(),
            },
            discarded_pages: get(&c.discarded),
            bytes_in: get(&c.bytes_in),
            bytes_out: get(&c.bytes_out),
            remote_fault_latency: self.remote_latency.summary(),
            policy: self.policy.lock().expect("policy lock").name(),
            prefetch: self.prefetch.stats(get(&c.remote_faults)),
            write_prediction: self.writes.stats(),
            memnode,
            uffd_mode: match self.uffd.mode() {
                Mode::Full => "full",
                Mode::UserOnly => "user-only",
            },
        }
    }
}

/// A far-memory region: `size` bytes of address space of which at most the local budget is
/// resident; the rest lives on a memnode. Dropping it stops its threads, ends the memnode session
/// (releasing the pages there) and unmaps the memory.
pub struct Region {
    shared: Arc<Shared>,
    threads: Vec<PagerThread>,
    memnode_desc: String,
    stats_path: Option<PathBuf>,
    // Declared last: dropped after the threads are joined and the session has ended.
    _embedded: Option<EmbeddedMemnode>,
}

impl Region {
    /// Creates a region: reserves the address space, registers it with userfaultfd, connects to
    /// (or starts) the memnode, and starts the handler and evictor threads.
    pub fn new(cfg: RegionConfig) -> Result<Region, PagerError> {
        let (pages, budget) = cfg.validate()?;
        // Open userfaultfd first: it is the likeliest thing to be refused, and the cheapest.
        let uffd = Uffd::open(UffdOptions {
            features: features::PAGEFAULT_FLAG_WP | features::THREAD_ID,
            allow_user_mode_only: cfg.allow_user_mode_only,
        })?;
        let size = pages * PAGE_SIZE;
        let (embedded, endpoint, token) = match &cfg.memnode {
            MemnodeTarget::Embedded | MemnodeTarget::EmbeddedTcp => {
                let node =
                    EmbeddedMemnode::start(size as u64, cfg.memnode == MemnodeTarget::EmbeddedTcp)?;
                let (e, t) = (node.endpoint().clone(), node.token());
                (Some(node), e, t)
            }
            MemnodeTarget::Remote {
                endpoint,
                token_file,
            } => {
                let path = token_file
                    .clone()
                    .unwrap_or_else(gleaner_proto::units::default_token_path);
                (None, endpoint.clone(), load_token(&path)?)
            }
        };
        let opts = ConnectOptions {
            reply_timeout: cfg.reply_timeout,
            client_name: format!("pager pid {} region {}", std::process::id(), size),
            ..ConnectOptions::default()
        };
        let (target, first) = SessionTarget::open(endpoint, token, opts)?;
        if !cfg.sparse && target.capacity_pages() < (pages.saturating_sub(budget)) as u64 {
            log::warn!(
                "memnode {} holds at most {} pages but this region may need {}; the program \
                 stops with a clear error if it ever runs out",
                target.endpoint(),
                target.capacity_pages(),
                pages - budget
            );
        }
        // The scheduler says how many reclaim threads its mode runs: one connection each.
        let reclaim = Reclaim::new(pages, budget, cfg.reclaim, cfg.max_reclaim_threads);
        let pool = reclaim.pool_size();
        let mut conns = Vec::new();
        for _ in 0..cfg.handler_threads + pool {
            conns.push(target.attach()?);
        }

        let mapping = Mapping::reserve(size).map_err(|source| PagerError::Os {
            op: "mmap of the region",
            source,
        })?;
        // A child process does not inherit the registration and would read evicted pages as
        // zeros: unless the caller brings pages home around fork, the child must not see it.
        if !cfg.fork_visible {
            mapping
                .madvise(0, size, libc::MADV_DONTFORK)
                .map_err(|source| PagerError::Os {
                    op: "madvise(MADV_DONTFORK)",
                    source,
                })?;
        }
        uffd.register(mapping.addr(), size, true)?;
        // SAFETY: eventfd(2) returns a new descriptor or -1; checked before taking ownership.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(PagerError::Os {
                op: "eventfd",
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: `efd` was just returned by the kernel and is owned by nothing else.
        let stop_fd = unsafe { OwnedFd::from_raw_fd(efd) };
        let policy = crate::policy::build(cfg.evict, budget).map_err(PagerError::Config)?;
        let prefetch = Prefetch::new(
            cfg.prefetch,
            cfg.prefetch_install,
            (budget / 16).clamp(1, 4096),
        );
        let trace = match &cfg.trace {
            Some(path) => {
                let header = TraceHeader {
                    page_size: PAGE_SIZE as u32,
                    region_base: mapping.addr() as u64,
                };
                let w = File::create(path)
                    .and_then(|f| TraceWriter::new(BufWriter::with_capacity(1 << 20, f), header))
                    .map_err(|source| PagerError::Os {
                        op: "creating the fault trace file",
                        source,
                    })?;
                Some(Mutex::new(w))
            }
            None => None,
        };
        let shared = Arc::new(Shared {
            mapping,
            uffd,
            table: PageTable::new(pages),
            policy: Mutex::new(policy),
            counters: Counters::default(),
            remote_latency: LatencyHistogram::default(),
            resident: AtomicUsize::new(0),
            budget,
            evict_batch: cfg.evict_batch,
            reclaim,
            prefetch,
            writes: WritePredictor::new(pages, cfg.predict_writes == WritePrediction::On),
            trace,
            full_overflow: cfg.full_overflow.unwrap_or(cfg.local_budget / 4) / PAGE_SIZE,
            memnode_full: AtomicBool::new(false),
            evict_paused: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            stop_fd,
            evict_progress: (Mutex::new(0), Condvar::new()),
            control: Mutex::new(Some(first)),
        });
        let memnode_desc = target.endpoint().to_string();
        let trace_out = match &cfg.stats_trace {
            Some(path) => Some(crate::sampler::open(path).map_err(|source| PagerError::Os {
                op: "creating the stats trace file",
                source,
            })?),
            None => None,
        };
        let mut threads = Vec::new();
        let hook = cfg.thread_start_hook;
        for id in 0..pool {
            let conn = conns.pop().expect("one connection per thread");
            let s = shared.clone();
            threads.push(spawn(&format!("gleaner-recl{id}"), hook, move || {
                crate::reclaim::run_pool_thread(s, id, conn)
            })?);
        }
        if let Some(out) = trace_out {
            let s = shared.clone();
            threads.push(spawn("gleaner-sample", hook, move || {
                crate::sampler::run(s, out)
            })?);
        }
        for (i, conn) in conns.into_iter().enumerate() {
            let s = shared.clone();
            threads.push(spawn(&format!("gleaner-fault{i}"), hook, move || {
                crate::fault::run(s, conn)
            })?);
        }
        Ok(Region {
            shared,
            threads,
            memnode_desc,
            stats_path: cfg.stats_path,
            _embedded: embedded,
        })
    }

    /// The first byte of the region.
    pub fn as_ptr(&self) -> *mut u8 {
        self.shared.mapping.addr() as *mut u8
    }

    /// The region's length in bytes (the requested size rounded up to whole pages).
    pub fn len(&self) -> usize {
        self.shared.mapping.len()
    }

    /// Whether the region is empty (never: sizes are validated to be above zero).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The local budget in pages.
    pub fn budget_pages(&self) -> usize {
        self.shared.budget
    }

    /// Whether kernel-mode accesses (e.g. `read(2)` into the region) are served.
    pub fn serves_kernel_faults(&self) -> bool {
        self.shared.uffd.mode() == Mode::Full
    }

    /// A snapshot of the region's statistics.
    pub fn stats(&self) -> RegionStats {
        self.shared.snapshot(self.memnode_desc.clone())
    }

    /// The statistics as pretty-printed JSON.
    pub fn stats_json(&self) -> String {
        serde_json::to_string_pretty(&self.stats()).expect("stats serialise")
    }

    /// Forgets the contents of `len` bytes at `offset` (both page-aligned): the next touch of
    /// each page sees zeros, as after `munmap` + `mmap` or `MADV_DONTNEED`. Local memory and the
    /// memnode copies are released. Safe against concurrent faults and eviction on those pages
    /// (it waits for them); the caller must not touch the range while this runs.
    pub fn discard(&self, offset: usize, len: usize) {
        assert!(
            offset.is_multiple_of(PAGE_SIZE)
                && len.is_multiple_of(PAGE_SIZE)
                && offset + len <= self.len(),
            "discard of [{offset:#x}, +{len:#x}) is not page-aligned inside the region"
        );
        let s = &self.shared;
        let (first, count) = (offset / PAGE_SIZE, len / PAGE_SIZE);
        let mut resident = 0;
        for page in first..first + count {
            loop {
                let state = s.table.get(page);
                let stable = matches!(
                    state,
                    PageState::Absent | PageState::Remote | PageState::Clean | PageState::Dirty
                );
                if stable && s.table.transition(page, state, PageState::Discarding) {
                    if matches!(state, PageState::Clean | PageState::Dirty) {
                        resident += 1;
                        s.policy.lock().expect("policy lock").on_discard(page);
                    } else if state == PageState::Remote && s.prefetch.forget(page) {
                        // Its staged copy held a budget slot.
                        resident += 1;
                    }
                    break;
                }
                if !stable {
                    s.wait_while_busy(page);
                }
            }
        }
        if let Err(e) = s.mapping.madvise(offset, len, libc::MADV_DONTNEED) {
            fatal(&format!("discarding pages: {e}"));
        }
        // Pages that never left this machine have no memnode copy: skip the round trip then.
        if s.counters.evicted_dirty.load(Ordering::Relaxed) > 0 {
            let ranges: Vec<(u64, u32)> = (first..first + count)
                .step_by(u32::MAX as usize)
                .map(|start| {
                    let n = (first + count - start).min(u32::MAX as usize);
                    (start as u64, n as u32)
                })
                .collect();
            let mut control = s.control.lock().expect("control lock");
            if let Some(conn) = control.as_mut() {
                for chunk in ranges.chunks(gleaner_proto::MAX_FREE_RANGES) {
                    if let Err(e) = conn.free(chunk) {
                        // Only memnode space is at stake; the data is meant to be gone.
                        log::warn!("releasing discarded pages on the memnode: {e}");
                    }
                }
            }
        }
        for page in first..first + count {
            // Whatever comes here next is new data: it inherits no write prediction.
            s.writes.forget(page);
            s.table.release(page, PageState::Absent);
        }
        s.resident.fetch_sub(resident, Ordering::AcqRel);
        Counters::add(&s.counters.discarded, count as u64);
        s.notify_evict_progress();
    }

    /// Makes the region safe to `fork`: pauses eviction and brings every page held only on the
    /// memnode back into local memory (over the budget for a while), so that a child, which has
    /// no pager, sees exactly this process's memory. Call [`Region::after_fork`] in the parent.
    pub fn prepare_fork(&self) {
        let s = &self.shared;
        s.evict_paused.store(true, Ordering::SeqCst);
        while s.reclaim.in_batch.load(Ordering::SeqCst) > 0 {
            std::thread::yield_now();
        }
        let mut batch = Vec::with_capacity(gleaner_proto::MAX_BATCH_PAGES);
        let pages = self.len() / PAGE_SIZE;
        let mut page = 0;
        while page < pages {
            batch.clear();
            while page < pages && batch.len() < gleaner_proto::MAX_BATCH_PAGES {
                if s.table
                    .transition(page, PageState::Remote, PageState::Fetching)
                {
                    if s.prefetch.forget(page) {
                        // Fetched again below; its staged copy's slot is given back.
                        s.resident.fetch_sub(1, Ordering::AcqRel);
                    }
                    batch.push(page as u64);
                }
                page += 1;
            }
            if !batch.is_empty() {
                self.bring_home(&batch);
            }
        }
        // Faults in flight on other threads finish their installs before the child is made.
        for p in 0..pages {
            while matches!(
                s.table.get(p),
                PageState::Fetching | PageState::Evicting | PageState::Prefetching
            ) {
                std::thread::yield_now();
            }
        }
    }

    /// Resumes eviction after `fork` (in the parent); the region returns under its budget.
    pub fn after_fork(&self) {
        self.shared.evict_paused.store(false, Ordering::SeqCst);
        self.shared.reclaim.wake_pool();
    }

    /// Fetches `ids` (pages this thread holds in FETCHING) and installs them clean, over budget.
    fn bring_home(&self, ids: &[u64]) {
        let s = &self.shared;
        let mut control = s.control.lock().expect("control lock");
        let Some(conn) = control.as_mut() else {
            fatal("the memnode session is closed while pages are still on it")
        };
        let batch = match conn.read_pages(ids) {
            Ok(b) => b,
            Err(e) => fatal(&format!(
                "bringing pages home before fork failed: {e}; pages held only on the memnode \
                 are lost"
            )),
        };
        for (id, data) in batch.iter() {
            let page = id as usize;
            // SAFETY: `data` is one page in the connection's receive buffer (heap memory outside
            // the region); the destination is an aligned page of the region this thread owns.
            let r = unsafe {
                s.uffd
                    .copy(s.addr_of(page), data.as_ptr(), PAGE_SIZE, true, true)
            };
            if let Err(e) = r {
                fatal(&format!("installing page {page} before fork: {e}"));
            }
            s.resident.fetch_add(1, Ordering::AcqRel);
            s.installed(page, PageState::Clean, false);
        }
        Counters::add(&s.counters.bytes_in, (ids.len() * PAGE_SIZE) as u64);
    }

    /// Whether `addr` lies inside the region.
    pub fn contains(&self, addr: usize) -> bool {
        self.shared.page_of(addr).is_some()
    }

    /// Forgets the remote-fault latency samples so far (e.g. after a warm-up phase).
    pub fn reset_latency(&self) {
        self.shared.remote_latency.reset();
    }
}

fn spawn(
    name: &str,
    hook: Option<fn()>,
    f: impl FnOnce() + Send + 'static,
) -> Result<PagerThread, PagerError> {
    crate::thread::spawn(name, hook, f).map_err(|source| PagerError::Os {
        op: "starting a pager thread",
        source,
    })
}

impl Drop for Region {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our own eventfd.
        unsafe {
            libc::write(
                self.shared.stop_fd.as_raw_fd(),
                (&one as *const u64).cast(),
                8,
            )
        };
        self.shared.reclaim.wake_pool();
        self.shared.notify_evict_progress();
        for t in self.threads.drain(..) {
            t.join();
        }
        if let Some(trace) = &self.shared.trace {
            if let Err(e) = trace.lock().map(|mut w| w.flush()) {
                log::warn!("flushing the fault trace: {e}");
            }
        }
        // After the join, so every fault the program saw is counted.
        if let Some(path) = &self.stats_path {
            if let Err(e) = std::fs::write(path, self.stats_json()) {
                log::warn!("writing region stats to {}: {e}", path.display());
            }
        }
        let control = self.shared.control.lock().map(|mut c| c.take());
        if let Ok(Some(conn)) = control {
            if let Err(e) = conn.goodbye() {
                log::warn!("ending the memnode session: {e}");
            }
        }
        let _ = self
            .shared
            .uffd
            .unregister(self.shared.mapping.addr(), self.shared.mapping.len());
    }
}
