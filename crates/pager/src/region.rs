//! [`Region`]: the public handle. It builds the engine, starts its threads, and offers the few
//! operations a caller needs (stats, discard, fork: `region/fork.rs`).

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use gleaner_proto::ConnectOptions;
use gleaner_uffd::{features, Mode, Uffd, UffdOptions};

use crate::config::DirtyTracking;
use crate::config::{MemnodeTarget, RegionConfig};
use crate::engine::{Engine, Stop, Tracking};
use crate::evict::budget::Budget;
use crate::evict::reclaim::Reclaim;
use crate::fatal::fatal;
use crate::fault::predict::{WritePrediction, WritePredictor};
use crate::fault::prefetch::Prefetch;
use crate::fault::state::{PageState, PageTable};
use crate::memory::mapping::Mapping;
use crate::memory::mem::Memory;
use crate::observe::counters::{LatencyHistogram, RegionCounters};
use crate::observe::stats::RegionStats;
use crate::observe::trace::FaultTrace;
use crate::store::embedded::EmbeddedMemnode;
use crate::store::socket::load_token;
use crate::thread::PagerThread;
use crate::{PagerError, PAGE_SIZE};

mod fork;

/// A far-memory region: `size` bytes of address space of which at most the local budget is
/// resident; the rest lives on a memnode. Dropping it stops its threads, ends the memnode session
/// (releasing the pages there) and unmaps the memory.
pub struct Region {
    engine: Arc<Engine>,
    threads: Vec<PagerThread>,
    /// The prefetch-hint thread, started by the first hint (few programs give any).
    hint_thread: Mutex<Option<PagerThread>>,
    thread_start_hook: Option<fn()>,
    /// The live status file, when the region publishes one.
    publication: Option<Arc<crate::observe::status::Publication>>,
    stats_path: Option<PathBuf>,
    /// The settings it was made with (a fork child's region is made from them).
    cfg: RegionConfig,
    /// The userfaultfd features it opened with (a fork child opens its own with them).
    uffd_features: u64,
    /// Between `prepare_fork` and the fork: the write end of the pipe that tells the store a
    /// child still reads its snapshot (the child keeps it; the parent closes it).
    child_end: Mutex<Option<OwnedFd>>,
    // Declared last: dropped after the threads are joined and the session has ended.
    _embedded: Option<EmbeddedMemnode>,
}

/// What [`Region::launch`] builds a region's engine and threads over.
struct Launch {
    mem: Memory,
    store: Box<dyn crate::store::PageStore>,
    /// The budget in pages.
    budget: usize,
    tracking: Tracking,
    uffd_features: u64,
    trace: Option<FaultTrace>,
    trace_out: Option<std::io::BufWriter<std::fs::File>>,
    embedded: Option<EmbeddedMemnode>,
    /// Pages already resident (a fork child's), handed to the eviction policy and charged.
    resident: Vec<usize>,
    /// Launched on a fork child's only thread, before the program goes on.
    fork_child: bool,
}

impl Region {
    /// Creates a region: reserves the address space, registers it with userfaultfd, connects to
    /// (or starts) the memnode, and starts the handler and reclaim threads.
    pub fn new(cfg: RegionConfig) -> Result<Region, PagerError> {
        let (pages, budget) = cfg.validate()?;
        // The key file is the likeliest thing to be wrong in the codec's settings: refuse it
        // before anything starts.
        let codec = crate::codec::Codec::for_region(
            cfg.compression,
            cfg.encryption.clone(),
            cfg.max_decode,
            pages as u64,
        )?;
        // Open userfaultfd first: it is the likeliest thing to be refused, and the cheapest.
        let mut wanted = features::PAGEFAULT_FLAG_WP | features::THREAD_ID;
        let pool = matches!(cfg.memnode, MemnodeTarget::Pool { .. });
        if pool && cfg.data_path == crate::store::DataPath::Shm {
            return Err(PagerError::Config(
                "--data-path shm cannot be used with a pool of memnodes: replicas live on other \
                 hosts, reached over sockets"
                    .into(),
            ));
        }
        let tracking = resolve_tracking(&cfg, pool)?;
        if tracking == Tracking::Async {
            wanted |= features::WP_ASYNC;
        }
        let uffd = Uffd::open(UffdOptions {
            features: wanted,
            allow_user_mode_only: cfg.allow_user_mode_only,
        })?;
        let size = pages * PAGE_SIZE;
        let opts = ConnectOptions {
            reply_timeout: cfg.reply_timeout,
            client_name: format!("pager pid {} region {}", std::process::id(), size),
            ..ConnectOptions::default()
        };
        let token_from = |file: &Option<std::path::PathBuf>| {
            load_token(
                &file
                    .clone()
                    .unwrap_or_else(gleaner_proto::units::default_token_path),
            )
        };
        let (embedded, store) = match &cfg.memnode {
            MemnodeTarget::Embedded | MemnodeTarget::EmbeddedTcp => {
                let node = EmbeddedMemnode::start(
                    crate::store::embedded::capacity_for_region(size as u64),
                    cfg.memnode == MemnodeTarget::EmbeddedTcp,
                )?;
                let (e, t) = (node.endpoint().clone(), node.token());
                let store = crate::store::open(e, t, opts, cfg.data_path, pages, codec)?;
                (Some(node), store)
            }
            MemnodeTarget::Remote {
                endpoint,
                token_file,
            } => {
                let token = token_from(token_file)?;
                let store =
                    crate::store::open(endpoint.clone(), token, opts, cfg.data_path, pages, codec)?;
                (None, store)
            }
            MemnodeTarget::Pool {
                endpoints,
                token_file,
                replicas,
            } => {
                let token = token_from(token_file)?;
                let store = crate::store::pool::open(
                    endpoints.clone(),
                    token,
                    opts,
                    *replicas,
                    pages,
                    codec,
                )?;
                (None, store)
            }
        };
        if !cfg.sparse && store.capacity_pages() < (pages.saturating_sub(budget)) as u64 {
            log::warn!(
                "memnode {} holds at most {} pages but this region may need {}; the program \
                 stops with a clear error if it ever runs out",
                store.describe(),
                store.capacity_pages(),
                pages - budget
            );
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
        let trace =
            match &cfg.trace {
                Some(path) => Some(FaultTrace::create(path, mapping.addr()).map_err(|source| {
                    PagerError::Os {
                        op: "creating the fault trace file",
                        source,
                    }
                })?),
                None => None,
            };
        let trace_out = match &cfg.stats_trace {
            Some(path) => {
                Some(
                    crate::observe::sampler::open(path).map_err(|source| PagerError::Os {
                        op: "creating the stats trace file",
                        source,
                    })?,
                )
            }
            None => None,
        };
        Region::launch(
            cfg,
            Launch {
                mem: Memory {
                    mapping: Arc::new(mapping),
                    uffd,
                    table: Arc::new(PageTable::new(pages)),
                },
                store,
                budget,
                tracking,
                uffd_features: wanted,
                trace,
                trace_out,
                embedded,
                resident: Vec::new(),
                fork_child: false,
            },
        )
    }

    /// Builds the engine over `l` and starts the region's threads (a new region, or a fork
    /// child's).
    fn launch(cfg: RegionConfig, l: Launch) -> Result<Region, PagerError> {
        let pages = l.mem.pages();
        let budget = l.budget;
        let tracking = l.tracking;
        let store = l.store;
        // The scheduler says how many reclaim threads its mode runs: one store handle each.
        let reclaim = Reclaim::new(pages, budget, cfg.reclaim, cfg.max_reclaim_threads);
        let pool = reclaim.pool_size();
        let placement = cfg.handler_placement();
        let mut handles = Vec::new();
        for _ in 0..placement.len() + pool {
            handles.push(store.handle()?);
        }
        log::debug!(
            "region of {} pages, budget {budget}, memnode {}, {} handlers \
             ({placement:?}), {pool} reclaim threads",
            pages,
            store.describe(),
            placement.len()
        );
        let stop = Stop::new().map_err(|source| PagerError::Os {
            op: "eventfd",
            source,
        })?;
        // Handlers block in `read` where one read can still be told not to block (a fork
        // child's first thread polls while the handlers start): `fault/doorbell.rs`.
        let doorbell = if l.mem.uffd.nowait_reads() && !cfg.handlers_poll {
            let bell = crate::fault::doorbell::Doorbell::new(&l.mem.uffd, placement.len())
                .map_err(|source| PagerError::Os {
                    op: "mapping the fault handlers' doorbell",
                    source,
                })?;
            l.mem.uffd.set_blocking(true)?;
            Some(bell)
        } else {
            None
        };
        // The handlers, the reclaim threads, in a fork child the thread serving faults while the
        // handlers start, and an elastic budget's thread (`evict/elastic.rs`).
        let elastic = cfg.elastic.clone().filter(|_| !l.fork_child);
        let evictors = crate::evict::evictors::Evictors::new(
            placement.len() + pool + 1 + usize::from(elastic.is_some()),
        )
        .map_err(|source| PagerError::Os {
            op: "eventfd (the eviction bells)",
            source,
        })?;
        // Spare descriptors for what the region makes mid-run, where the program may hold every
        // other one it is allowed: an evictor (pipe and pagemap file) for each thread that
        // opens one late, and a shared-memory grant's socket clone and memfd.
        gleaner_fds::keep_spares(3 * (placement.len() + pool) + 2);
        let mut policy =
            crate::evict::order::build(cfg.evict, budget).map_err(PagerError::Config)?;
        for &page in &l.resident {
            policy.on_install(page, false);
        }
        let prefetch = Prefetch::new(
            cfg.prefetch,
            cfg.prefetch_install,
            (budget / 16).clamp(1, 4096),
        )
        .with_deadline(cfg.prefetch_deadline);
        let budget_state = Budget::new(
            budget,
            cfg.full_overflow.unwrap_or(cfg.local_budget / 4) / PAGE_SIZE,
        );
        budget_state
            .resident
            .store(l.resident.len(), Ordering::SeqCst);
        let engine = Arc::new(Engine {
            mem: l.mem,
            budget: budget_state,
            reclaim,
            policy: Mutex::new(policy),
            prefetch,
            // Under asynchronous tracking a write costs no handler round trip, so a page whose
            // far copy is kept saves little going in writable and only reads as written at
            // eviction (a needless write-back): the predictor runs in shadow there. (A page
            // whose far copy is dropped at fetch goes in writable anyway: `install_fetched`.)
            writes: WritePredictor::new(
                pages,
                cfg.predict_writes == WritePrediction::On && tracking == Tracking::Sync,
            ),
            store,
            counters: RegionCounters::default(),
            remote_latency: LatencyHistogram::default(),
            trace: l.trace,
            batch: crate::evict::batch_size::BatchSize::new(
                cfg.batch_pages(),
                cfg.evict_batch == 0,
            ),
            compressor: Default::default(),
            batch_time: LatencyHistogram::default(),
            tracking,
            drop_far_copies: cfg.drop_far_copies,
            stop,
            doorbell,
            hints: crate::fault::hint::Hints::default(),
            gate: crate::engine::Gate::default(),
            evictors,
            release_hook: cfg.release_hook,
            heir: Default::default(),
            access: crate::evict::access::AccessScan::new(
                cfg.access_scan,
                tracking == Tracking::Async,
            ),
        });
        let mut threads = Vec::new();
        let hook = cfg.thread_start_hook;
        let mut pool_handles = handles.split_off(placement.len());
        // Fault handlers first: in a fork child, nothing may read a far page until they run.
        for (i, (cpu, handle)) in placement.into_iter().zip(handles).enumerate() {
            let e = engine.clone();
            let spin = cfg.handler_spin;
            threads.push(spawn(&format!("gleaner-fault{i}"), hook, move || {
                crate::fault::handler::run(e, handle, cpu, spin)
            })?);
        }
        if l.fork_child {
            // The handlers' start-up in the C library may itself read far pages (locale data
            // the program allocated, say): this thread serves them until the handlers run.
            crate::fault::handler::serve_until(&engine, engine.store.handle()?, || {
                threads.iter().all(|t| t.is_running())
            });
            // Before any reclaim thread: the inherited pages over the budget go at once.
            fork::trim_inherited(&engine)?;
            if tracking == Tracking::Async {
                // The child's page table lost the write protection of the pages it kept:
                // protect them again, so that a scan sees only what the child writes (a page
                // that differs from its far copy is written back anyway: eviction compares).
                // Of the inherited pages (in page order), those the trim left resident.
                let table = &engine.mem.table;
                let kept = l
                    .resident
                    .iter()
                    .copied()
                    .filter(|&p| matches!(table.get(p), PageState::Clean | PageState::Dirty));
                for (first, n) in crate::runs::runs(kept) {
                    engine.mem.uffd.write_protect(
                        engine.mem.addr_of(first),
                        n * PAGE_SIZE,
                        true,
                        false,
                    )?;
                }
            }
        }
        let any_cpu = cfg.reclaim_cpus == crate::config::ReclaimCpus::Any;
        for id in 0..pool {
            let handle = pool_handles.pop().expect("one store handle per thread");
            let e = engine.clone();
            threads.push(spawn(&format!("gleaner-recl{id}"), hook, move || {
                if any_cpu {
                    crate::cpus::allow_every_cpu();
                }
                crate::evict::reclaimer::run_pool_thread(e, id, handle)
            })?);
        }
        // The first reclaim thread makes its evictor's descriptors at once: before the program
        // goes on, while the descriptor limit is raised for the pager's start
        // (`gleaner_fds::headroom`), not at a moment when the program could see it raised.
        while pool > 0 && !engine.reclaim.is_first_thread_ready() {
            std::thread::yield_now();
        }
        {
            let e = engine.clone();
            threads.push(spawn("gleaner-watch", hook, move || {
                crate::evict::watchdog::run(e)
            })?);
        }
        if let Some(e) = elastic {
            let ceiling = (e.ceiling / PAGE_SIZE).min(pages).max(budget);
            let handle = engine.store.handle()?;
            let eng = engine.clone();
            threads.push(spawn("gleaner-elastic", hook, move || {
                crate::evict::elastic::run(eng, e, budget, ceiling, handle)
            })?);
        }
        if let Some(out) = l.trace_out {
            let e = engine.clone();
            threads.push(spawn("gleaner-sample", hook, move || {
                crate::observe::sampler::run(e, out)
            })?);
        }
        let mut publication = None;
        if cfg.publish_status {
            // Observability only: a directory that cannot be written costs the status view, not
            // the program.
            match crate::observe::status::next_path() {
                Ok(path) => {
                    let p = crate::observe::status::Publication::new(path);
                    publication = Some(p.clone());
                    let e = engine.clone();
                    threads.push(spawn("gleaner-status", hook, move || {
                        crate::observe::status::run(e, p)
                    })?);
                }
                Err(e) => log::warn!(
                    "no live status for `gleaner status` ({}: {e})",
                    crate::observe::status::status_dir().display()
                ),
            }
        }
        Ok(Region {
            engine,
            threads,
            hint_thread: Mutex::new(None),
            thread_start_hook: hook,
            publication,
            stats_path: cfg.stats_path.clone(),
            uffd_features: l.uffd_features,
            child_end: Mutex::new(None),
            cfg,
            _embedded: l.embedded,
        })
    }

    /// Runs the access scan now, on the calling thread, and returns the pages (numbered from
    /// the region's start) that the program wrote since the previous scan, which are
    /// write-protected again (`evict/access.rs`). The reclaim threads scan by themselves when due;
    /// this is for tests and diagnostics. An error says why the scan is off (synchronous dirty
    /// tracking, `--access-scan off`, or a kernel that refused it).
    pub fn scan_accesses_now(&self) -> Result<Vec<usize>, String> {
        let pagemap = gleaner_uffd::pagemap::Pagemap::open()
            .map_err(|e| format!("opening /proc/self/pagemap: {e}"))?;
        crate::evict::access_walk::scan_now(&self.engine, &pagemap)
    }

    /// The first byte of the region.
    pub fn as_ptr(&self) -> *mut u8 {
        self.engine.mem.mapping.addr() as *mut u8
    }

    /// The region's length in bytes (the requested size rounded up to whole pages).
    pub fn len(&self) -> usize {
        self.engine.mem.mapping.len()
    }

    /// Whether the region is empty (never: sizes are validated to be above zero).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The local budget in pages.
    pub fn budget_pages(&self) -> usize {
        self.engine.budget.pages()
    }

    /// Whether kernel-mode accesses (e.g. `read(2)` into the region) are served.
    pub fn serves_kernel_faults(&self) -> bool {
        self.engine.mem.uffd.mode() == Mode::Full
    }

    /// A snapshot of the region's statistics.
    pub fn stats(&self) -> RegionStats {
        self.engine.snapshot()
    }

    /// The statistics as pretty-printed JSON.
    pub fn stats_json(&self) -> String {
        serde_json::to_string_pretty(&self.stats()).expect("stats serialise")
    }

    /// Stops publishing the live status and removes its file: for a process about to exit
    /// without dropping the region (the preload library's, at exit).
    pub fn withdraw_status(&self) {
        if let Some(p) = &self.publication {
            p.withdraw();
        }
    }

    /// Writes out the fault trace's buffered records (`RegionConfig::trace`): for a process
    /// about to exit without dropping the region (the preload library's, at exit). Faults served
    /// after this are recorded but may not reach the file.
    pub fn flush_trace(&self) {
        if let Some(trace) = &self.engine.trace {
            trace.flush();
        }
    }

    /// Asks for `len` bytes at `offset` to be fetched ahead of use (a runtime prefetch hint):
    /// the far pages of the range are fetched in the background at prefetch priority (only
    /// while the budget has room, never evicting for them). Returns at once; pages already
    /// local, never touched, or beyond the region are skipped.
    pub fn prefetch_hint(&self, offset: usize, len: usize) {
        if len == 0 || offset >= self.len() {
            return;
        }
        {
            let mut thread = self.hint_thread.lock().expect("hint thread lock");
            if thread.is_none() {
                // Its own store handle, so hints never queue behind a fault or an eviction.
                let started = self.engine.store.handle().and_then(|handle| {
                    let e = self.engine.clone();
                    spawn("gleaner-hints", self.thread_start_hook, move || {
                        crate::fault::hint_thread::run(e, handle)
                    })
                });
                match started {
                    Ok(t) => *thread = Some(t),
                    Err(e) => {
                        log::warn!("prefetch hints are ignored: {e}");
                        return;
                    }
                }
            }
        }
        let first = offset / PAGE_SIZE;
        let end = (offset.saturating_add(len).min(self.len())).div_ceil(PAGE_SIZE);
        self.engine.hints.push(first, end - first);
    }

    /// Forgets the contents of `len` bytes at `offset` (both page-aligned): the next touch of
    /// each page sees zeros, as after `munmap` + `mmap` or `MADV_DONTNEED`. Local memory and the
    /// memnode copies are released. Pages the program had mapped something else over
    /// ([`Region::surrender`]) get the region's memory back. Safe against concurrent faults and
    /// eviction on those pages (it waits for them); the caller must not touch the range while
    /// this runs.
    pub fn discard(&self, offset: usize, len: usize) {
        self.forget(offset, len, PageState::Absent);
    }

    /// Takes `len` bytes at `offset` (both page-aligned), a block the program freed and its
    /// allocator kept, back for a new block whose contents do not matter (not `calloc`'s):
    /// resident pages stay as they are, so the new block's first touches do not fault; pages
    /// held only far are discarded, so that they read as zeros instead of being fetched. The
    /// caller must not touch the range while this runs.
    pub fn reuse(&self, offset: usize, len: usize) {
        self.assert_page_range("reuse", offset, len);
        let e = &*self.engine;
        let (first, count) = (offset / PAGE_SIZE, len / PAGE_SIZE);
        let far = (first..first + count).filter(|&p| e.mem.table.get(p) == PageState::Remote);
        let mut far_pages = 0;
        for (f, n) in crate::runs::runs(far) {
            // A page that came back meanwhile is discarded too: its contents do not matter.
            self.forget(f * PAGE_SIZE, n * PAGE_SIZE, PageState::Absent);
            far_pages += n;
        }
        RegionCounters::add(&e.counters.reused, count as u64);
        RegionCounters::add(&e.counters.reused_far, far_pages as u64);
    }

    /// Gives up `len` bytes at `offset` (both page-aligned) to a mapping the program is about to
    /// place there itself (a file or shared memory, with `MAP_FIXED`): their contents are
    /// forgotten as by [`Region::discard`], and from then on the pager leaves those pages alone
    /// (no fault comes for them, none is evicted, installed or prefetched) until a `discard` of
    /// them (the program unmapped them, or mapped anonymous memory there) makes them the
    /// region's again.
    pub fn surrender(&self, offset: usize, len: usize) {
        self.forget(offset, len, PageState::Foreign);
    }

    /// Whether the page at `offset` is one the program mapped something else over.
    pub fn is_surrendered(&self, offset: usize) -> bool {
        self.engine.mem.table.get(offset / PAGE_SIZE) == PageState::Foreign
    }

    /// Stops the program if `[offset, +len)` is not whole pages inside the region (`what`: the
    /// operation, for the message).
    fn assert_page_range(&self, what: &str, offset: usize, len: usize) {
        assert!(
            offset.is_multiple_of(PAGE_SIZE)
                && len.is_multiple_of(PAGE_SIZE)
                && offset + len <= self.len(),
            "{what} of [{offset:#x}, +{len:#x}) is not page-aligned inside the region"
        );
    }

    /// [`Region::discard`] or [`Region::surrender`]: the pages end in `to`.
    fn forget(&self, offset: usize, len: usize, to: PageState) {
        self.assert_page_range("discard", offset, len);
        let e = &*self.engine;
        let table = &e.mem.table;
        let (first, count) = (offset / PAGE_SIZE, len / PAGE_SIZE);
        let mut resident = 0;
        // Pages that were the program's own mapping and come back to the region.
        let mut returning: Vec<usize> = Vec::new();
        for page in first..first + count {
            loop {
                let state = table.get(page);
                let stable = matches!(
                    state,
                    PageState::Absent
                        | PageState::Remote
                        | PageState::Clean
                        | PageState::Dirty
                        | PageState::Foreign
                );
                if stable && table.transition(page, state, PageState::Discarding) {
                    if matches!(state, PageState::Clean | PageState::Dirty) {
                        resident += 1;
                        e.policy.lock().expect("policy lock").on_discard(page);
                    } else if state == PageState::Remote && e.prefetch.forget(page) {
                        // Its staged copy held a budget slot.
                        resident += 1;
                    } else if state == PageState::Foreign && to != PageState::Foreign {
                        returning.push(page);
                    }
                    break;
                }
                if !stable {
                    e.wait_while_busy(page);
                }
            }
        }
        if let Err(err) = e
            .mem
            .mapping
            .madvise(offset, len, crate::memory::mapping::drop_advice())
        {
            fatal(&format!("discarding pages: {err}"));
        }
        for (f, n) in crate::runs::runs(returning.into_iter()) {
            let (at, bytes) = (f * PAGE_SIZE, n * PAGE_SIZE);
            if let Err(err) = e
                .mem
                .mapping
                .remap_anonymous(at, bytes, !self.cfg.fork_visible)
            {
                fatal(&format!(
                    "taking back pages the program had mapped something else over: {err}"
                ));
            }
            if let Err(err) = e.mem.uffd.register(e.mem.addr_of(f), bytes, true) {
                fatal(&format!(
                    "registering pages the program had mapped something else over: {err}"
                ));
            }
        }
        // Pages that never left this machine have no far copy: skip the store then.
        if e.counters.evicted_dirty.load(Ordering::Relaxed) > 0 {
            let ranges: Vec<(u64, u32)> = (first..first + count)
                .step_by(u32::MAX as usize)
                .map(|start| {
                    let n = (first + count - start).min(u32::MAX as usize);
                    (start as u64, n as u32)
                })
                .collect();
            e.store.release(&ranges);
        }
        for page in first..first + count {
            // Whatever comes here next is new data: it inherits no write prediction.
            e.writes.forget(page);
            table.clear_forked(page);
            table.release(page, to);
        }
        e.budget.release(resident);
        if to == PageState::Foreign {
            RegionCounters::add(&e.counters.surrendered, count as u64);
        } else {
            RegionCounters::add(&e.counters.discarded, count as u64);
        }
        e.budget.notify_progress();
    }

    /// Whether `addr` lies inside the region.
    pub fn contains(&self, addr: usize) -> bool {
        self.engine.mem.page_of(addr).is_some()
    }

    /// Forgets the remote-fault latency samples so far (e.g. after a warm-up phase).
    pub fn reset_latency(&self) {
        self.engine.remote_latency.reset();
    }
}

/// How the region will track writes: `cfg.dirty_tracking`, with `auto` resolved against what
/// this kernel offers and where far pages go (`pool`: to a pool of memnodes): asynchronous
/// where the kernel has `WP_ASYNC` (6.7+), whether far copies are in shared memory or behind
/// one memnode's socket; synchronous for a pool and elsewhere. Over a socket asynchronous tracking writes back every victim, clean
/// or not (its far copy, on the memnode, cannot be compared), and still costs less than a
/// write-protect fault per first write; a pool would write each clean victim to every replica
/// again (`docs/architecture.md`, "Dirty tracking and write prediction").
fn resolve_tracking(cfg: &RegionConfig, pool: bool) -> Result<Tracking, PagerError> {
    let offered = Uffd::available_features(cfg.allow_user_mode_only)? & features::WP_ASYNC != 0;
    Ok(match cfg.dirty_tracking {
        DirtyTracking::Sync => Tracking::Sync,
        DirtyTracking::Async if offered => Tracking::Async,
        DirtyTracking::Async => {
            return Err(PagerError::Config(
                "asynchronous dirty tracking needs UFFD_FEATURE_WP_ASYNC (Linux 6.7 or newer); \
                 use --dirty-tracking sync"
                    .into(),
            ))
        }
        DirtyTracking::Auto if offered && !pool => Tracking::Async,
        DirtyTracking::Auto => Tracking::Sync,
    })
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
        let e = &*self.engine;
        e.stop.request();
        e.reclaim.wake_pool();
        e.budget.notify_progress();
        e.budget.wake_nappers();
        e.hints.wake();
        if let Some(bell) = &e.doorbell {
            bell.ring();
        }
        for t in self.threads.drain(..) {
            t.join();
        }
        if let Some(t) = self.hint_thread.lock().expect("hint thread lock").take() {
            t.join();
        }
        self.flush_trace();
        // After the join, so every fault the program saw is counted.
        if let Some(path) = &self.stats_path {
            if let Err(err) = gleaner_fds::write(path, self.stats_json()) {
                log::warn!("writing region stats to {}: {err}", path.display());
            }
        }
        e.store.close();
        let _ = e
            .mem
            .uffd
            .unregister(e.mem.mapping.addr(), e.mem.mapping.len());
    }
}
