//! `libgleaner_preload.so`: loaded with `LD_PRELOAD`, it puts an unmodified program's heap
//! (`malloc` and friends) and its private anonymous mappings in far memory.
//!
//! At load time a constructor reserves one large arena, registers it with userfaultfd through the
//! pager, and connects to the memnode. From then on the program's allocations are carved from the
//! arena, while gleaner's own runtime (its threads, buffers and bookkeeping) allocates from the C
//! library's heap, so the threads that serve faults never fault on managed memory. The
//! descriptors the pager holds are the program's to see but not to close (`descriptors.rs`).
//!
//! Configuration (environment variables; `GLEANER_PRINT_CONFIG=1` prints the values in force):
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `GLEANER_LOCAL_MEM` | local memory budget (e.g. `512M`); **required**: without it the library stays inert | — |
//! | `GLEANER_MEMNODE` | memnode address (`HOST:PORT`, `unix:PATH`), or several separated by commas: a pool | a private embedded memnode |
//! | `GLEANER_REPLICAS` | copies of each far page in a pool (1 to the number of memnodes) | `2` with several memnodes |
//! | `GLEANER_TOKEN_FILE` | the memnode's token file | `~/.gleaner/token` |
//! | `GLEANER_MEMNODE_TIMEOUT` | seconds to wait for a memnode's reply before reconnecting, announced on stderr every third of it (1-5 s) while it lasts (a TCP memnode: a broken connection is replaced within the session's lease, the program only waits) | `30` |
//! | `GLEANER_ARENA_SIZE` | address space reserved for managed memory | `64G` |
//! | `GLEANER_HEAP_RETAIN` | freed blocks of 256 KiB or more kept for reuse, in all (`0`: none), each for at most a second | a quarter of the budget, at most 1G |
//! | `GLEANER_HANDLERS` | fault-handler threads (0: one per CPU, at most 4, each pinned to its CPU) | `0` |
//! | `GLEANER_PIN_HANDLERS` | pin each fault handler to one CPU (`1`) or not (`0`) | `1` |
//! | `GLEANER_HANDLER_SPIN_US` | how long a handler polls without blocking after a message | `0` |
//! | `GLEANER_HANDLERS_POLL` | handlers wait in `poll` then read (`1`) instead of inside `read` (`0`; kernels whose userfaultfd ignores `RWF_NOWAIT` always poll) | `0` |
//! | `GLEANER_EVICT_BATCH` | pages per eviction batch | a sixteenth of the budget, 16 to 128, and fewer (down to 16) while writing a batch back takes over about 1 ms (a slow link) |
//! | `GLEANER_DIRTY_TRACKING` | `auto` (asynchronous where the kernel offers it and there is no swap), `async` or `sync` | `auto` |
//! | `GLEANER_DATA_PATH` | `auto` (shared memory for a memnode on this host), `shm` or `socket` | `auto` |
//! | `GLEANER_COMPRESS` | far-page compression: `auto` (LZ4, and zstd for write-backs over a link where it is measured cheaper), `lz4`, `zstd` or `off` | `auto` |
//! | `GLEANER_MAX_DECODE_US` | pages decoding slower than this many µs are stored raw: a number, `auto` or `off` | `auto` (1.5 with lz4) |
//! | `GLEANER_DROP_FAR_COPIES` | which fetched pages drop their far copy: `all`, `demand` or `none` | `all` |
//! | `GLEANER_ENCRYPT` | seal far pages with AES-256-GCM: `on` or `off` | `on` |
//! | `GLEANER_KEY_FILE` | derive the page key from this file (64 hex digits, mode 0600) | a random key |
//! | `GLEANER_STATS` | write the region's stats JSON here at exit (`%p` is replaced by the pid) | — |
//! | `GLEANER_RECLAIM` | who reclaims: `hermit`, `hermit:paper`, `static:N` or `direct` | `hermit` |
//! | `GLEANER_MAX_RECLAIMERS` | the most reclaim threads `hermit` runs at once | half the CPUs, at least 1 |
//! | `GLEANER_RECLAIM_CPUS` | where reclaim threads run: `any` (every CPU the cgroup allows, as kswapd) or `program` (the program's own CPUs) | `any` |
//! | `GLEANER_PREFETCH` | prefetcher: `none`, `next:N`, `stride`, `readahead`, `leap`, `leap:PWMAX` | `leap:32` |
//! | `GLEANER_PREFETCH_DEADLINE_US` | how long a prefetch may wait for a scheduling memnode's link (`--bandwidth`) before it is dropped, µs | learnt: the 95th percentile of prefetched pages' wait for their first use |
//! | `GLEANER_PREFETCH_INSTALL` | how prefetched pages reach the program: `marker` or `staged` | `marker` |
//! | `GLEANER_EVICT` | eviction order: `recency`, `rackmem`, `fifo`, `refault`, `active`, `frequency` or `clock` | `recency` |
//! | `GLEANER_ACCESS_SCAN` | the access scan feeding the eviction order with written bits: `auto`, `off` or a period (`100ms`) | `auto` |
//! | `GLEANER_PREDICT_WRITES` | install pages seen rewritten writable on their next read fetches: `on` or `off` | `on` |
//! | `GLEANER_TRACE` | record every fault here for `gleaner trace replay` (`%p`: pid) | — |
//! | `GLEANER_STATS_TRACE` | append a JSON line of reclaim and fault counters here every 100 ms (`%p`: pid) | — |
//! | `GLEANER_STATUS_DIR` | where each process publishes its live status for `gleaner status` | `/dev/shm/gleaner-status-UID` (`/tmp/...` where `/dev/shm` is not writable; never `$TMPDIR`) |
//! | `GLEANER_LOG` | pager messages on stderr: `error`, `warn`, `info`, `debug`, `trace` | `warn` |
//! | `GLEANER_BIN` | the `gleaner` executable, to start an embedded memnode | on `PATH` |
//! | `GLEANER_FORK` | what a fork child gets: `far` (a pager of its own on a snapshot of the far pages) or `home` (every page brought home before the fork) | `far` |
//! | `GLEANER_FORK_LOCAL_MEM` | a fork child's local budget | a quarter of `GLEANER_LOCAL_MEM` |
//! | `GLEANER_LOCAL_MEM_CEILING` | an elastic budget: `GLEANER_LOCAL_MEM` is its floor, this its ceiling; the pager registers with the node daemon (`GLEANER_NODE_SOCKET`) and follows its grants | — (a fixed budget) |
//! | `GLEANER_ELASTIC_NAME` | the name an elastic budget's registration shows in `gleaner node status` (with the pid) | the executable's name |
//! | `GLEANER_NODE_SOCKET` | the node daemon's socket, for an elastic budget | `gleaner_node::client::default_socket` |
//! | `GLEANER_FAIL_OPEN` | `1`: a process whose pager cannot start runs all-local, with a warning, instead of stopping with exit 86 | `0` |
//! | `GLEANER_TEST_HANG` | a test hook: `handlers` makes every fault handler wait for a page of its own far memory (the watchdog must stop the process), `all` the watchdog too (`gleaner run` must end it) | — |
//! | `GLEANER_REPORT_DIR` | write `pager-PID.json` here saying whether this process's pager started (set by `gleaner run`, which counts them) | — |
//!
//! `fork` (`GLEANER_FORK=far`, the default): the child gets a pager of its own, started in the
//! fork's child handler before the program goes on, with its own budget
//! (`GLEANER_FORK_LOCAL_MEM`); it reads the parent's far pages as they were at the fork (a
//! snapshot the parent's shared memory or the memnodes keep until the child exits or execs) and
//! writes its own to a session of its own. Neither process brings its heap home. With
//! `GLEANER_FORK=home`, or where no snapshot can be had (a degraded or draining pool, a memnode
//! with no room for the copy, a fork child forking again), every page held only on the memnode
//! is brought back before the child is created, so the child (which then has no pager) sees
//! exactly the parent's memory; the parent then evicts back under its budget.
#![deny(missing_docs)]

mod arena;
mod credentials;
mod descriptors;
mod dump;
mod exec;
mod heap;
mod hidden;
mod interpose;
mod loader;
mod lock;
mod locking;
mod logger;
mod real;
mod report_files;
mod reserve;
mod retain;
mod slab;
mod stdio;
mod wipe;

use std::cell::Cell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::OnceLock;

use gleaner_pager::{
    Compression, DataPath, DecodeBudget, DirtyTracking, Encryption, EvictKind, FarCopies, ForkMode,
    MemnodeTarget, PrefetchInstall, PrefetcherKind, ReclaimMode, Region, RegionConfig,
    WritePrediction,
};
use gleaner_proto::units::{format_size, parse_size};

#[global_allocator]
static RUNTIME_HEAP: real::RuntimeAlloc = real::RuntimeAlloc;

thread_local! {
    /// Set while this thread runs gleaner's own code that may reach the C allocator.
    static IN_RUNTIME: Cell<bool> = const { Cell::new(false) };
}

/// The pid that started the pager (0 before start-up).
static OWNER_PID: AtomicI32 = AtomicI32::new(0);
/// The pid whose pager runs: the owner's, or a fork child's that pages from its parent's
/// snapshot.
static PAGER_PID: AtomicI32 = AtomicI32::new(0);
/// `GLEANER_STATS` as given: where each process writes its stats at exit, `%p` its pid.
static STATS_TEMPLATE: OnceLock<Option<String>> = OnceLock::new();
/// The pid that has written its stats and withdrawn its status ([`finish_process`]), once.
static FINISHED_PID: AtomicI32 = AtomicI32::new(0);
/// Set by the fork prepare hook when it took the allocator locks (only the pager's owner does).
static LOCKED_FOR_FORK: AtomicBool = AtomicBool::new(false);

/// Whether the calling thread is inside gleaner's runtime (its allocations must stay unmanaged).
pub(crate) fn in_runtime() -> bool {
    IN_RUNTIME.with(|c| c.get())
}

/// A program thread inside the pager's code (a discard, a reuse), until dropped: marked as in
/// the runtime, so that a fork child's `_exit` from a signal handler that interrupted it does
/// not wait for the locks it may hold ([`finish_fork_child`]).
pub(crate) struct InPager(bool);

impl InPager {
    pub(crate) fn enter() -> InPager {
        InPager(IN_RUNTIME.with(|c| c.replace(true)))
    }
}

impl Drop for InPager {
    fn drop(&mut self) {
        IN_RUNTIME.with(|c| c.set(self.0));
    }
}

/// Whether this process's managed memory is paged: it started the pager, or it is a fork child
/// that continued with its own. False in a fork child whose parent brought its pages home (its
/// managed memory is plain memory).
pub(crate) fn has_pager() -> bool {
    // SAFETY: getpid has no preconditions.
    PAGER_PID.load(Ordering::Relaxed) == unsafe { libc::getpid() }
}

struct Config {
    local: u64,
    memnode: Option<String>,
    replicas: Option<usize>,
    token_file: Option<PathBuf>,
    reply_timeout: Option<std::time::Duration>,
    arena: u64,
    /// Bytes of freed big blocks kept for reuse (`retain.rs`).
    heap_retain: u64,
    handlers: usize,
    handler_spin_us: u64,
    handlers_poll: bool,
    pin_handlers: bool,
    data_path: DataPath,
    compression: Compression,
    max_decode: DecodeBudget,
    drop_far_copies: FarCopies,
    encryption: Encryption,
    dirty_tracking: DirtyTracking,
    evict_batch: Option<usize>,
    stats: Option<String>,
    reclaim: ReclaimMode,
    max_reclaimers: usize,
    reclaim_cpus: gleaner_pager::ReclaimCpus,
    stats_trace: Option<PathBuf>,
    prefetch: PrefetcherKind,
    prefetch_install: PrefetchInstall,
    prefetch_deadline_us: Option<u64>,
    evict: EvictKind,
    access_scan: gleaner_pager::AccessScanSetting,
    predict_writes: WritePrediction,
    trace: Option<PathBuf>,
    fork: ForkMode,
    fork_local: Option<u64>,
    elastic_ceiling: Option<u64>,
}

fn config_from_env() -> Result<Option<Config>, String> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let Some(local) = var("GLEANER_LOCAL_MEM") else {
        return Ok(None);
    };
    // Never inside gleaner's own executable (a memnode, the launcher): belt and braces with the
    // launcher removing LD_PRELOAD from the environment of the processes it starts.
    if std::env::current_exe().is_ok_and(|p| p.file_name().is_some_and(|n| n == "gleaner")) {
        return Ok(None);
    }
    let size = |k: &str, v: &str| parse_size(v).map_err(|e| format!("{k}: {e}"));
    // `%p` becomes the pid, so that every process of a run (children that exec another program
    // under the same environment) writes its own file.
    let per_process_path =
        |k: &str| var(k).map(|p| PathBuf::from(p.replace("%p", &std::process::id().to_string())));
    let local = size("GLEANER_LOCAL_MEM", &local)?;
    Ok(Some(Config {
        local,
        memnode: var("GLEANER_MEMNODE"),
        replicas: parsed("GLEANER_REPLICAS")?,
        token_file: var("GLEANER_TOKEN_FILE").map(PathBuf::from),
        reply_timeout: parsed::<f64>("GLEANER_MEMNODE_TIMEOUT")?
            .map(|s| {
                std::time::Duration::try_from_secs_f64(s)
                    .ok()
                    .filter(|d| !d.is_zero())
                    .ok_or(format!(
                        "GLEANER_MEMNODE_TIMEOUT: `{s}` is not a positive number of seconds"
                    ))
            })
            .transpose()?,
        arena: size(
            "GLEANER_ARENA_SIZE",
            &var("GLEANER_ARENA_SIZE").unwrap_or("64G".into()),
        )?,
        // A quarter of the budget and at most 1 GiB by default: what kept blocks hold counts
        // against the budget like any resident page, until reclaim or their age sends them.
        heap_retain: var("GLEANER_HEAP_RETAIN")
            .map(|v| size("GLEANER_HEAP_RETAIN", &v))
            .transpose()?
            .unwrap_or((local / 4).min(1 << 30)),
        handlers: parsed("GLEANER_HANDLERS")?.unwrap_or(0),
        handler_spin_us: parsed("GLEANER_HANDLER_SPIN_US")?.unwrap_or(0),
        handlers_poll: parsed::<u8>("GLEANER_HANDLERS_POLL")?.unwrap_or(0) != 0,
        pin_handlers: parsed::<u8>("GLEANER_PIN_HANDLERS")?.unwrap_or(1) != 0,
        data_path: parsed("GLEANER_DATA_PATH")?.unwrap_or_default(),
        compression: parsed("GLEANER_COMPRESS")?.unwrap_or_default(),
        max_decode: parsed("GLEANER_MAX_DECODE_US")?.unwrap_or_default(),
        drop_far_copies: parsed("GLEANER_DROP_FAR_COPIES")?.unwrap_or_default(),
        encryption: parsed::<Encryption>("GLEANER_ENCRYPT")?
            .unwrap_or_default()
            .with_key_file(var("GLEANER_KEY_FILE").map(PathBuf::from))
            .map_err(|e| format!("GLEANER_KEY_FILE: {e}"))?,
        dirty_tracking: parsed("GLEANER_DIRTY_TRACKING")?.unwrap_or_default(),
        evict_batch: parsed("GLEANER_EVICT_BATCH")?,
        stats: var("GLEANER_STATS"),
        reclaim: parsed("GLEANER_RECLAIM")?.unwrap_or_default(),
        max_reclaimers: parsed("GLEANER_MAX_RECLAIMERS")?
            .unwrap_or_else(gleaner_pager::default_max_reclaim_threads),
        reclaim_cpus: parsed("GLEANER_RECLAIM_CPUS")?.unwrap_or_default(),
        stats_trace: per_process_path("GLEANER_STATS_TRACE"),
        prefetch: parsed("GLEANER_PREFETCH")?.unwrap_or(gleaner_pager::DEFAULT_PREFETCH),
        prefetch_install: parsed("GLEANER_PREFETCH_INSTALL")?.unwrap_or_default(),
        prefetch_deadline_us: parsed("GLEANER_PREFETCH_DEADLINE_US")?,
        evict: parsed("GLEANER_EVICT")?.unwrap_or(gleaner_pager::DEFAULT_EVICT),
        access_scan: parsed("GLEANER_ACCESS_SCAN")?.unwrap_or_default(),
        predict_writes: parsed("GLEANER_PREDICT_WRITES")?.unwrap_or_default(),
        trace: per_process_path("GLEANER_TRACE"),
        fork: parsed("GLEANER_FORK")?.unwrap_or_default(),
        fork_local: var("GLEANER_FORK_LOCAL_MEM")
            .map(|v| size("GLEANER_FORK_LOCAL_MEM", &v))
            .transpose()?,
        elastic_ceiling: var("GLEANER_LOCAL_MEM_CEILING")
            .map(|v| size("GLEANER_LOCAL_MEM_CEILING", &v))
            .transpose()?,
    }))
}

/// How long a freed big block is kept for reuse at most (`retain.rs`), in milliseconds.
const HEAP_RETAIN_MS: u64 = 1000;
/// The region's release hook: freed big blocks idle longer than their reuses wait go before
/// anything is evicted (`retain.rs`).
fn release_kept_blocks(pages: usize) -> usize {
    arena::get().map_or(0, |a| a.release_idle(pages))
}

/// The variable `name` parsed as a `T`, if set and not empty; an error names the variable.
fn parsed<T: std::str::FromStr>(name: &str) -> Result<Option<T>, String>
where
    T::Err: std::fmt::Display,
{
    match std::env::var(name).ok().filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => v
            .parse()
            .map(Some)
            .map_err(|e| format!("{name}: `{v}`: {e}")),
    }
}

/// The smallest managed reservation worth starting a pager for.
const MIN_ARENA: u64 = 64 << 20;

/// The managed reservation's size: `asked`, or less where the process's address-space limit
/// (`ulimit -v`, `RLIMIT_AS`, which batch schedulers set) would refuse it. The reservation and
/// the shared-memory store's arena count against that limit although nothing in them is
/// committed: with `ulimit -v 8000000` every program failed to start (exit 86, "reserving the
/// far arena failed: Cannot allocate memory"). Now gleaner takes at most half of the room the
/// limit leaves: the reservation and the store's arena (twice the reservation and two grants,
/// a grant at most the reservation's size or 64 MiB: `gleaner_pager`'s `store/shm.rs`), at
/// most five times the reservation and 128 MiB. The program's allocations beyond the
/// reservation stay local (said once).
fn arena_within_address_limit(asked: u64) -> Result<u64, String> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the live `lim`.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } != 0
        || lim.rlim_cur == libc::RLIM_INFINITY
    {
        return Ok(asked);
    }
    let limit = lim.rlim_cur;
    let page = gleaner_pager::PAGE_SIZE as u64;
    // VmSize: the first field of statm, in pages.
    let used = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |pages| pages * page);
    let ours = limit.saturating_sub(used) / 2;
    let fit = ours.saturating_sub(2 * MIN_ARENA) / 5 / page * page;
    if fit >= asked {
        return Ok(asked);
    }
    if fit < MIN_ARENA {
        return Err(format!(
            "the address-space limit (ulimit -v: {}, {} of it in use) leaves no room for far \
             memory: gleaner needs a limit of at least {}; raise it, or run the program without \
             gleaner",
            format_size(limit),
            format_size(used),
            format_size(used + 2 * (7 * MIN_ARENA)),
        ));
    }
    log::warn!(
        "the address-space limit (ulimit -v: {}) leaves room for {} of far-memory heap, not {}: \
         allocations beyond it stay in local memory",
        format_size(limit),
        format_size(fit),
        format_size(asked)
    );
    Ok(fit)
}

/// Starts this process's pager; `Ok(false)` when the library is inert (no budget set).
fn start() -> Result<bool, String> {
    let Some(cfg) = config_from_env()? else {
        return Ok(false);
    };
    logger::install();
    if std::env::var_os("GLEANER_PRINT_CONFIG").is_some() {
        eprintln!(
            "gleaner: local {} | memnode {}{} | token {} | arena {} (freed blocks kept {}) | handlers {} (spin {} us) | \
             data path {} | compress {} (max decode {} us) | encrypt {} | dirty tracking {} | stats {} | reclaim {} (at most {} threads, on {} CPUs) | stats trace {} | \
             prefetch {} ({}) | evict {} | predict writes {} | fault trace {} | fork {} (child \
             local {})",
            format_size(cfg.local),
            cfg.memnode.as_deref().unwrap_or("embedded"),
            cfg.replicas.map_or(String::new(), |r| format!(" ({r} replicas)")),
            cfg.token_file
                .as_ref()
                .map_or("default".into(), |p| p.display().to_string()),
            format_size(cfg.arena),
            format_size(cfg.heap_retain),
            if cfg.handlers == 0 {
                format!(
                    "one per CPU, at most {}",
                    gleaner_pager::MAX_AUTO_HANDLERS
                )
            } else {
                cfg.handlers.to_string()
            },
            cfg.handler_spin_us,
            cfg.data_path,
            cfg.compression,
            cfg.max_decode,
            cfg.encryption.describe(),
            cfg.dirty_tracking,
            cfg.stats.as_deref().unwrap_or("-"),
            cfg.reclaim,
            cfg.max_reclaimers,
            cfg.reclaim_cpus,
            cfg.stats_trace
                .as_ref()
                .map_or("-".into(), |p| p.display().to_string()),
            cfg.prefetch,
            cfg.prefetch_install,
            cfg.evict,
            cfg.predict_writes,
            cfg.trace
                .as_ref()
                .map_or("-".into(), |p| p.display().to_string()),
            cfg.fork,
            cfg.fork_local
                .map_or("a quarter".into(), format_size),
        );
    }
    if gleaner_fds::confined() {
        log::warn!(
            "the descriptor limit (ulimit -n: {}) cannot be raised for gleaner's own \
             descriptors: they take numbers from {} up, which the program may miss",
            descriptor_limits(),
            gleaner_fds::floor()
        );
    }
    let arena = arena_within_address_limit(cfg.arena)?;
    let mut rc = RegionConfig::new(arena as usize, cfg.local as usize);
    if let Some(addrs) = &cfg.memnode {
        rc.memnode = MemnodeTarget::from_addresses(addrs, cfg.token_file.clone(), cfg.replicas)
            .map_err(|e| format!("GLEANER_MEMNODE: {e}"))?;
    }
    if let Some(t) = cfg.reply_timeout {
        rc.reply_timeout = t;
    }
    rc.handler_threads = cfg.handlers;
    rc.handler_spin = std::time::Duration::from_micros(cfg.handler_spin_us);
    rc.handlers_poll = cfg.handlers_poll;
    rc.pin_handlers = cfg.pin_handlers;
    rc.data_path = cfg.data_path;
    rc.compression = cfg.compression;
    rc.max_decode = cfg.max_decode;
    rc.drop_far_copies = cfg.drop_far_copies;
    rc.encryption = cfg.encryption.clone();
    rc.dirty_tracking = cfg.dirty_tracking;
    if let Some(n) = cfg.evict_batch {
        rc.evict_batch = n;
    }
    rc.reclaim = cfg.reclaim;
    rc.max_reclaim_threads = cfg.max_reclaimers;
    rc.reclaim_cpus = cfg.reclaim_cpus;
    rc.stats_trace = cfg.stats_trace;
    rc.prefetch = cfg.prefetch;
    rc.prefetch_install = cfg.prefetch_install;
    rc.prefetch_deadline = cfg
        .prefetch_deadline_us
        .map(std::time::Duration::from_micros);
    rc.evict = cfg.evict;
    rc.access_scan = cfg.access_scan;
    rc.predict_writes = cfg.predict_writes;
    rc.trace = cfg.trace;
    rc.fork_visible = true;
    rc.fork = cfg.fork;
    rc.fork_local_budget = cfg.fork_local.map(|b| b as usize);
    rc.publish_status = true;
    rc.elastic = cfg
        .elastic_ceiling
        .map(|ceiling| gleaner_pager::ElasticBudget {
            ceiling: ceiling as usize,
            socket: gleaner_node::client::default_socket(),
            name: format!(
                "{} (pid {})",
                std::env::var("GLEANER_ELASTIC_NAME")
                    .ok()
                    .filter(|n| !n.is_empty())
                    .or_else(|| std::env::current_exe()
                        .ok()
                        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())))
                    .unwrap_or_else(|| "program".into()),
                std::process::id()
            ),
        });
    rc.sparse = true;
    rc.thread_start_hook = Some(mark_runtime_thread);
    rc.release_hook = Some(release_kept_blocks);
    let region = Region::new(rc).map_err(|e| e.to_string())?;
    if let Some(mode) = test_hang()? {
        // The region's last page: the arena carves from its start and never reaches it.
        let last = region.as_ptr() as usize + region.len() - gleaner_pager::PAGE_SIZE;
        gleaner_pager::stuck::arm_test_hang(mode, last);
    }
    gleaner_pager::on_fatal(report_stopped);
    arena::install(region, cfg.heap_retain as usize, HEAP_RETAIN_MS);
    let _ = STATS_TEMPLATE.set(cfg.stats);
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    OWNER_PID.store(pid, Ordering::Relaxed);
    PAGER_PID.store(pid, Ordering::Relaxed);
    // SAFETY: registering plain extern "C" functions with no captured state.
    unsafe {
        libc::atexit(at_exit);
        libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
    }
    Ok(true)
}

/// `GLEANER_TEST_HANG`: a test hook that makes the pager wait for itself (`handlers`: every
/// fault handler; `all`: the watchdog too), for the tests of what finds such a hang
/// (`gleaner_pager::stuck`). Unset or empty: off.
fn test_hang() -> Result<Option<gleaner_pager::stuck::TestHang>, String> {
    use gleaner_pager::stuck::TestHang;
    match std::env::var("GLEANER_TEST_HANG").as_deref() {
        Err(_) | Ok("") => Ok(None),
        Ok("handlers") => Ok(Some(TestHang::Handlers)),
        Ok("all") => Ok(Some(TestHang::HandlersAndWatchdog)),
        Ok(other) => Err(format!(
            "GLEANER_TEST_HANG={other}: give `handlers` or `all` (a test hook)"
        )),
    }
}

/// `GLEANER_TEST_PANIC=PROGRAM`: a test hook that makes a thread of gleaner's panic 200 ms after
/// the pager of a process running PROGRAM started (its executable's file name), for the test
/// that a panic names itself through `gleaner run` whatever the program did to its stderr.
/// Unset, empty or another program: off.
fn start_test_panic() {
    let wanted = std::env::var("GLEANER_TEST_PANIC").unwrap_or_default();
    if wanted.is_empty() || wanted != program_name() {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("gleaner-test-panic".into())
        .spawn(|| {
            mark_runtime_thread();
            std::thread::sleep(std::time::Duration::from_millis(200));
            panic!("a test panic (GLEANER_TEST_PANIC)");
        });
}

/// This process's descriptor limits, for messages: `soft, hard HARD`.
fn descriptor_limits() -> String {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the live local.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    format!("{}, hard {}", lim.rlim_cur, lim.rlim_max)
}

pub(crate) fn mark_runtime_thread() {
    IN_RUNTIME.with(|c| c.set(true));
}

extern "C" fn init() {
    IN_RUNTIME.with(|c| c.set(true));
    // A panic on any thread of the program's gleaner ends the program (`SIGABRT`), as the
    // build's `panic = "unwind"` alone would not.
    gleaner_sys::panic::abort_on_panic();
    // And says so to `gleaner run`, whatever the program did to its descriptor 2.
    gleaner_sys::panic::report_panics_to(|message| {
        let _ = report_pager("panicked", Some(message));
    });
    // Read now, while the environment is where the kernel put it: a pager thread that reports a
    // stop later must not read it (`report_dir`).
    let _ = report_dir();
    // Before managed memory exists: from then on the dynamic linker's records stay out of it.
    loader::locate();
    // The pager's descriptors are made above the program's descriptor limit, which is raised
    // meanwhile: the program keeps every number it would have without gleaner.
    let room = gleaner_fds::headroom();
    let pager = start();
    let pager_started = matches!(pager, Ok(true));
    match pager {
        Ok(false) => {}
        Ok(true) => {
            report_pager("started", None);
        }
        Err(e) => {
            let fail_open = std::env::var("GLEANER_FAIL_OPEN").is_ok_and(|v| v == "1");
            let outcome = if fail_open { "fail_open" } else { "failed" };
            let (program, pid) = (program_name(), std::process::id());
            // Under `gleaner run`, the first failure of the run is printed in full and the
            // launcher counts the rest (a shell script's helpers would repeat it dozens of times).
            if report_pager(outcome, Some(&e)) == Report::FirstFailure {
                if fail_open {
                    eprintln!(
                        "gleaner: warning: {program} (pid {pid}) runs entirely in local memory, \
                         because its far memory could not start and fail-open was asked for: {e}"
                    );
                } else {
                    eprintln!(
                        "gleaner: {program} (pid {pid}) was stopped: its far memory could not \
                         start: {e}"
                    );
                }
            }
            if !fail_open {
                // Nothing of the program has run yet.
                gleaner_pager::exit_now(gleaner_pager::FATAL_EXIT_CODE);
            }
        }
    }
    start_reserve(pager_started);
    if pager_started {
        start_test_panic();
    }
    drop(room);
    IN_RUNTIME.with(|c| c.set(false));
}

/// Starts the latency-critical reserve (`reserve/`) if it was asked for; with no pager, the
/// exit and fork hooks the reserve needs are installed here.
fn start_reserve(pager: bool) {
    match reserve::start(arena::get().is_some()) {
        Ok(false) => {}
        Ok(true) => {
            if !pager {
                // SAFETY: registering plain extern "C" functions with no captured state.
                unsafe {
                    libc::atexit(at_exit);
                    libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
                }
            }
            reserve::report::link_node_daemon();
        }
        Err(e) => eprintln!(
            "gleaner: warning: {} (pid {}) runs without its latency-critical reserve, which \
             could not start: {e}",
            program_name(),
            std::process::id()
        ),
    }
}

/// This process's program, for messages: its executable's file name.
pub(crate) fn program_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "this program".into())
}

/// `$GLEANER_REPORT_DIR`, read once at start-up ([`init`]). Later reads of the environment may
/// touch managed memory: a program may move its environment into its heap (redis's
/// `setproctitle` does), and the pager thread that reports a stop must not fault on a page that
/// only it could serve.
pub(crate) fn report_dir() -> Option<&'static PathBuf> {
    REPORT_DIR
        .get_or_init(|| {
            std::env::var_os("GLEANER_REPORT_DIR")
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
        })
        .as_ref()
}

/// `$GLEANER_REPORT_DIR` as [`report_dir`] read it.
static REPORT_DIR: OnceLock<Option<PathBuf>> = OnceLock::new();

/// `$GLEANER_REPORT_DIR` if start-up has read it, without reading it now (no allocation: for
/// the `exec` wrappers, which may run in a `vfork` child).
fn report_dir_known() -> Option<&'static PathBuf> {
    REPORT_DIR.get().and_then(Option::as_ref)
}

/// What [`report_pager`] found.
#[derive(PartialEq)]
enum Report {
    /// This is the run's first failure, or no launcher is counting: print the message.
    FirstFailure,
    /// A started pager, or a failure after the first: the launcher's summary tells.
    Counted,
}

/// The pager's fatal hook: tells `gleaner run` that this process, which ran on far memory, is
/// being stopped because its far memory failed (the pager has printed why). A script that
/// carries on after a helper stopped so must not make the run look successful.
fn report_stopped(message: &str) {
    let was = IN_RUNTIME.with(|c| c.replace(true));
    let _room = gleaner_fds::headroom();
    gleaner_fds::make_room(1);
    report_pager("stopped", Some(message));
    IN_RUNTIME.with(|c| c.set(was));
}

/// Tells `gleaner run` (through `GLEANER_REPORT_DIR`) whether this process's pager started:
/// `started`, `failed` (the process was stopped), `fail_open` (it runs all-local) or, later,
/// `stopped` (its far memory failed mid-run and it was stopped) or `panicked` (gleaner's code
/// panicked: the process aborts). The launcher counts them, so no process of a run falls back
/// to local memory, or ends for far memory's sake, unnoticed.
fn report_pager(outcome: &str, error: Option<&str>) -> Report {
    let Some(dir) = report_dir() else {
        return Report::FirstFailure;
    };
    let pid = std::process::id();
    let line = serde_json::json!({
        "pid": pid,
        "program": program_name(),
        "pager": outcome,
        "error": error,
    })
    .to_string();
    let path = dir.join(format!("pager-{pid}.json"));
    if outcome == "started" {
        // Kept open for the reports to come, which may be written after the program has
        // dropped its privileges (`report_files.rs`).
        report_files::keep(report_files::Kind::Pager, &path);
        if let Some(stats) = stats_path(pid as i32) {
            report_files::keep(report_files::Kind::Stats, &stats);
        }
    }
    if let Err(e) = report_files::write(report_files::Kind::Pager, &path, line.as_bytes()) {
        eprintln!(
            "gleaner: cannot write {}: {e}{}",
            path.display(),
            privileges_note(&e)
        );
        return Report::FirstFailure;
    }
    // The first process that fails to start creates the marker; creation is atomic, so exactly
    // one prints (a stop mid-run is always printed in full by the pager itself).
    let first = error.is_some() && !matches!(outcome, "stopped" | "panicked") && {
        let _making = gleaner_fds::making();
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dir.join("first-failure"))
            .is_ok()
    };
    if first {
        Report::FirstFailure
    } else {
        Report::Counted
    }
}

/// Why a report could not be written, where it is a privilege drop: a process started after its
/// program gave up root (a fork child of `setuid` code) cannot create files in the report
/// directory of a launcher run as root (docs/compatibility.md).
fn privileges_note(e: &std::io::Error) -> &'static str {
    if e.kind() == std::io::ErrorKind::PermissionDenied {
        " (a process started after its program gave up root privileges cannot write the \
         launcher's reports: this one is missing from the run's summary; its far memory is \
         unaffected)"
    } else {
        ""
    }
}

/// Runs `init` when the library is loaded, before `main`.
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// A prefetch hint for the program's far-memory heap (see `include/gleaner.h`): the far pages of
/// `len` bytes at `addr` are fetched in the background, at prefetch priority. Returns 0 when the
/// range starts in managed memory, -1 otherwise (or when the library is inert). Programs and
/// runtimes find it with `dlsym(RTLD_DEFAULT, "gleaner_prefetch")`.
#[no_mangle]
pub extern "C" fn gleaner_prefetch(addr: *const libc::c_void, len: usize) -> libc::c_int {
    let addr = addr as usize;
    let Some(a) = arena::get().filter(|_| arena::contains(addr)) else {
        return -1;
    };
    let was = IN_RUNTIME.with(|c| c.replace(true));
    let base = a.region().as_ptr() as usize;
    a.region().prefetch_hint(addr - base, len);
    IN_RUNTIME.with(|c| c.set(was));
    0
}

extern "C" fn at_exit() {
    let was = IN_RUNTIME.with(|c| c.replace(true));
    reserve::report::finish();
    IN_RUNTIME.with(|c| c.set(was));
    finish_process();
}

/// Where this process writes its stats: `GLEANER_STATS` with `%p` replaced by its pid. A fork
/// child writes its own only where the name holds `%p` (else it would overwrite its parent's).
fn stats_path(pid: i32) -> Option<PathBuf> {
    let template = STATS_TEMPLATE.get()?.as_ref()?;
    let owner = OWNER_PID.load(Ordering::Relaxed) == pid;
    (owner || template.contains("%p"))
        .then(|| PathBuf::from(template.replace("%p", &pid.to_string())))
}

/// A fork child with a pager of its own is ending in `_exit`: [`finish_process`], unless the
/// call comes from inside gleaner's own code (a signal handler that interrupted it, whose locks
/// the stats would wait for).
pub(crate) fn finish_fork_child() {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    if has_pager() && OWNER_PID.load(Ordering::Relaxed) != pid && !in_runtime() {
        finish_process();
    }
}

/// A process that runs a pager is ending (`exit`, or a fork child's `_exit`): its live status
/// file goes, its fault trace (`--trace`) is written out and its stats are written, once. Fork
/// children included: redis's BGSAVE child, for one, ends with `_exit`, and its faults and
/// evictions belong in the run's totals.
pub(crate) fn finish_process() {
    if !has_pager() {
        return;
    }
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    if FINISHED_PID.swap(pid, Ordering::AcqRel) == pid {
        return;
    }
    let was = IN_RUNTIME.with(|c| c.replace(true));
    if let Some(a) = arena::get() {
        // The region is never dropped: its live status file goes now, not with the process.
        a.region().withdraw_status();
        a.region().flush_trace();
        if let Some(path) = stats_path(pid) {
            // A spare descriptor for the file: the program may hold every other one. (Not
            // `with_room`: at exit, no waiting for another thread's turn, a grant's say.)
            let room = gleaner_fds::headroom();
            gleaner_fds::make_room(1);
            let written = report_files::write(
                report_files::Kind::Stats,
                &path,
                a.region().stats_json().as_bytes(),
            );
            gleaner_fds::refill();
            drop(room);
            if let Err(e) = written {
                eprintln!(
                    "gleaner: writing stats to {}: {e}{}",
                    path.display(),
                    privileges_note(&e)
                );
            }
        }
    }
    IN_RUNTIME.with(|c| c.set(was));
}

extern "C" fn fork_prepare() {
    // First, while a pager's handlers still serve (far memory on, the reserve's heap is
    // managed memory that a lock holder may be faulting on).
    reserve::lock_for_fork();
    let Some(a) = arena::get() else { return };
    // Every process with managed memory (a pager's or plain): its child reads them.
    a.lock_fork_advice();
    if !has_pager() {
        return;
    }
    // The allocator's locks first, while the fault handlers still serve: a thread holding
    // one may be waiting for a far page. `prepare_fork` then stops the handlers until the fork
    // is over (no allocator lock is taken while they are stopped), but for this thread's own
    // faults. The stdio streams' records, which the C library rewrites in the child before any
    // fork handler runs there, are brought in now (`stdio.rs`).
    {
        let _in = InPager::enter();
        a.region().pause_eviction_for_fork();
    }
    stdio::touch_streams();
    heap::lock_for_fork();
    a.lock_for_fork();
    LOCKED_FOR_FORK.store(true, Ordering::Release);
    IN_RUNTIME.with(|c| c.set(true));
    a.region().prepare_fork();
    IN_RUNTIME.with(|c| c.set(false));
}

fn unlock_after_fork(a: &arena::Arena) -> bool {
    if !LOCKED_FOR_FORK.swap(false, Ordering::AcqRel) {
        return false;
    }
    // SAFETY: both locks were taken in fork_prepare by the thread that forked (in a child, the
    // only thread there is).
    unsafe {
        a.unlock_after_fork();
        heap::unlock_after_fork();
    }
    true
}

extern "C" fn fork_parent() {
    // SAFETY: taken in fork_prepare.
    unsafe { reserve::unlock_after_fork(false) };
    let Some(a) = arena::get() else { return };
    // SAFETY: taken in fork_prepare, whenever the arena exists.
    unsafe { a.unlock_fork_advice() };
    if unlock_after_fork(a) {
        // gleaner's own code: it closes the child's end of the pipe that tells the parent's
        // store when the child is gone, which the interposed close refuses the program.
        let _in = InPager::enter();
        a.region().after_fork();
    }
}

extern "C" fn fork_child() {
    // SAFETY: taken in fork_prepare (in the child, by its only thread's parent).
    unsafe { reserve::unlock_after_fork(true) };
    // A descriptor limit raised for a parent's thread at the fork goes back to the program's,
    // and the windows in which the parent's other threads were making descriptors are not the
    // child's (its first `close` would wait for them): with far memory on or off, since the
    // reserve's thread makes descriptors too (its status file).
    gleaner_fds::after_fork_in_child();
    let Some(a) = arena::get() else { return };
    // SAFETY: taken in fork_prepare, whenever the arena exists (in the child, by its only
    // thread's parent).
    unsafe { a.unlock_fork_advice() };
    if !unlock_after_fork(a) {
        // No pager in the parent: managed memory is plain memory, and the pages the program
        // marked MADV_WIPEONFORK are dropped here (the kernel never had the advice).
        a.wipe_for_fork_child();
        return;
    }
    // Before the program goes on: until the child's own userfaultfd covers the arena, a page
    // held only on the memnode would read as zeros.
    let was = IN_RUNTIME.with(|c| c.replace(true));
    let room = gleaner_fds::headroom();
    match a.region().continue_in_child() {
        Ok(Some(region)) => {
            a.replace_region(region);
            // SAFETY: getpid has no preconditions.
            PAGER_PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
            // Counted by `gleaner run` like any process on far memory (which also removes its
            // live status file at the end: a child killed by a signal cannot).
            report_pager("started", None);
        }
        // The parent brought its pages home: plain memory.
        Ok(None) => {}
        Err(e) => {
            eprintln!(
                "gleaner: fork child {} (pid {}) cannot page the far memory it inherited, and \
                 stops rather than read it as zeros: {e}",
                program_name(),
                std::process::id()
            );
            report_pager("failed", Some(&e.to_string()));
            gleaner_pager::exit_now(gleaner_pager::FATAL_EXIT_CODE);
        }
    }
    drop(room);
    // Before the program goes on, with the child's own pager (or plain memory).
    a.wipe_for_fork_child();
    IN_RUNTIME.with(|c| c.set(was));
}
