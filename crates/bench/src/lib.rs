//! `gleaner bench`, the micro-benchmarks, in a crate of its own (it holds nearly all of the
//! command's unsafe code). `gleaner bench micro`: an access pattern over a far-memory region,
//! verified on every access, beside the same pattern all-local and the floors measured in the
//! same run.

mod dirty;
mod floor;
mod in_thread;
mod pattern;
mod pin;
mod plain;
mod wakeup;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use gleaner_pager::{
    DataPath, DirtyTracking, EmbeddedMemnode, EvictKind, LatencySummary, PrefetchInstall,
    PrefetcherKind, ReclaimMode, Region, RegionConfig, RegionStats, WritePrediction, PAGE_SIZE,
};
use gleaner_proto::units::{format_size, parse_size};
use gleaner_proto::Endpoint;
use hdrhistogram::Histogram;
use serde::Serialize;

use pattern::{expected_word, fill_page, Pattern};

/// Benchmark subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// Run an access pattern over a far-memory region and report ns/op, remote-fault latency
    /// and eviction throughput, beside the all-local run and the raw userfaultfd and transport
    /// floors measured in the same run.
    Micro(Box<MicroArgs>),
    /// Measure the two ways of tracking dirty pages on this kernel: synchronous write-protect
    /// faults, and WP_ASYNC with PAGEMAP_SCAN.
    DirtyTracking(dirty::DirtyArgs),
    /// Measure what a bare userfaultfd fault costs (no pager) by where its handler runs, how it
    /// waits and at what priority: same CPU, another CPU, unpinned, one per CPU, spinning, FIFO.
    Wakeup(wakeup::WakeupArgs),
}

/// Arguments of `gleaner bench micro`.
#[derive(clap::Args, Debug)]
pub struct MicroArgs {
    /// Access pattern: `seq`, `stride:N` (every N-th page, wrapping), `random`, or `two:A,B`
    /// (two threads, striding by A and B over the two halves of the region).
    #[arg(long, default_value = "seq")]
    pattern: Pattern,
    /// Region size (e.g. 256M, 1G).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    size: u64,
    /// Local memory: a size (64M) or a percentage of --size (25%).
    #[arg(long, default_value = "25%")]
    local: String,
    /// Measured passes over the region after the initialising write pass.
    #[arg(long, default_value_t = 2)]
    passes: u32,
    /// Memnode: `embedded` (a private child on a Unix socket), `embedded-tcp`, or an address.
    #[arg(long, default_value = "embedded")]
    memnode: String,
    /// Token file for an external memnode (default: ~/.gleaner/token).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Fault-handler threads (0: one per CPU, at most 4, each pinned to its CPU).
    #[arg(long, default_value_t = 0)]
    handlers: usize,
    /// Leave fault handlers unpinned (by default each is pinned to one CPU).
    #[arg(long)]
    unpinned_handlers: bool,
    /// How long a fault handler keeps polling without blocking after its last message, in µs.
    #[arg(long, default_value_t = 0)]
    handler_spin_us: u64,
    /// Fault handlers wait in poll, then read, instead of inside read on a blocking
    /// userfaultfd (the way of kernels whose userfaultfd ignores RWF_NOWAIT): to compare the two.
    #[arg(long)]
    handlers_poll: bool,
    /// How pages reach a memnode on this host: `auto` (shared memory over a Unix socket), `shm`
    /// or `socket`.
    #[arg(long, default_value = "auto")]
    data_path: DataPath,
    /// Far-page compression: `auto` (default, as `gleaner run`: LZ4, zstd where a link makes it
    /// cheaper), `lz4`, `zstd` or `off`.
    #[arg(long, default_value = "auto")]
    compress: gleaner_pager::Compression,
    /// What decompressing may cost per page on average, in µs, before slow pages are stored
    /// raw: `auto` (1.5 with lz4, no bound with zstd), `off` or a number.
    #[arg(long, value_name = "US|auto|off", default_value = "auto")]
    max_decode_us: gleaner_pager::DecodeBudget,
    /// Which resident pages drop their far copy: `all` (default), `demand` or `none` (see
    /// `gleaner run --help`).
    #[arg(long, default_value = "all")]
    drop_far_copies: gleaner_pager::FarCopies,
    /// Seal far pages with AES-256-GCM: `on` (default) or `off`.
    #[arg(long, default_value = "on")]
    encrypt: gleaner_pager::Encryption,
    /// How writes are tracked: `auto`, `async` (the kernel lets first writes through; eviction
    /// scans) or `sync` (a write-protect fault per first write).
    #[arg(long, default_value = "auto")]
    dirty_tracking: DirtyTracking,
    /// Pages per eviction batch (default: a sixteenth of the local memory, 16 to 128, and fewer,
    /// down to 16, while writing a batch back takes over about 1 ms).
    #[arg(long)]
    evict_batch: Option<usize>,
    /// Who reclaims: `hermit` (feedback-directed thread pool), `static:N` (N threads once fewer
    /// than 8 MiB are free), or `direct` (faulting threads reclaim synchronously).
    #[arg(long, default_value = "hermit")]
    reclaim: ReclaimMode,
    /// The most reclaim threads `hermit` mode runs at once (default: half the CPUs, at least 1).
    #[arg(long)]
    max_reclaimers: Option<usize>,
    /// Where reclaim threads run: `any` (every CPU the cgroup allows, whatever this process is
    /// pinned to) or `program` (only the CPUs this process may run on), as in `gleaner run`.
    #[arg(long, value_name = "CPUS", default_value = "any")]
    reclaim_cpus: gleaner_pager::ReclaimCpus,
    /// Prefetcher: `none`, `next:N`, `stride`, `readahead`, `leap` or `leap:PWMAX`.
    #[arg(long, default_value = "leap:32")]
    prefetch: PrefetcherKind,
    /// How prefetched pages reach the program: `marker` (all but the last page of a window
    /// installed at once) or `staged` (every page waits unmapped; each first use is a local fault).
    #[arg(long, default_value = "marker")]
    prefetch_install: PrefetchInstall,
    /// Eviction order: `recency` (default), `rackmem`, `fifo`, `refault`, `active` or `clock`.
    #[arg(long, default_value_t = gleaner_pager::DEFAULT_EVICT)]
    evict: EvictKind,
    /// The access scan feeding the eviction order with written bits: `auto` (default), `off` or
    /// a period such as `100ms` (`gleaner run --help`).
    #[arg(long, value_name = "auto|off|MS", default_value = "auto")]
    access_scan: gleaner_pager::AccessScanSetting,
    /// Write prediction: `on` installs a page that was rewritten after coming back from the
    /// memnode writable on its next 3 read fetches (saving the write-protect fault its next write
    /// would take); `off` tracks every read fetch and reports how often prediction would have
    /// been right.
    #[arg(long, value_name = "on|off", default_value = "on")]
    predict_writes: WritePrediction,
    /// Samples for each floor measurement (0 skips the floors).
    #[arg(long, default_value_t = 4000)]
    floor_samples: usize,
    /// Print one JSON document instead of the human-readable report.
    #[arg(long)]
    json: bool,
    /// What the pattern runs over: `gleaner` (a far-memory region) or `plain` (an ordinary
    /// anonymous private mapping of --size bytes, 4 KiB pages, no memnode and no floors: for
    /// measuring Linux swap, run it in a memory cgroup). --local, --memnode and the pager
    /// options are ignored with `plain`.
    #[arg(long, value_enum, default_value = "gleaner")]
    system: MicroSystem,
    /// Pin the threads that run the init pass and the access pattern to this CPU (the region's
    /// own threads and the embedded memnode are not pinned).
    #[arg(long, value_name = "N")]
    pin_cpu: Option<usize>,
}

/// What `gleaner bench micro` runs its pattern over.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MicroSystem {
    /// A far-memory region.
    Gleaner,
    /// Ordinary anonymous memory.
    Plain,
}

/// Everything one run measured.
#[derive(Serialize)]
struct MicroReport {
    /// Always `gleaner` (`plain` runs write their own report).
    system: &'static str,
    /// The CPU the init pass and the access pattern ran on (`--pin-cpu`), if pinned.
    pin_cpu: Option<usize>,
    pattern: String,
    size_bytes: u64,
    local_bytes: u64,
    local_ratio: f64,
    passes: u32,
    memnode: String,
    checksum: u64,
    checksum_ok: bool,
    accesses: u64,
    /// ns per access in the measured passes, far memory.
    ns_per_op: f64,
    /// ns per access of the same passes over ordinary local memory.
    ns_per_op_all_local: f64,
    slowdown_vs_all_local: f64,
    /// Latency of accesses that faulted (> 1 µs), as the program saw them.
    remote_fault_app_visible: LatencySummary,
    /// A remote fault's mean service time in its handler, from the stats (lookup, fetch and
    /// install, timed on one fault in 8), µs.
    handler_service_mean_us: f64,
    /// The rest of the mean fault the program saw: the kernel's part, from the fault to the
    /// handler reading its message and from the install to the thread running again, µs (the
    /// faults of the passes include a few that are not remote: an estimate).
    fault_wait_mean_us: f64,
    floor: Option<floor::FloorReport>,
    /// remote-fault p50 / (uffd p50 + transport p50); p99 likewise.
    p50_vs_floor: Option<f64>,
    p99_vs_floor: Option<f64>,
    /// Same, against the raw combined floor (bare handler: transport read + UFFDIO_COPY).
    p50_vs_raw_remote_fault: Option<f64>,
    p99_vs_raw_remote_fault: Option<f64>,
    init_pass_s: f64,
    dirty_evictions_per_s: Option<f64>,
    clean_evictions_per_s: Option<f64>,
    region: RegionStats,
}

/// Runs a benchmark subcommand.
pub fn main(cmd: BenchCommand) -> ExitCode {
    match cmd {
        BenchCommand::Micro(args) if args.system == MicroSystem::Plain => {
            match plain::run(&args) {
                Ok(report) => {
                    if args.json {
                        println!(
                            "{}",
                            serde_json::to_string_pretty(&report).expect("report serialises")
                        );
                    } else {
                        plain::print_human(&report);
                    }
                    if report.checksum_ok {
                        ExitCode::SUCCESS
                    } else {
                        eprintln!("gleaner bench micro: CHECKSUM MISMATCH: plain memory returned wrong data");
                        ExitCode::from(2)
                    }
                }
                Err(e) => {
                    eprintln!("gleaner bench micro: error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        BenchCommand::Micro(args) => {
            match micro(&args) {
                Ok(report) => {
                    if args.json {
                        println!(
                            "{}",
                            serde_json::to_string_pretty(&report).expect("report serialises")
                        );
                    } else {
                        print_human(&report);
                    }
                    if report.checksum_ok {
                        ExitCode::SUCCESS
                    } else {
                        eprintln!("gleaner bench micro: CHECKSUM MISMATCH: far memory returned wrong data");
                        ExitCode::from(2)
                    }
                }
                Err(e) => {
                    eprintln!("gleaner bench micro: error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        BenchCommand::DirtyTracking(args) => match dirty::run(&args) {
            Ok(r) => {
                if args.json {
                    println!("{}", serde_json::to_string_pretty(&r).expect("serialises"));
                } else {
                    dirty::print_human(&r);
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("gleaner bench dirty-tracking: error: {e}");
                ExitCode::FAILURE
            }
        },
        BenchCommand::Wakeup(args) => wakeup::main(&args),
    }
}

fn parse_local(local: &str, size: u64) -> Result<u64, String> {
    if let Some(pct) = local.trim().strip_suffix('%') {
        let p: f64 = pct
            .trim()
            .parse()
            .map_err(|_| format!("`{local}` is not a percentage"))?;
        if !(0.0..=100.0).contains(&p) || p == 0.0 {
            return Err(format!(
                "--local {local}: the percentage must be in (0, 100]"
            ));
        }
        return Ok((size as f64 * p / 100.0) as u64);
    }
    parse_size(local)
}

/// The memnode the run uses: a private one started here (kept alive by the returned guard, so
/// the region and the floors measure the same memnode), or an external one.
fn resolve_memnode(
    spec: &str,
    token_file: &Option<PathBuf>,
    capacity: u64,
) -> Result<(Endpoint, PathBuf, Option<EmbeddedMemnode>), String> {
    match spec {
        "embedded" | "embedded-tcp" => {
            let node = EmbeddedMemnode::start(capacity, spec == "embedded-tcp")
                .map_err(|e| e.to_string())?;
            Ok((node.endpoint().clone(), node.token_file(), Some(node)))
        }
        addr => Ok((
            addr.parse::<Endpoint>()?,
            token_file
                .clone()
                .unwrap_or_else(gleaner_proto::units::default_token_path),
            None,
        )),
    }
}

/// The region `bench micro` measures, as its options ask (memnode not yet chosen).
fn micro_region_config(args: &MicroArgs) -> Result<RegionConfig, String> {
    let local = parse_local(&args.local, args.size)?;
    let mut cfg = RegionConfig::new(args.size as usize, local as usize);
    cfg.reclaim = args.reclaim;
    if let Some(n) = args.max_reclaimers {
        cfg.max_reclaim_threads = n;
    }
    cfg.reclaim_cpus = args.reclaim_cpus;
    cfg.prefetch = args.prefetch;
    cfg.prefetch_install = args.prefetch_install;
    cfg.evict = args.evict;
    cfg.access_scan = args.access_scan;
    cfg.predict_writes = args.predict_writes;
    cfg.data_path = args.data_path;
    cfg.compression = args.compress;
    cfg.max_decode = args.max_decode_us;
    cfg.drop_far_copies = args.drop_far_copies;
    cfg.encryption = args.encrypt.clone();
    cfg.dirty_tracking = args.dirty_tracking;
    cfg.handler_spin = Duration::from_micros(args.handler_spin_us);
    cfg.handlers_poll = args.handlers_poll;
    cfg.pin_handlers = !args.unpinned_handlers;
    if let Some(n) = args.evict_batch {
        cfg.evict_batch = n;
    }
    Ok(cfg)
}

fn micro(args: &MicroArgs) -> Result<MicroReport, String> {
    let mut cfg = micro_region_config(args)?;
    let local = cfg.local_budget as u64;
    // Validate before starting anything, so a bad budget is reported first and alone.
    cfg.validate_only().map_err(|e| e.to_string())?;
    let floor_bytes = (args.floor_samples * PAGE_SIZE) as u64;
    let (endpoint, token_file, _node) = resolve_memnode(
        &args.memnode,
        &args.token_file,
        gleaner_pager::capacity_for_region(args.size + floor_bytes),
    )?;
    cfg = cfg.with_memnode(endpoint.clone(), Some(token_file.clone()));
    cfg.handler_threads = args.handlers;
    let region = Region::new(cfg).map_err(|e| e.to_string())?;
    let pages = region.len() / PAGE_SIZE;
    let base = region.as_ptr();
    let progress = !args.json;
    if progress {
        eprintln!(
            "bench micro: {} region, {} local ({:.0}%), pattern {}, memnode {}",
            format_size(region.len() as u64),
            format_size(local),
            100.0 * local as f64 / args.size as f64,
            args.pattern,
            region.stats().memnode
        );
    }

    // Pinned after the region exists, so its handlers, evictor and memnode keep their placement;
    // the stream threads inherit this thread's affinity. Restored after the all-local passes.
    let pinned = args.pin_cpu.map(pin::pin_current_thread).transpose()?;

    // Initialising pass: every page written once (zero-fill faults, then dirty evictions).
    let before_init = region.stats();
    let t = Instant::now();
    for p in 0..pages {
        // SAFETY: page p lies inside the live region, which is readable and writable.
        unsafe { fill_page(base.add(p * PAGE_SIZE), p) };
    }
    let init_s = t.elapsed().as_secs_f64();
    let after_init = region.stats();
    region.reset_latency();

    // Measured passes: read one word per access, checked against what was written; one thread
    // per stream of the pattern.
    let t = Instant::now();
    let StreamResult {
        hist,
        checksum,
        bad,
        accesses,
    } = measured_passes(base as usize, pages, &args.pattern, args.passes, progress);
    let far_s = t.elapsed().as_secs_f64();
    let after = region.stats();
    let memnode_desc = after.memnode.clone();

    // The same passes over ordinary memory.
    let local_ns = all_local_ns_per_op(&args.pattern, pages, args.passes);
    drop(pinned);

    // Floors against the same memnode (a fresh session of its own).
    drop(region);
    let floor = if args.floor_samples > 0 {
        let token = gleaner_proto::read_token_file(&token_file)
            .map_err(|e| format!("reading token {}: {e}", token_file.display()))?;
        Some(floor::measure(&endpoint, &token, args.floor_samples)?)
    } else {
        None
    };
    let app = LatencySummary::of(&hist);
    let b = &after.fault_breakdown;
    let service = b.lookup_mean_us + b.fetch_mean_us + b.install_mean_us;
    let ratio = |num: f64, den: f64| (den > 0.0 && num > 0.0).then(|| num / den);
    let expected_sum = args.pattern.expected_checksum(pages, args.passes);
    let ns_per_op = far_s * 1e9 / accesses.max(1) as f64;
    Ok(MicroReport {
        system: "gleaner",
        pin_cpu: args.pin_cpu,
        pattern: args.pattern.to_string(),
        size_bytes: args.size,
        local_bytes: local,
        local_ratio: local as f64 / args.size as f64,
        passes: args.passes,
        memnode: memnode_desc,
        checksum,
        checksum_ok: bad == 0 && checksum == expected_sum,
        accesses,
        ns_per_op,
        ns_per_op_all_local: local_ns,
        slowdown_vs_all_local: ns_per_op / local_ns,
        remote_fault_app_visible: app,
        handler_service_mean_us: service,
        fault_wait_mean_us: app.mean_us - service,
        p50_vs_floor: floor.as_ref().and_then(|f| {
            ratio(
                app.p50_us,
                f.uffd_round_trip.p50_us + f.transport_round_trip.p50_us,
            )
        }),
        p99_vs_floor: floor.as_ref().and_then(|f| {
            ratio(
                app.p99_us,
                f.uffd_round_trip.p99_us + f.transport_round_trip.p99_us,
            )
        }),
        p50_vs_raw_remote_fault: floor
            .as_ref()
            .and_then(|f| ratio(app.p50_us, f.raw_remote_fault.p50_us)),
        p99_vs_raw_remote_fault: floor
            .as_ref()
            .and_then(|f| ratio(app.p99_us, f.raw_remote_fault.p99_us)),
        floor,
        init_pass_s: init_s,
        dirty_evictions_per_s: per_second(
            after_init.evictions.dirty - before_init.evictions.dirty,
            eviction_ns(&after_init) - eviction_ns(&before_init),
        ),
        clean_evictions_per_s: per_second(
            after.evictions.clean - after_init.evictions.clean,
            eviction_ns(&after) - eviction_ns(&after_init),
        ),
        region: after,
    })
}

fn eviction_ns(s: &RegionStats) -> u64 {
    let e = &s.evictions;
    e.protect_ns + e.read_ns + e.send_ns + e.drop_ns
}

fn per_second(pages: u64, ns: u64) -> Option<f64> {
    (pages > 0 && ns > 0).then(|| pages as f64 * 1e9 / ns as f64)
}

pub(crate) fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
}

/// What one stream of a measured pass saw.
struct StreamResult {
    hist: Histogram<u64>,
    checksum: u64,
    bad: u64,
    accesses: u64,
}

impl StreamResult {
    /// Before the first access.
    fn nothing() -> StreamResult {
        StreamResult {
            hist: new_hist(),
            checksum: 0,
            bad: 0,
            accesses: 0,
        }
    }
}

/// The measured passes over the `pages` pages at `base` (far memory or plain, already filled):
/// in each pass one thread per stream of `pattern` ([`read_stream`]), their results summed; a
/// line on stderr after each pass when `progress`.
fn measured_passes(
    base: usize,
    pages: usize,
    pattern: &Pattern,
    passes: u32,
    progress: bool,
) -> StreamResult {
    let mut total = StreamResult::nothing();
    for pass in 0..passes {
        let results: Vec<StreamResult> = std::thread::scope(|scope| {
            let handles: Vec<_> = pattern
                .streams(pages, pass)
                .into_iter()
                .map(|stream| scope.spawn(move || read_stream(base, stream)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("stream thread"))
                .collect()
        });
        for r in results {
            total
                .hist
                .add(&r.hist)
                .expect("histograms with the same bounds");
            total.checksum = total.checksum.wrapping_add(r.checksum);
            total.bad += r.bad;
            total.accesses += r.accesses;
        }
        if progress {
            eprintln!("  pass {}/{passes} done", pass + 1);
        }
    }
    total
}

/// Reads one word of every page of `stream` from the region at `base`, timing each access.
fn read_stream(base: usize, stream: Box<dyn Iterator<Item = usize> + Send>) -> StreamResult {
    let mut r = StreamResult::nothing();
    for p in stream {
        let word = p % (PAGE_SIZE / 8);
        let a = Instant::now();
        // SAFETY: word `word` of page `p` lies inside the live region (the caller's pattern
        // yields pages below the region's page count).
        let v =
            unsafe { std::ptr::read_volatile(((base + p * PAGE_SIZE) as *const u64).add(word)) };
        let d = a.elapsed();
        if d > Duration::from_micros(1) {
            r.hist.saturating_record(d.as_nanos() as u64);
        }
        r.bad += (v != expected_word(p, word)) as u64;
        r.checksum = r.checksum.wrapping_add(v);
        r.accesses += 1;
    }
    r
}

fn all_local_ns_per_op(pattern: &Pattern, pages: usize, passes: u32) -> f64 {
    let mut mem = vec![0u64; pages * PAGE_SIZE / 8];
    let base = mem.as_mut_ptr() as *mut u8;
    for p in 0..pages {
        // SAFETY: page p lies inside `mem`, which is pages * PAGE_SIZE bytes.
        unsafe { fill_page(base.add(p * PAGE_SIZE), p) };
    }
    let mut sink = 0u64;
    let mut n = 0u64;
    let t = Instant::now();
    for pass in 0..passes {
        for p in pattern.pages(pages, pass) {
            let word = p % (PAGE_SIZE / 8);
            let a = Instant::now();
            // SAFETY: in bounds of `mem` as above.
            sink = sink.wrapping_add(unsafe {
                std::ptr::read_volatile((base.add(p * PAGE_SIZE) as *const u64).add(word))
            });
            std::hint::black_box(a.elapsed());
            n += 1;
        }
    }
    std::hint::black_box(sink);
    t.elapsed().as_secs_f64() * 1e9 / n.max(1) as f64
}

fn print_human(r: &MicroReport) {
    println!(
        "pattern {}  size {}  local {} ({:.0}%)  passes {}  memnode {}",
        r.pattern,
        format_size(r.size_bytes),
        format_size(r.local_bytes),
        r.local_ratio * 100.0,
        r.passes,
        r.memnode
    );
    println!(
        "checksum {:#018x} {}",
        r.checksum,
        if r.checksum_ok { "ok" } else { "MISMATCH" }
    );
    println!(
        "far memory   {:>10.1} ns/op   all-local {:>8.1} ns/op   slowdown {:.1}x",
        r.ns_per_op, r.ns_per_op_all_local, r.slowdown_vs_all_local
    );
    let a = &r.remote_fault_app_visible;
    println!(
        "remote fault (as the program sees it): n={} p50 {:.1} us  p99 {:.1} us  p99.9 {:.1} us",
        a.count, a.p50_us, a.p99_us, a.p999_us
    );
    let b = &r.region.fault_breakdown;
    println!(
        "where its mean {:.1} us goes: {:.1} us in the handler (lookup {:.1}, fetch {:.1}, install \
         {:.1}), {:.1} us in the kernel (to the handler's read, and from the install to the \
         thread running again)",
        a.mean_us,
        r.handler_service_mean_us,
        b.lookup_mean_us,
        b.fetch_mean_us,
        b.install_mean_us,
        r.fault_wait_mean_us
    );
    if let Some(f) = &r.floor {
        println!(
            "floor: uffd round trip p50 {:.1} us p99 {:.1} us; transport round trip p50 {:.1} us p99 {:.1} us; raw remote fault p50 {:.1} us p99 {:.1} us",
            f.uffd_round_trip.p50_us,
            f.uffd_round_trip.p99_us,
            f.transport_round_trip.p50_us,
            f.transport_round_trip.p99_us,
            f.raw_remote_fault.p50_us,
            f.raw_remote_fault.p99_us
        );
    }
    if let (Some(a), Some(b)) = (r.p50_vs_floor, r.p99_vs_floor) {
        println!("remote fault vs floor (uffd + transport): p50 {a:.2}x  p99 {b:.2}x");
    }
    if let (Some(a), Some(b)) = (r.p50_vs_raw_remote_fault, r.p99_vs_raw_remote_fault) {
        println!("remote fault vs raw remote fault:         p50 {a:.2}x  p99 {b:.2}x");
    }
    let e = &r.region.evictions;
    println!(
        "evictions: {} dirty, {} clean, {} batches; throughput dirty {} pages/s, clean {} pages/s",
        e.dirty,
        e.clean,
        e.batches,
        r.dirty_evictions_per_s
            .map_or("-".into(), |v| format!("{v:.0}")),
        r.clean_evictions_per_s
            .map_or("-".into(), |v| format!("{v:.0}")),
    );
    let f = &r.region.faults;
    println!(
        "faults: {} zero-fill, {} remote, {} write-protect, {} duplicate, {} waited on eviction, {} waited on budget",
        f.zero_fill, f.remote, f.write_protect, f.concurrent_duplicate, f.waited_on_eviction, f.waited_on_budget
    );
}

/// Parses `argv` (the command's name first) as `bench micro`'s options, for tests.
#[cfg(test)]
pub(crate) fn parse_micro_args(argv: &[&str]) -> Result<MicroArgs, clap::Error> {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        micro: MicroArgs,
    }
    <Cli as clap::Parser>::try_parse_from(argv).map(|c| c.micro)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &[&str]) -> RegionConfig {
        let mut argv = vec!["micro", "--size", "8M", "--local", "25%"];
        argv.extend_from_slice(extra);
        micro_region_config(&parse_micro_args(&argv).unwrap()).unwrap()
    }

    #[test]
    fn reclaim_cpus_reaches_the_region_as_given_and_defaults_to_any() {
        assert_eq!(config(&[]).reclaim_cpus, gleaner_pager::ReclaimCpus::Any);
        assert_eq!(
            config(&["--reclaim-cpus", "program"]).reclaim_cpus,
            gleaner_pager::ReclaimCpus::Program
        );
        let bad = parse_micro_args(&["micro", "--reclaim-cpus", "some"]);
        assert!(bad.is_err(), "an unknown choice is refused");
    }

    #[test]
    fn the_local_share_is_taken_from_the_size() {
        let args = parse_micro_args(&["micro", "--size", "8M", "--local", "25%"]).unwrap();
        let cfg = micro_region_config(&args).unwrap();
        assert_eq!(cfg.local_budget, 2 << 20);
        assert_eq!(cfg.size, 8 << 20);
    }
}
