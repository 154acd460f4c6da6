//! Region configuration: every knob has a name and a default.

use std::path::PathBuf;
use std::time::Duration;

pub use gleaner_policy::evict::EvictKind;
pub use gleaner_policy::prefetch::PrefetcherKind;
pub use gleaner_policy::reclaim::ReclaimMode;

pub use crate::codec::decode_budget::DecodeBudget;
pub use crate::codec::{Compression, Encryption};
pub use crate::fault::predict::WritePrediction;
pub use crate::fault::prefetch::PrefetchInstall;
pub use crate::store::DataPath;

/// Which pages give up their far copy when they come back: see
/// [`RegionConfig::drop_far_copies`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FarCopies {
    /// Every fetched page, on demand or by prefetch (default).
    #[default]
    All,
    /// Pages fetched on demand; prefetched ones keep theirs.
    Demand,
    /// None: every resident page keeps its far copy.
    None,
}

impl std::str::FromStr for FarCopies {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "all" => Ok(FarCopies::All),
            "demand" => Ok(FarCopies::Demand),
            "none" => Ok(FarCopies::None),
            _ => Err(format!(
                "`{s}` is not a far-copy policy: use all (default: far memory holds only evicted \
                 pages), demand (prefetched pages keep theirs) or none"
            )),
        }
    }
}

impl std::fmt::Display for FarCopies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FarCopies::All => "all",
            FarCopies::Demand => "demand",
            FarCopies::None => "none",
        })
    }
}

/// Whether and how often the access scan runs ([`crate::RegionConfig::access_scan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AccessScanSetting {
    /// On where the kernel offers the signal (asynchronous dirty tracking), with the adaptive
    /// period (default).
    #[default]
    Auto,
    /// Never.
    Off,
    /// On, every this long (for experiments).
    Every(Duration),
}

impl std::str::FromStr for AccessScanSetting {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        match s {
            "auto" | "on" => Ok(AccessScanSetting::Auto),
            "off" => Ok(AccessScanSetting::Off),
            _ => {
                let ms = s.strip_suffix("ms").unwrap_or(s);
                match ms.parse::<u64>() {
                    Ok(n) if n > 0 => Ok(AccessScanSetting::Every(Duration::from_millis(n))),
                    _ => Err(format!(
                        "`{s}` is not an access-scan setting: use auto (default: on where \
                         asynchronous dirty tracking is, with an adaptive period), off, or a \
                         period in milliseconds such as 100ms"
                    )),
                }
            }
        }
    }
}

impl std::fmt::Display for AccessScanSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AccessScanSetting::Auto => f.write_str("auto"),
            AccessScanSetting::Off => f.write_str("off"),
            AccessScanSetting::Every(d) => write!(f, "{}ms", d.as_millis()),
        }
    }
}

/// What a fork child gets of a fork-visible region: see [`RegionConfig::fork`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForkMode {
    /// The child gets a pager of its own, with its own budget, reading the parent's far pages
    /// as they were at the fork (a snapshot the parent keeps for it): neither process brings
    /// its heap home. Where the store cannot share a snapshot (a memnode reached over TCP, a
    /// pool), the fork brings the pages home instead and says so once.
    #[default]
    Far,
    /// Every far page is brought home before the child is created; the child sees plain
    /// memory (its managed memory is not paged).
    Home,
}

impl std::str::FromStr for ForkMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "far" => Ok(ForkMode::Far),
            "home" => Ok(ForkMode::Home),
            _ => Err(format!(
                "`{s}` is not a fork mode: use far (default: the child pages from a snapshot of                  the parent's far memory) or home (bring every page home before the fork)"
            )),
        }
    }
}

impl std::fmt::Display for ForkMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ForkMode::Far => "far",
            ForkMode::Home => "home",
        })
    }
}

/// Where a region's reclaim threads may run: see [`RegionConfig::reclaim_cpus`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReclaimCpus {
    /// Every CPU the process's cgroup allows, whatever the program's own affinity, as Linux's
    /// kswapd runs wherever the program was pinned.
    #[default]
    Any,
    /// Only the CPUs the program itself may run on (its affinity mask when it started).
    Program,
}

impl std::str::FromStr for ReclaimCpus {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "any" => Ok(ReclaimCpus::Any),
            "program" => Ok(ReclaimCpus::Program),
            _ => Err(format!(
                "`{s}` is not a choice of CPUs for reclaim: use any (default: every CPU the \
                 cgroup allows) or program (only the program's own CPUs)"
            )),
        }
    }
}

impl std::fmt::Display for ReclaimCpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReclaimCpus::Any => "any",
            ReclaimCpus::Program => "program",
        })
    }
}

/// A fork child's default budget: this fraction of its parent's (see
/// [`RegionConfig::fork_local_budget`]).
pub const FORK_CHILD_BUDGET_DIVISOR: usize = 4;

/// How writes to resident pages are tracked, so that pages nobody wrote are evicted without a
/// write-back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirtyTracking {
    /// Asynchronous where the kernel offers it (`UFFD_FEATURE_WP_ASYNC`, Linux 6.7+) and far
    /// pages go to one memnode (shared memory or its socket); synchronous for a pool and
    /// elsewhere.
    #[default]
    Auto,
    /// The kernel lets a page's first write through itself (no fault reaches a handler);
    /// eviction finds the written pages with `PAGEMAP_SCAN`.
    Async,
    /// A write-protect fault, served by a handler, at a clean page's first write.
    Sync,
}

impl std::str::FromStr for DirtyTracking {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(DirtyTracking::Auto),
            "async" => Ok(DirtyTracking::Async),
            "sync" => Ok(DirtyTracking::Sync),
            _ => Err(format!(
                "`{s}` is not a dirty-tracking mode: use auto, async or sync"
            )),
        }
    }
}

impl std::fmt::Display for DirtyTracking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DirtyTracking::Auto => "auto",
            DirtyTracking::Async => "async",
            DirtyTracking::Sync => "sync",
        })
    }
}
use gleaner_proto::Endpoint;

use crate::{PagerError, PAGE_SIZE};

/// The smallest budget, in eviction batches, with which the engine can always make progress:
/// one batch being evicted, one batch of headroom being refilled, and room for in-flight faults.
pub const MIN_BUDGET_BATCHES: usize = 4;

/// The prefetcher used by default: Leap with windows of up to 32 pages (it cuts sequential and
/// strided scans' faults several-fold and stays idle on random access, where it finds no trend:
/// `docs/BENCHMARKS.md`, "The defaults against one knob changed", and "Prefetching: Leap against
/// no prefetching").
pub const DEFAULT_PREFETCH: PrefetcherKind = PrefetcherKind::Leap { pw_max: 32 };

/// The eviction order used by default: `frequency` (Multi-Queue over the access scan's written
/// bits; a page that comes back keeps its count). Under memcached at 50% it took 0.97-1.08x
/// Linux swap's far faults per request where `recency` (the default before) took 1.07-1.13x,
/// redis alike; every batch program stays well under Linux swap's time with it (sqlite, node,
/// the JVM program and the demo job 0.41-0.81x), though the JVM program takes more far faults
/// than under `recency` (`docs/BENCHMARKS.md`, "Far faults per request beside Linux swap",
/// and `bench/results/access-scan/steady/README.md`). `recency` took fewer than RackMem, the
/// order before it, and `active` (Linux's two lists) a third more than `recency` under node
/// (`bench/results/access-scan/two-lists/README.md`).
pub const DEFAULT_EVICT: EvictKind = EvictKind::Frequency;

/// Pages per eviction batch for budgets of 8 MiB and more (chosen by measurement:
/// `docs/BENCHMARKS.md`, "The defaults against one knob changed"); smaller budgets get a
/// sixteenth of themselves.
pub const DEFAULT_EVICT_BATCH: usize = 128;

/// The smallest eviction batch chosen automatically (for budgets below 1 MiB).
pub const MIN_AUTO_EVICT_BATCH: usize = 16;

/// The most fault handlers started by default (one per CPU up to this many). Every fault wakes
/// every handler waiting on the userfaultfd (its wait queue is not exclusive), so each handler
/// past the first few costs every fault a wake-up on another CPU: on a 16-CPU VM a bare fault
/// took several times longer with 16 handlers than with one on the faulting CPU, and
/// `bench micro`'s random pattern was slower per access with 16 handlers than with 4
/// (`bench/results/handlers-16cpu/README.md`).
pub const MAX_AUTO_HANDLERS: usize = 4;

/// The default cap on `hermit`'s reclaim threads: half this machine's CPUs, at least one.
/// Reclaim threads only help when they have cores to run on: on a 2-vCPU machine a 4-thread pool
/// never did better than one thread under memcached, and sometimes sustained less
/// (`docs/BENCHMARKS.md`, "Reclamation: Hermit against its ablations").
pub fn default_max_reclaim_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

/// Which memnode a region keeps its evicted pages on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemnodeTarget {
    /// Start a private memnode child process on a Unix socket (stopped when the region drops).
    Embedded,
    /// Start a private memnode child process on TCP loopback.
    EmbeddedTcp,
    /// Use a running memnode.
    Remote {
        /// Its address.
        endpoint: Endpoint,
        /// The token file (default: `gleaner_proto::units::default_token_path()`).
        token_file: Option<PathBuf>,
    },
    /// Spread pages over several running memnodes, each extent on `replicas` of them (see
    /// `store/pool/`). They share one token.
    Pool {
        /// Their addresses.
        endpoints: Vec<Endpoint>,
        /// The token file (default: `gleaner_proto::units::default_token_path()`).
        token_file: Option<PathBuf>,
        /// Copies of each extent, 1 to the number of memnodes (at most 8).
        replicas: usize,
    },
}

impl MemnodeTarget {
    /// One memnode (`HOST:PORT`, `unix:PATH`), or a pool of several separated by commas, each
    /// far page on `replicas` of them (default: 2, or 1 when only one is given). One address
    /// with `replicas` given is a pool of one.
    pub fn from_addresses(
        addresses: &str,
        token_file: Option<PathBuf>,
        replicas: Option<usize>,
    ) -> Result<MemnodeTarget, String> {
        let endpoints = addresses
            .split(',')
            .map(|a| a.trim().parse::<Endpoint>().map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, String>>()?;
        Ok(match (endpoints.len(), replicas) {
            (1, None) => MemnodeTarget::Remote {
                endpoint: endpoints.into_iter().next().expect("one address"),
                token_file,
            },
            (n, replicas) => MemnodeTarget::Pool {
                endpoints,
                token_file,
                replicas: replicas.unwrap_or(n.min(2)),
            },
        })
    }
}

/// An elastic local budget (`gleaner run --local-mem FLOOR..CEILING`): see
/// [`RegionConfig::elastic`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElasticBudget {
    /// The most the budget may grow to, bytes.
    pub ceiling: usize,
    /// The node daemon's socket.
    pub socket: PathBuf,
    /// The name the registration shows in `gleaner node status`.
    pub name: String,
}

/// How to build a [`crate::Region`].
#[derive(Debug, Clone)]
pub struct RegionConfig {
    /// Region size in bytes (rounded up to whole pages).
    pub size: usize,
    /// Local budget in bytes: at most this much of the region is resident at once.
    pub local_budget: usize,
    /// Where evicted pages go.
    pub memnode: MemnodeTarget,
    /// Fault-handler threads (each with its own store handle: a connection on the socket data
    /// path). Default 0: one per CPU this process may run on, at most [`MAX_AUTO_HANDLERS`].
    pub handler_threads: usize,
    /// Pin each fault handler to one CPU of the process's affinity mask (spread evenly over it,
    /// round robin where there are more handlers than CPUs), so the handler on a faulting
    /// thread's CPU serves it without an inter-processor wake-up. Default true.
    pub pin_handlers: bool,
    /// How long a handler keeps polling the userfaultfd without blocking after its last message
    /// (zero: it blocks at once). Default zero (spinning measured slower: `docs/BENCHMARKS.md`,
    /// "The defaults against one knob changed").
    pub handler_spin: Duration,
    /// Handlers wait in `poll` and then read, even where they could wait inside `read` on a
    /// blocking userfaultfd (`fault/doorbell.rs`): the path kernels without `RWF_NOWAIT` on a
    /// userfaultfd take, kept measurable and tested here. Default false.
    pub handlers_poll: bool,
    /// How writes to resident pages are tracked: `auto` (default: asynchronous where the kernel
    /// offers it and the memnode is on this host), `async` or `sync`.
    pub dirty_tracking: DirtyTracking,
    /// How pages reach the memnode: shared memory for a memnode on this host, or the socket.
    /// Default `auto` (shared memory whenever the memnode is reached through a Unix socket).
    pub data_path: DataPath,
    /// How far pages are compressed: `lz4` (default), `zstd` or `off`.
    pub compression: Compression,
    /// How slow decompressing a page may be before pages like it are stored raw: `auto`
    /// (default: 1.5 µs with LZ4, no bound with zstd), `off` or a number of microseconds.
    pub max_decode: DecodeBudget,
    /// How far pages are sealed against the memnode: AES-256-GCM with a random per-region key
    /// (default), with a key derived from a key file, or `off`.
    pub encryption: Encryption,
    /// Which pages give up their far copy when they come back (asynchronous dirty tracking on
    /// shared memory only): `all` (default: far memory then holds only evicted pages, as zram
    /// does), `demand` (pages a fault fetched, not prefetched ones, which a scan brings back and
    /// evicts unwritten) or `none`. A page without a far copy is encoded and written again at its
    /// next eviction.
    pub drop_far_copies: FarCopies,
    /// Pages per eviction batch. 0 (default): at most a sixteenth of the budget, between
    /// [`MIN_AUTO_EVICT_BATCH`] and [`DEFAULT_EVICT_BATCH`] pages (large batches measured fastest,
    /// but four of them must fit in the budget), and fewer (down to 16) while committing them
    /// (writing back, acknowledged) would take more than about 1 ms, as over a slow link, where
    /// a fault on a page being evicted waits for its whole batch's write-back. A size set here
    /// is used as it is.
    pub evict_batch: usize,
    /// Accept a user-mode-only userfaultfd (kernel-mode accesses such as `read(2)` into the region
    /// then fail with `EFAULT`). Default false: such a setup is refused with an error naming the
    /// fixes.
    pub allow_user_mode_only: bool,
    /// If set, the region's stats are written here as JSON when it is dropped.
    pub stats_path: Option<PathBuf>,
    /// How long to wait for a memnode reply before declaring it dead. Default 30 s.
    pub reply_timeout: Duration,
    /// When the memnode is full, how far past the budget (in bytes) the region may grow, keeping
    /// pages locally, before it stops the program. Default: a quarter of the budget.
    pub full_overflow: Option<usize>,
    /// Let fork children see the region (the caller then brackets `fork` with
    /// [`crate::Region::prepare_fork`] and [`crate::Region::after_fork`]). Default false: the
    /// region is `MADV_DONTFORK`, so a child cannot read evicted pages as zeros.
    pub fork_visible: bool,
    /// With `fork_visible`: what a child gets, `far` (default: a pager of its own on a snapshot
    /// of the far pages) or `home` (every page brought home before the fork).
    pub fork: ForkMode,
    /// A fork child's local budget in bytes (`fork = far`). Default: a quarter of this region's
    /// budget ([`FORK_CHILD_BUDGET_DIVISOR`]), so parent and child together stay within 1.25
    /// times it while the child lives.
    pub fork_local_budget: Option<usize>,
    /// Called first thing on every thread the region starts (fault handlers, evictor). The
    /// LD_PRELOAD library uses it to mark those threads as runtime threads, so that allocations
    /// the C library makes on their behalf never land in managed memory.
    pub thread_start_hook: Option<fn()>,
    /// Called by a reclaim thread before it evicts a batch of `pages` pages: asks the
    /// program's allocator to discard memory it holds without needing it (freed blocks kept
    /// for reuse) and returns how many pages it discarded, 0 if none. Such pages go without a
    /// write-back; the thread evicts only if the budget still asks for it. Never called by a
    /// fault handler. Like every runtime thread's code it must never touch managed memory (not
    /// even `getenv`: the program's environment may live there): a reclaim thread that faults
    /// waits for room that only it can make. The LD_PRELOAD library sets it; default none.
    pub release_hook: Option<fn(usize) -> usize>,
    /// The region is a reservation of address space of which only a part will ever be used
    /// (the LD_PRELOAD arena): no warning when the memnode could not hold all of it. Default
    /// false.
    pub sparse: bool,
    /// Who reclaims and when: `hermit` (default: Hermit's feedback-directed thread pool),
    /// `static:N` (N threads once fewer than 8 MiB are free) or `direct` (faulting threads
    /// reclaim synchronously, like Linux).
    pub reclaim: ReclaimMode,
    /// The most reclaim threads `hermit` mode runs at once. Default: half the CPUs, at least one
    /// ([`default_max_reclaim_threads`]).
    pub max_reclaim_threads: usize,
    /// Where reclaim threads may run: on every CPU this process's cgroup allows (the default,
    /// as Linux's kswapd runs whatever CPU the program was pinned to) or only on the program's
    /// own CPUs. Pinned to one CPU, redis and memcached served more requests with `Any`, and
    /// memcached's open-loop p99, taken by a load generator on the other CPU, got longer
    /// (`bench/results/reclaim-cpus/README.md`, `bench/results/harness-50-reclaim-cpus/README.md`).
    pub reclaim_cpus: ReclaimCpus,
    /// If set, a line of JSON with the reclaim scheduler's state and the fault and eviction
    /// counters is appended to this file every [`crate::STATS_TRACE_INTERVAL`].
    pub stats_trace: Option<PathBuf>,
    /// Publish a live status file for `gleaner status` every second (see
    /// [`crate::status_dir`]). Default off; the preload library turns it on.
    pub publish_status: bool,
    /// An elastic budget: [`RegionConfig::local_budget`] is its floor, and the region registers
    /// with the node daemon (`gleaner node`) as a far program and applies the grants it gets,
    /// between the floor and this ceiling (`evict/elastic.rs`). None (the default): the budget
    /// stays fixed. A fork child's region never has one.
    pub elastic: Option<ElasticBudget>,
    /// What to fetch ahead of demand: `none`, `next:N`, `stride`, `readahead`, `leap[:PWMAX]`.
    /// Default [`DEFAULT_PREFETCH`] (`leap:32`).
    pub prefetch: PrefetcherKind,
    /// How prefetched pages reach the program: `marker` (default) or `staged`.
    pub prefetch_install: PrefetchInstall,
    /// How long a prefetch may wait for a scheduling memnode's link (`gleaner memnode
    /// --bandwidth`) before the memnode drops it. None (default): the 95th percentile of the
    /// time prefetched pages wait for their first use, once measured (later than that, a
    /// prefetch no longer hides a fault).
    pub prefetch_deadline: Option<Duration>,
    /// Eviction order: [`DEFAULT_EVICT`] (`frequency`), `recency`, `active`, `rackmem`, `fifo`,
    /// `refault` or `clock`.
    pub evict: EvictKind,
    /// Whether a reclaim thread scans the region for pages written since its last scan and
    /// tells the eviction order (`evict/access.rs`): `auto` (default: where asynchronous dirty
    /// tracking is, with an adaptive period), `off`, or a fixed period.
    pub access_scan: AccessScanSetting,
    /// If set, every fault is recorded here (the `gleaner trace` format) for offline replay.
    pub trace: Option<PathBuf>,
    /// Install pages that were rewritten after coming back from the memnode writable on their
    /// next read fetches, saving the write-protect fault (`on`, default), or track every read
    /// fetch (`off`; the predictor then reports its precision in shadow). Only synchronous dirty
    /// tracking has write-protect faults to save: under asynchronous tracking it runs in shadow.
    pub predict_writes: WritePrediction,
}

impl RegionConfig {
    /// A region of `size` bytes with `local_budget` bytes resident at most, on an embedded memnode.
    pub fn new(size: usize, local_budget: usize) -> RegionConfig {
        RegionConfig {
            size,
            local_budget,
            memnode: MemnodeTarget::Embedded,
            handler_threads: 0,
            pin_handlers: true,
            handler_spin: Duration::ZERO,
            handlers_poll: false,
            data_path: DataPath::Auto,
            compression: Compression::default(),
            max_decode: DecodeBudget::default(),
            drop_far_copies: FarCopies::default(),
            encryption: Encryption::default(),
            dirty_tracking: DirtyTracking::Auto,
            evict_batch: 0,
            allow_user_mode_only: false,
            stats_path: None,
            reply_timeout: Duration::from_secs(30),
            full_overflow: None,
            fork_visible: false,
            fork: ForkMode::Far,
            fork_local_budget: None,
            thread_start_hook: None,
            release_hook: None,
            sparse: false,
            reclaim: ReclaimMode::default(),
            max_reclaim_threads: default_max_reclaim_threads(),
            reclaim_cpus: ReclaimCpus::Any,
            stats_trace: None,
            elastic: None,
            publish_status: false,
            prefetch: DEFAULT_PREFETCH,
            prefetch_install: PrefetchInstall::default(),
            prefetch_deadline: None,
            evict: DEFAULT_EVICT,
            access_scan: AccessScanSetting::Auto,
            trace: None,
            predict_writes: WritePrediction::On,
        }
    }

    /// Uses the memnode at `endpoint` with the token in `token_file` (None: the default file).
    pub fn with_memnode(mut self, endpoint: Endpoint, token_file: Option<PathBuf>) -> Self {
        self.memnode = MemnodeTarget::Remote {
            endpoint,
            token_file,
        };
        self
    }

    /// Uses the memnodes at `addresses`: one address, or several separated by commas (a pool,
    /// each far page on `replicas` of them: default 2).
    pub fn with_memnodes(
        mut self,
        addresses: &str,
        token_file: Option<PathBuf>,
        replicas: Option<usize>,
    ) -> Result<Self, String> {
        self.memnode = MemnodeTarget::from_addresses(addresses, token_file, replicas)?;
        Ok(self)
    }

    /// Checks the configuration without creating anything.
    pub fn validate_only(&self) -> Result<(), PagerError> {
        self.validate().map(|_| ())
    }

    /// Checks the configuration and returns `(pages, budget_pages)`.
    pub(crate) fn validate(&self) -> Result<(usize, usize), PagerError> {
        if self.size == 0 {
            return Err(PagerError::Config("region size must be above zero".into()));
        }
        if self.handler_threads > 64 {
            return Err(PagerError::Config(format!(
                "handler_threads must be between 1 and 64 (or 0: one per CPU), not {}",
                self.handler_threads
            )));
        }
        if self.evict_batch > gleaner_proto::MAX_BATCH_PAGES {
            return Err(PagerError::Config(format!(
                "evict_batch must be between 1 and {} pages (or 0: chosen from the budget), not {}",
                gleaner_proto::MAX_BATCH_PAGES,
                self.evict_batch
            )));
        }
        if self.max_reclaim_threads == 0 || self.max_reclaim_threads > 64 {
            return Err(PagerError::Config(format!(
                "max_reclaim_threads must be between 1 and 64, not {}",
                self.max_reclaim_threads
            )));
        }
        if let ReclaimMode::Static(n) = self.reclaim {
            if n == 0 || n > 64 {
                return Err(PagerError::Config(format!(
                    "a static reclaim pool needs between 1 and 64 threads, not {n}"
                )));
            }
        }
        if matches!(self.evict, EvictKind::Lru | EvictKind::Belady) {
            return Err(PagerError::Config(format!(
                "eviction policy `{}` exists only in the simulator (`gleaner trace replay`); \
                 the engine offers fifo, clock and rackmem",
                self.evict
            )));
        }
        let pages = self.size.div_ceil(PAGE_SIZE);
        let budget = self.local_budget / PAGE_SIZE;
        let min = self.min_budget_pages();
        if budget < min {
            return Err(PagerError::Config(format!(
                "local budget of {} is too small to make progress: at least {} ({} pages: {} \
                 eviction batches of {} pages, plus one page per handler thread) is needed",
                gleaner_proto::units::format_size(self.local_budget as u64),
                gleaner_proto::units::format_size((min * PAGE_SIZE) as u64),
                min,
                MIN_BUDGET_BATCHES,
                self.batch_pages()
            )));
        }
        if let Some(e) = &self.elastic {
            if e.ceiling < self.local_budget {
                return Err(PagerError::Config(format!(
                    "the elastic budget's ceiling ({}) is below its floor, the local budget ({})",
                    gleaner_proto::units::format_size(e.ceiling as u64),
                    gleaner_proto::units::format_size(self.local_budget as u64)
                )));
            }
        }
        if let Some(child) = self.fork_local_budget {
            let c = self.fork_child_config();
            if c.local_budget > child {
                return Err(PagerError::Config(format!(
                    "a fork child's local budget of {} is too small to make progress: at least                      {} is needed",
                    gleaner_proto::units::format_size(child as u64),
                    gleaner_proto::units::format_size(c.local_budget as u64)
                )));
            }
        }
        Ok((pages, budget.min(pages.max(min))))
    }

    /// The configuration of a fork child's region (`fork = far`): this one with the child's
    /// budget, [`RegionConfig::fork_local_budget`] or a [`FORK_CHILD_BUDGET_DIVISOR`]th of this
    /// one's, raised to the smallest workable budget; no fault trace or stats trace (their files
    /// are the parent's).
    pub(crate) fn fork_child_config(&self) -> RegionConfig {
        let mut c = self.clone();
        c.local_budget = self
            .fork_local_budget
            .unwrap_or(self.local_budget / FORK_CHILD_BUDGET_DIVISOR);
        let min = c.min_budget_pages() * PAGE_SIZE;
        c.local_budget = c.local_budget.max(min);
        c.trace = None;
        c.stats_trace = None;
        c.stats_path = None;
        c.elastic = None;
        c
    }

    /// The smallest workable budget in pages.
    pub fn min_budget_pages(&self) -> usize {
        MIN_BUDGET_BATCHES * self.batch_pages() + self.handler_count()
    }

    /// Pages per eviction batch: `evict_batch`, or with 0 a sixteenth of the budget between
    /// [`MIN_AUTO_EVICT_BATCH`] and [`DEFAULT_EVICT_BATCH`] (the largest batch: with 0, slow
    /// batches take fewer pages, see [`RegionConfig::evict_batch`]).
    pub fn batch_pages(&self) -> usize {
        if self.evict_batch > 0 {
            self.evict_batch
        } else {
            (self.local_budget / PAGE_SIZE / 16).clamp(MIN_AUTO_EVICT_BATCH, DEFAULT_EVICT_BATCH)
        }
    }

    /// How many fault handlers the region runs: `handler_threads`, or with 0 one per CPU the
    /// process may run on, at most [`MAX_AUTO_HANDLERS`].
    pub fn handler_count(&self) -> usize {
        if self.handler_threads > 0 {
            self.handler_threads
        } else {
            crate::cpus::allowed_cpus()
                .len()
                .clamp(1, MAX_AUTO_HANDLERS)
        }
    }

    /// Each handler's CPU (None: not pinned), in order.
    pub(crate) fn handler_placement(&self) -> Vec<Option<usize>> {
        let cpus = crate::cpus::allowed_cpus();
        spread(self.handler_count(), &cpus)
            .into_iter()
            .map(|cpu| cpu.filter(|_| self.pin_handlers))
            .collect()
    }
}

/// Places `count` handlers on `cpus`: spread evenly when there are fewer handlers than CPUs
/// (4 of 16 go to the 1st, 5th, 9th and 13th, one in each quarter of the mask rather than all on
/// its first CPUs), round robin when there are more; none pinned when `cpus` is empty.
fn spread(count: usize, cpus: &[usize]) -> Vec<Option<usize>> {
    (0..count)
        .map(|i| match cpus.len() {
            0 => None,
            n if count <= n => Some(cpus[i * n / count]),
            n => Some(cpus[i % n]),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_print() {
        assert_eq!("auto".parse(), Ok(AccessScanSetting::Auto));
        assert_eq!("off".parse(), Ok(AccessScanSetting::Off));
        assert_eq!(
            "100ms".parse(),
            Ok(AccessScanSetting::Every(Duration::from_millis(100)))
        );
        assert_eq!(
            "250".parse(),
            Ok(AccessScanSetting::Every(Duration::from_millis(250)))
        );
        assert!("0ms".parse::<AccessScanSetting>().is_err());
        let e = "sometimes".parse::<AccessScanSetting>().unwrap_err();
        assert!(e.contains("auto") && e.contains("off"), "{e}");
        for s in ["auto", "off", "40ms"] {
            assert_eq!(s.parse::<AccessScanSetting>().unwrap().to_string(), s);
        }
    }

    #[test]
    fn handlers_spread_over_the_cpus_and_wrap_round_when_they_outnumber_them() {
        let sixteen: Vec<usize> = (0..16).collect();
        assert_eq!(spread(4, &sixteen), [Some(0), Some(4), Some(8), Some(12)]);
        assert_eq!(spread(2, &[3, 5]), [Some(3), Some(5)]);
        assert_eq!(spread(1, &[3, 5]), [Some(3)]);
        assert_eq!(
            spread(5, &[3, 5]),
            [Some(3), Some(5), Some(3), Some(5), Some(3)]
        );
        assert_eq!(spread(2, &[]), [None, None]);
    }

    #[test]
    fn memnode_addresses_make_one_memnode_or_a_pool() {
        let one = MemnodeTarget::from_addresses("10.0.0.1:7070", None, None).unwrap();
        assert!(matches!(one, MemnodeTarget::Remote { .. }), "{one:?}");
        let pool = MemnodeTarget::from_addresses("a:1, b:2,unix:/s", None, None).unwrap();
        let MemnodeTarget::Pool {
            endpoints,
            replicas,
            ..
        } = pool
        else {
            panic!("not a pool");
        };
        assert_eq!(endpoints.len(), 3);
        assert_eq!(endpoints[1].to_string(), "b:2");
        assert_eq!(replicas, 2);
        let one_replica = MemnodeTarget::from_addresses("a:1", None, Some(1)).unwrap();
        assert!(matches!(
            one_replica,
            MemnodeTarget::Pool { replicas: 1, .. }
        ));
        let bad = MemnodeTarget::from_addresses("a:1,", None, None).unwrap_err();
        assert!(bad.contains("not a memnode address"), "{bad}");
    }

    #[test]
    fn too_small_budget_is_refused_with_the_minimum_named() {
        let mut cfg = RegionConfig::new(1 << 30, 64 * 1024);
        cfg.handler_threads = 2;
        cfg.evict_batch = 32;
        let msg = cfg.validate().unwrap_err().to_string();
        assert!(msg.contains("too small"), "{msg}");
        assert!(msg.contains("130 pages"), "{msg}");
        assert!(RegionConfig::new(1 << 30, 1 << 20).validate().is_ok());
        assert!(RegionConfig::new(0, 1 << 20).validate().is_err());
    }
}
