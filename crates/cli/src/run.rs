//! `gleaner run`: launch an unmodified program with its heap on far memory.
//!
//! The launcher checks everything it can before the program starts (the budget, the preload
//! library, the command, userfaultfd permission, the memnode and its token), so that a mistake
//! is a clear message and not a half-started program. It then starts an embedded memnode unless
//! one was given, runs the command with `libgleaner_preload.so`, forwards signals to it, waits,
//! stops the memnode, and reports the run's stats (summed over every process of the run that
//! used far memory: a program that `exec`s or spawns children has one region per process;
//! `run/report.rs`). Signals sent to the launcher go on to the program (`run/signals.rs`).

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use clap::Args;
use gleaner_pager::{EmbeddedMemnode, RegionConfig};
use gleaner_proto::units::{default_token_path, parse_size};
use gleaner_proto::{ConnectOptions, Connection, Endpoint};
use serde_json::json;

mod hang;
mod hermes;
mod local_mem;
mod report;
mod signals;

use hang::HangWatch;
use report::{remove_status_files, still_running, sum_stats, summary, PagerCounts, StatsDir};
use signals::{signal_name, SignalForwarder, CHILD_PID};

/// Exit status when the command cannot be found (as in a shell).
const EXIT_NOT_FOUND: u8 = 127;
/// Exit status when the command exists but cannot be executed (as in a shell).
const EXIT_NOT_EXECUTABLE: u8 = 126;
/// Exit status for gleaner's own set-up errors (bad flags, no memnode, no userfaultfd).
const EXIT_SETUP: u8 = 2;

/// Options of `gleaner run`.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  gleaner run --local-mem 1G -- memcached -m 4096\n  \
                  gleaner run --local-ratio 25 --footprint 2G --stats run.json -- python3 job.py\n  \
                  gleaner run --memnode 10.0.0.7:7070 --token-file ~/.gleaner/token --local-mem 512M -- redis-server"
)]
pub struct RunArgs {
    /// Local memory budget for the program's heap and anonymous mappings (e.g. 512M, 2G), or a
    /// range FLOOR..CEILING (e.g. 256M..2G): an elastic budget that the node daemon (`gleaner
    /// node`, started on demand as `gleaner node --exit-when-idle 60` when none runs) moves
    /// between the two as the machine's far-memory programs and soft-memory pools need it,
    /// more to the program losing more time to far faults. The program starts at the floor;
    /// a lowered grant is evicted down in the background. If the daemon goes away the budget
    /// stays where it is (within the range) until a daemon answers again.
    #[arg(long, value_name = "SIZE|FLOOR..CEILING", required_unless_present_any = ["local_ratio", "far"])]
    local_mem: Option<String>,
    /// Local budget as a percentage of --footprint (or, without it, of this machine's RAM).
    #[arg(long, value_name = "PCT", conflicts_with = "local_mem")]
    local_ratio: Option<f64>,
    /// The program's expected peak memory, the base of --local-ratio.
    #[arg(long, value_name = "SIZE", requires = "local_ratio")]
    footprint: Option<String>,
    /// Memnode address (HOST:PORT or unix:PATH), or several separated by commas: a pool, where
    /// every far page is written to --replicas of them and a lost memnode loses nothing.
    /// Default: start a private one for this run.
    #[arg(long, value_name = "ADDR[,ADDR...]")]
    memnode: Option<String>,
    /// Copies of each far page in a pool of memnodes (1 to their number, at most 4): 2 by default
    /// when several are given. Reads go to the copy that answers fastest; a memnode that goes away
    /// is replaced and its pages copied anew from the others.
    #[arg(long, value_name = "R", requires = "memnode")]
    replicas: Option<usize>,
    /// The memnode's token file (with --memnode). Default: ~/.gleaner/token.
    #[arg(long, value_name = "FILE", requires = "memnode")]
    token_file: Option<PathBuf>,
    /// Seconds to wait for a memnode's reply before treating the connection as broken (the
    /// preload library's GLEANER_MEMNODE_TIMEOUT). While it waits, a line on stderr every third
    /// of this (1 to 5 s) says which memnode, what was asked and how long it will still wait.
    /// A broken connection to a TCP memnode is replaced by a new one to the same session,
    /// retried for as long as the memnode keeps the session (its `--lease`, also announced
    /// every few seconds); the program only waits.
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = parse_seconds)]
    memnode_timeout: f64,
    /// Capacity of the private memnode. Default: half of this machine's available memory.
    #[arg(long, value_name = "SIZE", conflicts_with = "memnode")]
    memnode_capacity: Option<String>,
    /// Write the run's stats (per process and summed) here as JSON.
    #[arg(long, value_name = "FILE")]
    stats: Option<PathBuf>,
    /// Fault-handler threads per process. 0 (default): one per CPU the program may run on, at
    /// most 4, each pinned to its CPU, so a fault is served on the CPU where it happened
    /// (measured several times faster than from the other CPU on a 2-vCPU VM: docs/BENCHMARKS.md,
    /// "What a userfaultfd fault costs"). More than 4 cost every fault
    /// more wake-ups than they save: each fault wakes every handler.
    #[arg(long, value_name = "N", default_value_t = 0)]
    handlers: usize,
    /// How far pages travel to a memnode on this host: `auto` (shared memory for a Unix-socket
    /// memnode, including the private one), `shm`, or `socket` (requests over the socket, as to
    /// a remote memnode).
    #[arg(long, value_name = "PATH", default_value = "auto")]
    data_path: gleaner_pager::DataPath,
    /// How far pages are compressed before they leave the program: `auto` (default: `lz4`, and
    /// over a TCP memnode `zstd` for the write-back batches while it is measured cheaper per
    /// page there, as over a slow link, where the bytes it saves take longer than its CPU;
    /// through shared memory always `lz4`), `lz4` (fast to decompress on the fault path, how fast
    /// depending on the data), `zstd` (smaller, several times slower to decompress) or `off`.
    /// Pages of one repeated word are always kept as that word.
    #[arg(long, value_name = "ALGO", default_value = "auto")]
    compress: gleaner_pager::Compression,
    /// The most decompression may cost per page on the fault path, on average, in µs. Which
    /// pages decode slower is learnt per 256 KiB of neighbouring pages (LZ4 is slow on a page of
    /// 8-byte counters, and saves only half of it); they are compressed while the mean of the
    /// pages decompressed so far leaves room for them and stored raw when it does not. `auto`
    /// (default): 1.5 with lz4, no bound with zstd (chosen for memory); `off`: every page that
    /// compresses is compressed.
    #[arg(long, value_name = "US|auto|off", default_value = "auto")]
    max_decode_us: gleaner_pager::DecodeBudget,
    /// Seal far pages with AES-256-GCM, so a memnode can neither read them nor change, swap or
    /// replay them unnoticed (the program then stops with exit 86): `on` (default, a fresh random
    /// key per process that never leaves it) or `off` (to measure the cost).
    #[arg(long, value_name = "on|off", default_value = "on")]
    encrypt: gleaner_pager::Encryption,
    /// Derive the page key from this file (64 hex digits, readable by its owner only, e.g.
    /// `openssl rand -hex 32 > key && chmod 600 key`) instead of a random one.
    #[arg(long, value_name = "FILE")]
    key_file: Option<PathBuf>,
    /// Which pages give up their far copy while they are resident. A page written since it came
    /// back always does (its copy is stale) unless `none`. Under asynchronous dirty tracking (the
    /// default where the kernel offers it) also: `all` (default: far memory then holds only evicted
    /// pages, as zram does, and is smaller than with `demand`), `demand` (prefetched pages keep
    /// theirs, so a scan's pages leave again without being encoded and written: sequential scans
    /// run faster). `none` keeps every copy.
    #[arg(long, value_name = "WHICH", default_value = "all")]
    drop_far_copies: gleaner_pager::FarCopies,
    /// How writes to resident pages are tracked: `auto` (asynchronous where the kernel offers
    /// it, Linux 6.7+, except for a pool of memnodes; synchronous elsewhere), `async` (the kernel
    /// lets a page's first write through itself; eviction finds written pages by scanning, and over
    /// a socket writes back every evicted page, whose far copy it cannot compare) or `sync` (a
    /// write-protect fault per first write; a clean page leaves without being sent again).
    #[arg(long, value_name = "MODE", default_value = "auto")]
    dirty_tracking: gleaner_pager::DirtyTracking,
    /// Who reclaims: `hermit` (feedback-directed thread pool), `static:N` (N threads once fewer
    /// than 8 MiB are free), or `direct` (faulting threads reclaim synchronously, like Linux).
    #[arg(long, value_name = "MODE", default_value = "hermit")]
    reclaim: gleaner_pager::ReclaimMode,
    /// The most reclaim threads `hermit` mode runs at once, per process (default: half the CPUs,
    /// at least 1).
    #[arg(long, value_name = "N")]
    max_reclaimers: Option<usize>,
    /// Where reclaim threads run: `any` (every CPU the cgroup allows, whatever the program was
    /// pinned to, as Linux's kswapd; pinned to one CPU, redis and memcached served more requests
    /// so, but their CPU is taken from whatever runs on the other CPUs: memcached's own load
    /// generator there saw a longer tail; bench/results/reclaim-cpus/README.md) or `program`
    /// (only the program's CPUs).
    #[arg(long, value_name = "CPUS", default_value = "any")]
    reclaim_cpus: gleaner_pager::ReclaimCpus,
    /// Append a line of reclaim and fault counters to FILE every 100 ms, per process (`%p` in
    /// FILE is replaced by the process id).
    #[arg(long, value_name = "FILE")]
    stats_trace: Option<PathBuf>,
    /// Prefetcher: `none`, `next:N`, `stride`, `readahead`, `leap` or `leap:PWMAX`. The default,
    /// Leap with windows of up to 32 pages, prefetches only where it finds a majority trend
    /// (sequential or strided access) and stays idle on random access. Over a slow memnode link
    /// a window takes at most what the link moves in half a millisecond (its pace measured from
    /// the write-backs), so that demand reads queued behind a window wait no longer than that.
    #[arg(long, value_name = "NAME", default_value_t = gleaner_pager::DEFAULT_PREFETCH)]
    prefetch: gleaner_pager::PrefetcherKind,
    /// How prefetched pages reach the program: `marker` or `staged`.
    #[arg(long, value_name = "MODE", default_value = "marker")]
    prefetch_install: gleaner_pager::PrefetchInstall,
    /// How long a prefetch may wait for a memnode's link (`gleaner memnode --bandwidth`), in
    /// microseconds, before the memnode drops it (the pages are then fetched on demand if
    /// used). Default: learnt, the 95th percentile of the time prefetched pages wait for their
    /// first use.
    #[arg(long, value_name = "US")]
    prefetch_deadline: Option<u64>,
    /// Eviction order: `frequency` (default: queues by how often a page was seen used, and a
    /// page that comes back keeps its count; a page is seen used when it comes in and whenever
    /// the access scan finds it written), `recency` (the page seen used longest ago leaves
    /// first: fewer far faults than `frequency` for a JVM program, whose collector's passes
    /// look like reuse; more for servers), `rackmem` (pages that keep coming back stay,
    /// prefetched pages not yet seen in use leave first), `fifo` (in the order pages arrived),
    /// `refault` (FIFO, but pages that come back soon after leaving are protected), `active`
    /// (Linux's two lists: a page seen written at two looks, or back soon after leaving, is
    /// protected from pages used once) or `clock`. User space sees page-ins and writes, not
    /// reads of resident pages: each order works from those.
    #[arg(long, value_name = "NAME", default_value_t = gleaner_pager::DEFAULT_EVICT)]
    evict: gleaner_pager::EvictKind,
    /// Pages per eviction batch (the preload library's GLEANER_EVICT_BATCH). Default: a
    /// sixteenth of the budget, 16 to 128 pages, fewer while a batch's write-back takes over
    /// about 1 ms (a slow link). Smaller batches shorten the wait of a fault on a page being
    /// evicted and of a program sharing its CPU with the reclaim thread: with 32, redis's GET
    /// p99 beside Linux swap fell from 1.5-1.6x to 1.05-1.26x when pinned to one CPU; memcached
    /// gained nothing and collapsed once (`bench/results/access-scan/steady/batch32-quiet/`).
    #[arg(long, value_name = "PAGES", value_parser = clap::value_parser!(u64).range(1..=1024))]
    evict_batch: Option<u64>,
    /// The access scan: a reclaim thread reads which resident pages the program wrote since its
    /// last look (the kernel's written bits under asynchronous dirty tracking, with one
    /// PAGEMAP_SCAN) and tells the eviction order, so pages in use stay. `auto` (default: on
    /// where dirty tracking is asynchronous, its period adapted to how fast the budget turns
    /// over and held under 2% of a CPU), `off`, or a fixed period such as `100ms`. The stats'
    /// `access` section says which signals were on, and why others were not.
    #[arg(long, value_name = "auto|off|MS", default_value = "auto")]
    access_scan: gleaner_pager::AccessScanSetting,
    /// Write prediction: `on` installs a page that was rewritten after coming back from the
    /// memnode writable on its next 3 read fetches (saving the write-protect fault its next write
    /// would take); `off` tracks every read fetch and reports how often prediction would have
    /// been right. Only synchronous dirty tracking has write-protect faults to save; under
    /// asynchronous tracking the predictor always runs in shadow.
    #[arg(long, value_name = "on|off", default_value = "on")]
    predict_writes: gleaner_pager::WritePrediction,
    /// Record every page fault to FILE (`%p` is replaced by the process id), for
    /// `gleaner trace replay`.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// What a process's fork child gets: `far` (a pager of its own, reading the parent's far
    /// pages as they were at the fork, with its own budget: neither process brings its heap
    /// home; needs a memnode on this host, the embedded one or a `unix:` one, else the fork
    /// brings the pages home and says so) or `home` (every page is brought home before the
    /// fork; the child's heap is plain memory).
    #[arg(long, value_name = "far|home", default_value = "far")]
    fork: gleaner_pager::ForkMode,
    /// A fork child's local budget (with `--fork far`); default a quarter of its parent's
    /// budget, and its parent's whole budget once the parent has exited (a daemon: the
    /// program's --local-mem). Given, a fork child keeps this budget.
    #[arg(long, value_name = "SIZE")]
    fork_local_mem: Option<String>,
    /// Address space reserved per process for managed memory.
    #[arg(long, value_name = "SIZE", default_value = "64G")]
    arena: String,
    /// Freed heap blocks of 256 KiB or more kept mapped for the next big allocation, in all
    /// (default: a quarter of --local-mem, at most 1G; `0` discards every freed block at once).
    /// A program that allocates and frees large arrays over and over (numpy) then reuses their
    /// pages without a fault; without it every new array is zero-filled through userfaultfd
    /// page by page (pagerank ran at half its all-local speed with all of its memory local). The
    /// blocks count against the budget: before it evicts anything, reclaim discards those idle
    /// longer than this program's reuses are seen to wait, and none is kept over a second.
    #[arg(long, value_name = "SIZE")]
    heap_retain: Option<String>,
    /// Let a process whose far memory cannot start (a token it cannot read, a memnode it cannot
    /// reach) run entirely in local memory, with a warning, instead of stopping it with exit 86.
    /// Either way the summary counts the processes that ran on far memory and those that did not.
    #[arg(long)]
    fail_open: bool,
    /// Far memory for the program's heap: `on` (the default: --local-mem or --local-ratio is
    /// required) or `off` (plain local memory, no memnode: for `--latency-critical` or `--batch`
    /// alone).
    #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
    far: Option<String>,
    /// Run the program as a latency-critical service (Hermes): a management thread in each of
    /// its processes keeps memory already faulted in for its next allocations (a heap grown step
    /// by step for requests under 128 KiB, a pool of chunks for larger ones), so that `malloc`
    /// plus first touch does not meet the kernel's direct reclaim under pressure. The reserve is
    /// bounded by --reserve-max and, with far memory on, counts in the local budget. The node
    /// daemon (`gleaner node`), if one runs, spares its files and keeps free memory for it.
    #[arg(long, conflicts_with = "batch")]
    latency_critical: bool,
    /// The most memory the reserve holds ready (with --latency-critical).
    #[arg(
        long,
        value_name = "SIZE",
        default_value = "64M",
        requires = "latency_critical"
    )]
    reserve_max: String,
    /// Mark the program as a batch job with the node daemon (started if none runs): under
    /// pressure the daemon drops its page cache, largest file first, to keep memory free for
    /// latency-critical services. Its anonymous memory is never touched.
    #[arg(long)]
    batch: bool,
    /// Do not print the stats summary at the end.
    #[arg(long, short)]
    quiet: bool,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// A set-up error: a message and the exit status it deserves.
struct SetupError(String, u8);

impl SetupError {
    fn new(msg: impl Into<String>) -> SetupError {
        SetupError(msg.into(), EXIT_SETUP)
    }
}

/// Entry point of `gleaner run`.
pub fn main(args: RunArgs) -> ExitCode {
    match run(args) {
        Ok(code) => code,
        Err(SetupError(msg, code)) => {
            eprintln!("gleaner run: {msg}");
            ExitCode::from(code)
        }
    }
}

/// Memory settings the launcher hands to the preload library.
struct Budget {
    local: u64,
    /// An elastic budget's ceiling (`local` is then its floor).
    ceiling: Option<u64>,
    arena: u64,
    /// `--heap-retain`, if given (else the library's default).
    heap_retain: Option<u64>,
}

fn run(args: RunArgs) -> Result<ExitCode, SetupError> {
    if args.far.as_deref() == Some("off") {
        return hermes::run_local(args);
    }
    let budget = budget(&args)?;
    let preload = find_preload_library()?;
    let node_socket = node_for_elastic_budget(budget.ceiling)?;
    let program = resolve_command(&args.command[0])?;
    let top_is_static = is_static_elf(&program);
    if top_is_static {
        eprintln!(
            "gleaner run: warning: {} is statically linked, so LD_PRELOAD cannot reach it: it \
             will run entirely in local memory (Go programs and static binaries are not \
             supported; see docs/compatibility.md)",
            program.display()
        );
    }
    check_userfaultfd()?;
    let key_file = match &args.key_file {
        None => None,
        Some(p) => {
            let p = absolute("--key-file", p)?;
            gleaner_pager::codec::read_key_file(&p).map_err(|e| SetupError::new(e.to_string()))?;
            Some(p)
        }
    };
    args.encrypt
        .clone()
        .with_key_file(key_file.clone())
        .map_err(|e| SetupError::new(format!("--key-file: {e} (--encrypt off)")))?;
    let self_exe = std::env::current_exe()
        .map_err(|e| SetupError::new(format!("cannot find the gleaner executable: {e}")))?;

    // The memnode: given (checked now, so a typo is not a failure inside the program), or ours.
    let (embedded, endpoint, token_file) = match &args.memnode {
        Some(addrs) => {
            let endpoints = addrs
                .split(',')
                .map(|a| {
                    let a = a.trim();
                    absolute_endpoint(
                        a.parse()
                            .map_err(|e| SetupError::new(format!("--memnode {a}: {e}")))?,
                    )
                })
                .collect::<Result<Vec<Endpoint>, SetupError>>()?;
            let token_file = absolute(
                "--token-file",
                &args.token_file.clone().unwrap_or_else(default_token_path),
            )?;
            if let Some(r) = args.replicas {
                let most = endpoints.len().min(gleaner_pager::MAX_REPLICAS);
                if r == 0 || r > most {
                    return Err(SetupError::new(format!(
                        "--replicas {r}: give 1 to {most} (one copy per memnode at most, {} at \
                         most)",
                        gleaner_pager::MAX_REPLICAS
                    )));
                }
            }
            // In a pool, a memnode that cannot be reached now is left out, loudly, as long as
            // another one can be (the run starts degraded, as a RAID array would); a wrong token
            // or a memnode that refuses the session is still an error.
            let mut reachable = Vec::with_capacity(endpoints.len());
            for endpoint in &endpoints {
                match check_memnode(endpoint, &token_file) {
                    Ok(()) => reachable.push(endpoint.clone()),
                    Err(e) if endpoints.len() > 1 && e.0.starts_with("cannot reach") => {
                        eprintln!("gleaner run: warning: {}; the pool runs without it", e.0);
                    }
                    Err(e) => return Err(e),
                }
            }
            if reachable.is_empty() {
                return Err(SetupError::new(format!(
                    "none of the memnodes {addrs} can be reached"
                )));
            }
            if reachable.len() < endpoints.len() {
                let replicas = args.replicas.unwrap_or(2).min(endpoints.len());
                if reachable.len() < replicas {
                    eprintln!(
                        "gleaner run: warning: only {} memnode(s) reachable for {replicas} \
                         replicas: far pages have fewer copies than asked until then",
                        reachable.len()
                    );
                }
            }
            let endpoints = reachable;
            let list = endpoints
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join(",");
            (None, list, token_file)
        }
        None => {
            let capacity = match &args.memnode_capacity {
                Some(s) => parse_size(s)
                    .map_err(|e| SetupError::new(format!("--memnode-capacity: {e}")))?,
                None => half_of_available_memory()?,
            };
            let node = EmbeddedMemnode::start(capacity, false)
                .map_err(|e| SetupError::new(format!("cannot start the private memnode: {e}")))?;
            let (e, t) = (node.endpoint().to_string(), node.token_file());
            (Some(node), e, t)
        }
    };

    let stats_dir = StatsDir::create()?;
    let mut cmd = Command::new(&program);
    match (&node_socket, budget.ceiling) {
        (Some(socket), Some(ceiling)) => {
            cmd.env("GLEANER_LOCAL_MEM_CEILING", ceiling.to_string())
                .env(gleaner_node::client::SOCKET_ENV, socket);
        }
        _ => {
            cmd.env_remove("GLEANER_LOCAL_MEM_CEILING");
        }
    }
    cmd.arg0(&args.command[0])
        .args(&args.command[1..])
        .env("LD_PRELOAD", preload_list(&preload))
        .env("GLEANER_LOCAL_MEM", budget.local.to_string())
        .env("GLEANER_ARENA_SIZE", budget.arena.to_string())
        .env(
            "GLEANER_HEAP_RETAIN",
            budget.heap_retain.map_or(String::new(), |b| b.to_string()),
        )
        .env("GLEANER_HANDLERS", args.handlers.to_string())
        .env("GLEANER_DATA_PATH", args.data_path.to_string())
        .env("GLEANER_COMPRESS", args.compress.to_string())
        .env("GLEANER_MAX_DECODE_US", args.max_decode_us.to_string())
        .env("GLEANER_DROP_FAR_COPIES", args.drop_far_copies.to_string())
        .env(
            "GLEANER_ENCRYPT",
            if args.encrypt.is_on() { "on" } else { "off" },
        )
        .env(
            "GLEANER_KEY_FILE",
            key_file
                .as_ref()
                .map_or(String::new(), |p| p.display().to_string()),
        )
        .env("GLEANER_DIRTY_TRACKING", args.dirty_tracking.to_string())
        .env("GLEANER_RECLAIM", args.reclaim.to_string())
        .env(
            "GLEANER_MAX_RECLAIMERS",
            args.max_reclaimers
                .unwrap_or_else(gleaner_pager::default_max_reclaim_threads)
                .to_string(),
        )
        .env("GLEANER_RECLAIM_CPUS", args.reclaim_cpus.to_string())
        .env("GLEANER_PREFETCH", args.prefetch.to_string())
        .env(
            "GLEANER_PREFETCH_INSTALL",
            args.prefetch_install.to_string(),
        )
        .env(
            "GLEANER_PREFETCH_DEADLINE_US",
            args.prefetch_deadline
                .map_or(String::new(), |us| us.to_string()),
        )
        .env("GLEANER_EVICT", args.evict.to_string())
        .env("GLEANER_ACCESS_SCAN", args.access_scan.to_string())
        .env("GLEANER_PREDICT_WRITES", args.predict_writes.to_string())
        .env("GLEANER_MEMNODE", &endpoint)
        .env("GLEANER_TOKEN_FILE", &token_file)
        .env("GLEANER_MEMNODE_TIMEOUT", args.memnode_timeout.to_string())
        .env("GLEANER_STATS", stats_dir.path().join("stats-%p.json"))
        .env("GLEANER_REPORT_DIR", stats_dir.path())
        .env("GLEANER_FAIL_OPEN", if args.fail_open { "1" } else { "0" })
        .env("GLEANER_FORK", args.fork.to_string())
        .env(
            "GLEANER_FORK_LOCAL_MEM",
            match &args.fork_local_mem {
                Some(s) => parse_size(s)
                    .map_err(|e| SetupError::new(format!("--fork-local-mem: {e}")))?
                    .to_string(),
                None => String::new(),
            },
        )
        .env("GLEANER_BIN", &self_exe);
    hermes::configure(&mut cmd, &args)?;

    // Every path reaches the program absolute: its processes may change directory.
    if let Some(r) = args.replicas {
        // No more copies than memnodes reachable at the start.
        let memnodes = endpoint.split(',').count();
        cmd.env("GLEANER_REPLICAS", r.min(memnodes).to_string());
    }
    if let Some(n) = args.evict_batch {
        cmd.env("GLEANER_EVICT_BATCH", n.to_string());
    }
    if let Some(t) = &args.stats_trace {
        cmd.env("GLEANER_STATS_TRACE", absolute("--stats-trace", t)?);
    }
    if let Some(t) = &args.trace {
        cmd.env("GLEANER_TRACE", absolute("--trace", t)?);
    }
    let signals = SignalForwarder::install()?;
    let started = Instant::now();
    let mut child = spawn_program(&mut cmd, &program, args.batch)?;
    // A process of the run whose pager waits for itself is ended (`hang.rs`).
    let hangs = HangWatch::start(stats_dir.path());
    let status = child.wait();
    CHILD_PID.store(0, Ordering::SeqCst);
    signals.stop();
    let wall = started.elapsed();
    let mut hung = hangs.stop();
    // A process the program started that still runs (a daemon: `memcached -d`) keeps the
    // private memnode: it serves on until no session is left. One that hangs does not.
    let mut running = still_running(stats_dir.path());
    if !running.is_empty() {
        let pids: Vec<u32> = running.iter().map(|(pid, _)| *pid as u32).collect();
        hung.extend(hang::settle_leftovers(stats_dir.path(), &pids));
        running.retain(|(pid, _)| !hung.contains(&(*pid as u32)));
    }
    match embedded {
        Some(node) if !running.is_empty() => {
            let pid = node.linger();
            let list = running
                .iter()
                .map(|(pid, program)| format!("{program} (pid {pid})"))
                .collect::<Vec<_>>()
                .join(", ");
            eprintln!(
                "gleaner run: {name} exited, but processes it started still run: {list}; the \
                 private memnode (pid {pid}) serves them until they exit (their stats are not in \
                 this run's report){budget}",
                name = args.command[0].to_string_lossy(),
                budget = daemon_budget_hint(
                    args.fork_local_mem
                        .as_deref()
                        .and_then(|s| parse_size(s).ok()),
                    budget.local
                ),
            );
        }
        node => drop(node), // stop the private memnode (and free everything it held)
    }

    let status = status.map_err(|e| SetupError::new(format!("waiting for the program: {e}")))?;
    let name = args.command[0].to_string_lossy().into_owned();
    let (mut exit, outcome) = if hung.contains(&child.id()) {
        (
            gleaner_pager::FATAL_EXIT_CODE as u8,
            "hung on its own far memory and was ended (see the message above)".to_string(),
        )
    } else {
        exit_outcome(status, &name)
    };
    let processes = stats_dir.collect();
    let reserves = hermes::reserve_reports(stats_dir.path());
    let reports = stats_dir.pager_reports();
    // The programs that came up without a pager: the command itself when static (warned about
    // at the start), and whatever a process of the run started so (the preload's exec reports).
    let mut without_pager = stats_dir.no_pager_reports();
    if top_is_static {
        without_pager.insert(
            0,
            json!({"pid": child.id(), "program": program.display().to_string(),
                   "reason": "statically linked: no dynamic loader runs, so LD_PRELOAD cannot \
                              reach it and all of its memory stays local"}),
        );
    }
    if let Some(line) = report::no_pager_warning(&without_pager) {
        eprintln!("gleaner run: {line}");
    }
    remove_status_files(&reports, &running);
    let pagers = PagerCounts::from_reports(&reports);
    for warning in [
        pagers.warning(),
        pagers.stops_warning(),
        pagers.panics_warning(),
    ]
    .into_iter()
    .flatten()
    {
        eprintln!("gleaner run: {warning}");
    }
    // A process stopped because its far memory could not start, or failed later, or aborted by
    // a panic of gleaner's, is a failed run, even where the program's top process carried on
    // and exited 0 (a script that ignores a helper's status, Python's subprocess.run).
    if exit == 0 && pagers.stopped + pagers.stopped_mid_run + pagers.panicked > 0 {
        exit = gleaner_pager::FATAL_EXIT_CODE as u8;
        eprintln!(
            "gleaner run: {name} exited 0, but the run fails (exit 86): a process of it was \
             stopped because its far memory failed, or aborted by a gleaner panic (see the \
             messages above)"
        );
    } else if i32::from(exit) == gleaner_pager::FATAL_EXIT_CODE {
        eprintln!(
            "gleaner run: {name} was stopped because its far memory failed (see the message above)"
        );
    }
    let report = json!({
        "command": args.command.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>(),
        "outcome": outcome,
        "exit_status": exit,
        "wall_seconds": wall.as_secs_f64(),
        "local_mem_bytes": budget.local,
        "local_mem_ceiling_bytes": budget.ceiling,
        "memnode": endpoint.to_string(),
        "memnode_embedded": args.memnode.is_none(),
        "processes": processes,
        "far_memory_processes": pagers.to_json(),
        "without_pager": without_pager,
        "still_running": running
            .iter()
            .map(|(pid, program)| json!({"pid": pid, "program": program}))
            .collect::<Vec<_>>(),
        "total": sum_stats(&processes),
        "reclaim": args.reclaim.to_string(),
        "prefetch": args.prefetch.to_string(),
        "evict": args.evict.to_string(),
        "access_scan": args.access_scan.to_string(),
        "predict_writes": args.predict_writes.to_string(),
        "data_path": args.data_path.to_string(),
        "compress": args.compress.to_string(),
        "max_decode_us": args.max_decode_us.to_string(),
        "drop_far_copies": args.drop_far_copies.to_string(),
        "encrypt": args.encrypt.is_on(),
        "dirty_tracking": args.dirty_tracking.to_string(),
        "latency_critical": hermes::reserve_json(&reserves),
        "batch": args.batch,
    });
    write_stats(args.stats.as_deref(), &report);
    if !args.quiet {
        eprintln!("{}", summary(&report, wall));
        if let Some(line) = hermes::summary_line(&reserves) {
            eprintln!("{line}");
        }
    }
    Ok(ExitCode::from(exit))
}

/// For an elastic budget (a `--local-mem` range): makes sure a node daemon answers (starting
/// one, as soft-memory pools do, when none does) and returns its socket, absolute, for the
/// program's pagers; before anything else starts, so that a run that cannot have one fails
/// having started nothing.
fn node_for_elastic_budget(ceiling: Option<u64>) -> Result<Option<PathBuf>, SetupError> {
    if ceiling.is_none() {
        return Ok(None);
    }
    let socket = gleaner_node::client::default_socket();
    gleaner_node::client::connect(&socket, true).map_err(|e| {
        SetupError::new(format!(
            "--local-mem FLOOR..CEILING needs the node daemon, and none could be reached or \
             started at {}: {e} (start one with `gleaner node`, or give a single size for a \
             fixed budget)",
            socket.display()
        ))
    })?;
    Ok(Some(absolute("GLEANER_NODE_SOCKET", &socket)?))
}

fn budget(args: &RunArgs) -> Result<Budget, SetupError> {
    let arena = parse_size(&args.arena).map_err(|e| SetupError::new(format!("--arena: {e}")))?;
    let mut ceiling = None;
    let local =
        match (&args.local_mem, args.local_ratio) {
            (Some(s), _) => {
                let m = local_mem::parse(s)
                    .map_err(|e| SetupError::new(format!("--local-mem: {e}")))?;
                ceiling = m.ceiling;
                m.floor
            }
            (None, Some(pct)) => {
                if !(pct > 0.0 && pct <= 100.0) {
                    return Err(SetupError::new(format!(
                        "--local-ratio must be a percentage in (0, 100], not {pct}"
                    )));
                }
                let base = match &args.footprint {
                    Some(s) => {
                        parse_size(s).map_err(|e| SetupError::new(format!("--footprint: {e}")))?
                    }
                    None => meminfo("MemTotal")?,
                };
                (base as f64 * pct / 100.0) as u64
            }
            (None, None) => return Err(SetupError::new(
                "far memory needs a budget: give --local-mem or --local-ratio (or --far off for \
                 plain local memory)",
            )),
        };
    let mut cfg = RegionConfig::new(arena as usize, local as usize);
    cfg.handler_threads = args.handlers;
    cfg.validate_only()
        .map_err(|e| SetupError::new(e.to_string()))?;
    let heap_retain = args
        .heap_retain
        .as_deref()
        .map(|s| parse_size(s).map_err(|e| SetupError::new(format!("--heap-retain: {e}"))))
        .transpose()?;
    if let Some(c) = ceiling {
        if c > arena {
            return Err(SetupError::new(format!(
                "--local-mem: the ceiling ({}) is above the far-memory heap (--arena {}): give a \
                 ceiling of at most the heap",
                gleaner_proto::units::format_size(c),
                gleaner_proto::units::format_size(arena)
            )));
        }
    }
    Ok(Budget {
        local,
        ceiling,
        arena,
        heap_retain,
    })
}

/// What to tell about the budget of processes that outlive the program (a daemon is a fork
/// child): the budget --fork-local-mem gave them, else that a fork child takes over its
/// parent's budget once the parent has exited.
fn daemon_budget_hint(fork_local: Option<u64>, local: u64) -> String {
    match fork_local {
        Some(b) => format!(
            ". Fork children among them page within {} each (--fork-local-mem)",
            gleaner_proto::units::format_size(b)
        ),
        None => format!(
            ". A fork child among them (a daemon) pages within the budget of the process that \
             forked it once that has exited: {} if that was the program",
            gleaner_proto::units::format_size(local),
        ),
    }
}

/// `libgleaner_preload.so`: `$GLEANER_PRELOAD`, beside this executable, or in `../lib/`.
fn find_preload_library() -> Result<PathBuf, SetupError> {
    const NAME: &str = "libgleaner_preload.so";
    if let Some(p) = std::env::var_os("GLEANER_PRELOAD") {
        let p = absolute("GLEANER_PRELOAD", Path::new(&p))?;
        return if p.is_file() {
            Ok(p)
        } else {
            Err(SetupError::new(format!(
                "GLEANER_PRELOAD names {}, which does not exist",
                p.display()
            )))
        };
    }
    let exe = std::env::current_exe()
        .map_err(|e| SetupError::new(format!("cannot find the gleaner executable: {e}")))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [dir.join(NAME), dir.join("../lib").join(NAME)];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            SetupError::new(format!(
                "{NAME} was not found (looked in {} and {}); build it with `cargo build --release` \
                 or set GLEANER_PRELOAD to its path",
                candidates[0].display(),
                candidates[1].display()
            ))
        })
}

/// The program to execute: a path as given, or the first match on `PATH`.
fn resolve_command(cmd: &OsStr) -> Result<PathBuf, SetupError> {
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let p = Path::new(cmd);
    if p.as_os_str().is_empty() {
        return Err(SetupError("the command is empty".into(), EXIT_NOT_FOUND));
    }
    if cmd.to_string_lossy().contains('/') {
        if !p.exists() {
            return Err(SetupError(
                format!("{}: no such file", p.display()),
                EXIT_NOT_FOUND,
            ));
        }
        if !executable(p) {
            return Err(SetupError(
                format!("{}: not an executable file", p.display()),
                EXIT_NOT_EXECUTABLE,
            ));
        }
        return Ok(p.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(p))
        .find(|c| executable(c))
        .ok_or_else(|| {
            SetupError(
                format!("command not found: {} (searched PATH)", p.display()),
                EXIT_NOT_FOUND,
            )
        })
}

/// Whether `path` is a 64-bit ELF executable without an interpreter (`PT_INTERP`): the dynamic
/// loader never runs for it, so neither does `LD_PRELOAD`. Scripts and unreadable files: false.
fn is_static_elf(path: &Path) -> bool {
    const PT_INTERP: u32 = 3;
    let Ok(bytes) = std::fs::read(path) else {
        return false;
    };
    let u16_at = |o: usize| {
        bytes
            .get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |o: usize| {
        bytes
            .get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let u64_at = |o: usize| {
        bytes
            .get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    };
    // ELF magic, 64-bit class, little endian.
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(32), u16_at(54), u16_at(56)) else {
        return false;
    };
    !(0..phnum as usize).any(|i| u32_at(phoff as usize + i * phentsize as usize) == Some(PT_INTERP))
}

/// Fails early, with the fixes named, if this user may not handle kernel-mode faults.
fn check_userfaultfd() -> Result<(), SetupError> {
    gleaner_uffd::Uffd::open(gleaner_uffd::UffdOptions {
        features: gleaner_uffd::features::PAGEFAULT_FLAG_WP,
        allow_user_mode_only: false,
    })
    .map(drop)
    .map_err(|e| SetupError::new(e.to_string()))
}

/// Connects to a given memnode and authenticates, so that a wrong address or token is reported
/// before the program starts.
fn check_memnode(endpoint: &Endpoint, token_file: &Path) -> Result<(), SetupError> {
    let timeout = Duration::from_secs(5);
    gleaner_proto::Stream::connect(endpoint, timeout)
        .map_err(|e| SetupError::new(format!("cannot reach the memnode at {endpoint}: {e}")))?;
    let token = gleaner_proto::read_token_file(token_file).map_err(|e| {
        SetupError::new(format!(
            "cannot read the memnode token from {}: {e}",
            token_file.display()
        ))
    })?;
    let opts = ConnectOptions {
        connect_timeout: timeout,
        client_name: format!("gleaner run check (pid {})", std::process::id()),
        ..ConnectOptions::default()
    };
    let conn = Connection::connect(endpoint, &token, None, &opts)
        .map_err(|e| SetupError::new(format!("cannot use the memnode at {endpoint}: {e}")))?;
    let _ = conn.goodbye();
    Ok(())
}

fn meminfo(field: &str) -> Result<u64, SetupError> {
    let text = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| SetupError::new(format!("reading /proc/meminfo: {e}")))?;
    text.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(field)?.strip_prefix(':')?;
            rest.trim().trim_end_matches(" kB").parse::<u64>().ok()
        })
        .map(|kb| kb * 1024)
        .ok_or_else(|| SetupError::new(format!("no {field} in /proc/meminfo")))
}

fn half_of_available_memory() -> Result<u64, SetupError> {
    Ok(meminfo("MemAvailable")? / 2)
}

/// Parses a positive number of seconds.
fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("`{s}` is not a positive number of seconds")),
    }
}

/// `path` made absolute against the launcher's working directory, so that a process of the run
/// that changes directory still finds it.
fn absolute(flag: &str, path: &Path) -> Result<PathBuf, SetupError> {
    std::path::absolute(path)
        .map_err(|e| SetupError::new(format!("{flag} {}: {e}", path.display())))
}

/// A Unix-socket memnode's path made absolute (see [`absolute`]); TCP addresses unchanged.
fn absolute_endpoint(endpoint: Endpoint) -> Result<Endpoint, SetupError> {
    Ok(match endpoint {
        Endpoint::Unix(p) => Endpoint::Unix(absolute("--memnode", &p)?),
        tcp => tcp,
    })
}

/// The preload library first, then whatever the caller had in `LD_PRELOAD`.
fn preload_list(lib: &Path) -> OsString {
    let mut v = lib.as_os_str().to_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}

/// The exit status `gleaner run` passes on for the program's `status` (a signal's is 128 + its
/// number, as a shell's), and how the summary words it; a death by signal is said at once.
fn exit_outcome(status: std::process::ExitStatus, name: &str) -> (u8, String) {
    match (status.code(), status.signal()) {
        (Some(c), _) => (c as u8, format!("exited with status {c}")),
        (None, Some(s)) => {
            let outcome = format!("was killed by signal {s} ({})", signal_name(s));
            eprintln!("gleaner run: {name} {outcome}");
            ((128 + s) as u8, outcome)
        }
        _ => (1, "ended in an unknown way".into()),
    }
}

/// Writes the run's stats document to `--stats PATH`, if given; a failure to write is said, and
/// the run's outcome stands.
fn write_stats(path: Option<&std::path::Path>, report: &serde_json::Value) {
    if let Some(path) = path {
        let text = serde_json::to_string_pretty(report).expect("JSON values serialise");
        if let Err(e) = std::fs::write(path, text + "\n") {
            eprintln!("gleaner run: writing stats to {}: {e}", path.display());
        }
    }
}

/// Starts the program: its pid published for the signal forwarder (`CHILD_PID`), and under
/// `--batch` marked a batch job with the node daemon. Shared by `gleaner run` with far memory
/// and without it (`--far off`).
fn spawn_program(
    cmd: &mut Command,
    program: &std::path::Path,
    batch: bool,
) -> Result<std::process::Child, SetupError> {
    let child = cmd.spawn().map_err(|e| {
        SetupError(
            format!("cannot execute {}: {e}", program.display()),
            EXIT_NOT_EXECUTABLE,
        )
    })?;
    CHILD_PID.store(child.id() as i32, Ordering::SeqCst);
    if batch {
        hermes::mark_batch(child.id() as i32);
    }
    Ok(child)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemons_budget_is_told() {
        let hint = daemon_budget_hint(None, 16 << 20);
        assert!(
            hint.contains("once that has exited: 16.00 MiB if that was the program"),
            "{hint}"
        );
        let given = daemon_budget_hint(Some(4 << 20), 16 << 20);
        assert!(
            given.contains("within 4.00 MiB each (--fork-local-mem)"),
            "{given}"
        );
    }

    #[test]
    fn static_binaries_are_recognised() {
        assert!(
            !is_static_elf(Path::new("/bin/sh")),
            "/bin/sh is dynamically linked"
        );
        assert!(
            !is_static_elf(Path::new("/etc/os-release")),
            "not an ELF file"
        );
        // A static executable made here (glibc's static libc is part of build-essential).
        let dir = std::env::temp_dir().join(format!("gleaner-static-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("s.c"), "int main(void) { return 0; }\n").unwrap();
        let ok = std::process::Command::new("cc")
            .args(["-static", "-o"])
            .arg(dir.join("s"))
            .arg(dir.join("s.c"))
            .status()
            .expect("cc")
            .success();
        assert!(ok, "cc -static failed");
        assert!(is_static_elf(&dir.join("s")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn commands_resolve_on_path_or_fail_with_shell_codes() {
        assert!(resolve_command(OsStr::new("sh")).is_ok());
        let e = resolve_command(OsStr::new("no-such-program-gleaner"))
            .err()
            .unwrap();
        assert_eq!(e.1, EXIT_NOT_FOUND);
        assert!(e.0.contains("command not found"), "{}", e.0);
        let plain = std::env::temp_dir().join(format!("gleaner-plain-{}", std::process::id()));
        std::fs::write(&plain, "not a program").unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = resolve_command(plain.as_os_str()).err().unwrap();
        let _ = std::fs::remove_file(&plain);
        assert_eq!(e.1, EXIT_NOT_EXECUTABLE);
    }
}
