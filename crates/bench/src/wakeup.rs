//! `gleaner bench wakeup`: the floor of a userfaultfd fault with no pager at all, by where the
//! handler runs, how it waits and at what priority.
//!
//! For each configuration: a fresh registered anonymous region (MISSING mode, no huge pages); app
//! thread(s), pinned, read every page once in a pseudo-random order and time each access; bare
//! handler threads install each faulting page with `UFFDIO_COPY` from a local 4 KiB buffer and
//! count what they served and how often a wake-up found nothing to read (every fault wakes every
//! handler waiting on the shared userfaultfd; all but one lose the race). Threads are joined and
//! the region unmapped before the next configuration.

use std::os::fd::{AsRawFd, OwnedFd};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Barrier};
use std::time::{Duration, Instant};

use gleaner_pager::{LatencySummary, PAGE_SIZE};
use gleaner_sys::anon::AnonMapping;
use gleaner_uffd::{features, Event, Installed, Uffd, UffdOptions};
use hdrhistogram::Histogram;
use serde::Serialize;

use super::in_thread::{probe_kernel_accesses, KernelAccesses, SigbusServer};
use super::new_hist;

/// The byte every installed page is filled with; the app checks it on every access.
const FILL: u8 = 0x5a;
/// Messages read per `read` call.
const BATCH: usize = 16;
/// At most this many handlers in the per-CPU configurations (as the pager).
const MAX_PER_CPU_HANDLERS: usize = 16;
/// An access slower than this is counted as a fault.
const FAULT_THRESHOLD: Duration = Duration::from_micros(1);
/// How long `spin-block-20us` handlers keep polling after their last message.
const SPIN_BEFORE_BLOCK: Duration = Duration::from_micros(20);

/// Arguments of `gleaner bench wakeup`.
#[derive(clap::Args, Debug)]
pub struct WakeupArgs {
    /// Pages in each configuration's region (each is touched, and faults, once).
    #[arg(long, default_value_t = 20000)]
    pages: usize,
    /// Configurations to run, comma-separated, in this order (default: all). Those that need a
    /// CPU other than the app's are skipped, with the reason, where the process has only one.
    #[arg(long, value_enum, value_delimiter = ',')]
    configs: Vec<Config>,
    /// The CPU the app thread is pinned to (`two-apps-per-cpu` adds one on another CPU).
    #[arg(long, value_name = "N", default_value_t = 0)]
    app_cpu: usize,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    json: bool,
}

/// One configuration of handlers and app threads.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Config {
    /// 1 handler pinned to the app's CPU, blocking in poll.
    #[value(name = "block-same")]
    BlockSame,
    /// 1 handler pinned to another CPU, blocking in poll.
    #[value(name = "block-other")]
    BlockOther,
    /// 1 handler, not pinned, blocking in poll.
    #[value(name = "block-unpinned")]
    BlockUnpinned,
    /// One handler per allowed CPU, each pinned, blocking in poll (the pager's way where the
    /// kernel cannot tell one read not to block).
    #[value(name = "per-cpu")]
    PerCpu,
    /// 1 handler pinned to the app's CPU, blocking in read on a blocking userfaultfd.
    #[value(name = "read-same")]
    ReadSame,
    /// One handler per allowed CPU, each pinned, blocking in read (what the pager does).
    #[value(name = "read-per-cpu")]
    ReadPerCpu,
    /// 1 handler on another CPU busy-polling the userfaultfd with non-blocking reads.
    #[value(name = "spin-other")]
    SpinOther,
    /// Per-CPU handlers that keep polling 20 µs after their last message before blocking.
    #[value(name = "spin-block-20us")]
    SpinBlock20us,
    /// Per-CPU handlers at SCHED_FIFO priority 1.
    #[value(name = "fifo-per-cpu")]
    FifoPerCpu,
    /// Two app threads, one pinned to each of two CPUs, and per-CPU handlers.
    #[value(name = "two-apps-per-cpu")]
    TwoAppsPerCpu,
    /// No handler thread: faults raise SIGBUS and the faulting thread installs its page itself.
    #[value(name = "in-thread-sigbus")]
    InThreadSigbus,
}

const ALL: [Config; 11] = [
    Config::BlockSame,
    Config::BlockOther,
    Config::BlockUnpinned,
    Config::PerCpu,
    Config::ReadSame,
    Config::ReadPerCpu,
    Config::SpinOther,
    Config::SpinBlock20us,
    Config::FifoPerCpu,
    Config::TwoAppsPerCpu,
    Config::InThreadSigbus,
];

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::BlockSame => "block-same",
            Config::BlockOther => "block-other",
            Config::BlockUnpinned => "block-unpinned",
            Config::PerCpu => "per-cpu",
            Config::ReadSame => "read-same",
            Config::ReadPerCpu => "read-per-cpu",
            Config::SpinOther => "spin-other",
            Config::SpinBlock20us => "spin-block-20us",
            Config::FifoPerCpu => "fifo-per-cpu",
            Config::TwoAppsPerCpu => "two-apps-per-cpu",
            Config::InThreadSigbus => "in-thread-sigbus",
        }
    }

    /// What it is, without the CPU numbers (for a configuration that could not be planned).
    fn summary(self) -> &'static str {
        match self {
            Config::BlockSame => "One handler pinned to the app's CPU, blocking in poll.",
            Config::BlockOther => "One handler pinned to another CPU, blocking in poll.",
            Config::BlockUnpinned => "One handler, not pinned, blocking in poll.",
            Config::PerCpu => "One handler per allowed CPU, each pinned, blocking in poll.",
            Config::ReadSame => "One handler pinned to the app's CPU, blocking in read.",
            Config::ReadPerCpu => "One handler per allowed CPU, each pinned, blocking in read.",
            Config::SpinOther => "One handler pinned to another CPU, busy-polling the userfaultfd.",
            Config::SpinBlock20us => {
                "One handler per allowed CPU, each pinned, polling 20 µs before blocking."
            }
            Config::FifoPerCpu => {
                "One handler per allowed CPU, each pinned, blocking, at SCHED_FIFO priority 1."
            }
            Config::TwoAppsPerCpu => {
                "Two app threads on two CPUs; one handler per allowed CPU, each pinned, blocking."
            }
            Config::InThreadSigbus => IN_THREAD_DESCRIPTION,
        }
    }
}

/// How a handler waits for fault messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    /// Blocks in `poll` on the userfaultfd.
    Block,
    /// Blocks in `read` on the userfaultfd, made blocking; stopped by a fault on a bell page.
    Read,
    /// Never blocks: non-blocking reads in a loop.
    Spin,
    /// Keeps reading without blocking for this long after its last message, then blocks.
    SpinThenBlock(Duration),
}

impl Wait {
    fn describe(self) -> String {
        match self {
            Wait::Block => "block".into(),
            Wait::Read => "block in read".into(),
            Wait::Spin => "spin".into(),
            Wait::SpinThenBlock(d) => format!("spin {} us, then block", d.as_micros()),
        }
    }
}

/// One handler thread's placement, waiting and priority.
#[derive(Clone, Copy, Debug)]
struct HandlerSpec {
    cpu: Option<usize>,
    wait: Wait,
    fifo: bool,
}

/// What a configuration runs: its app threads' CPUs and its handlers.
struct Plan {
    description: String,
    app_cpus: Vec<usize>,
    handlers: Vec<HandlerSpec>,
}

impl Plan {
    /// No handler threads: the app thread serves its own faults (the `in_thread` module).
    fn in_thread(&self) -> bool {
        self.handlers.is_empty()
    }
}

const IN_THREAD_DESCRIPTION: &str = "No handler thread: the userfaultfd raises SIGBUS \
     (UFFD_FEATURE_SIGBUS) and the faulting thread installs its page itself, with UFFDIO_COPY in \
     its signal handler.";

/// The plan for `config`, or why it cannot run with these CPUs.
fn plan(config: Config, app_cpu: usize, cpus: &[usize]) -> Result<Plan, String> {
    let other = cpus.iter().copied().find(|&c| c != app_cpu);
    let need_other = || {
        other.ok_or_else(|| {
            format!(
                "needs a CPU other than the app's (CPU {app_cpu}), and this process may run on \
                 CPU {app_cpu} only"
            )
        })
    };
    let per_cpu = |wait: Wait, fifo: bool| -> Vec<HandlerSpec> {
        cpus.iter()
            .take(MAX_PER_CPU_HANDLERS)
            .map(|&c| HandlerSpec {
                cpu: Some(c),
                wait,
                fifo,
            })
            .collect()
    };
    let one = |cpu: Option<usize>, wait: Wait| {
        vec![HandlerSpec {
            cpu,
            wait,
            fifo: false,
        }]
    };
    let n = cpus.len().min(MAX_PER_CPU_HANDLERS);
    let app = vec![app_cpu];
    Ok(match config {
        Config::BlockSame => Plan {
            description: format!(
                "One handler pinned to the app's CPU ({app_cpu}), blocking in poll."
            ),
            app_cpus: app,
            handlers: one(Some(app_cpu), Wait::Block),
        },
        Config::BlockOther => {
            let o = need_other()?;
            Plan {
                description: format!(
                    "One handler pinned to another CPU ({o}; the app is on {app_cpu}), blocking \
                     in poll."
                ),
                app_cpus: app,
                handlers: one(Some(o), Wait::Block),
            }
        }
        Config::BlockUnpinned => Plan {
            description: "One handler, not pinned (the scheduler places it), blocking in poll."
                .into(),
            app_cpus: app,
            handlers: one(None, Wait::Block),
        },
        Config::PerCpu => Plan {
            description: format!(
                "One handler per allowed CPU ({n}), each pinned to its CPU, blocking in poll \
                 (the pager's way where the kernel cannot tell one read not to block)."
            ),
            app_cpus: app,
            handlers: per_cpu(Wait::Block, false),
        },
        Config::ReadSame => Plan {
            description: format!(
                "One handler pinned to the app's CPU ({app_cpu}), blocking in read on the \
                 userfaultfd made blocking (one system call a fault, not poll and read)."
            ),
            app_cpus: app,
            handlers: one(Some(app_cpu), Wait::Read),
        },
        Config::ReadPerCpu => Plan {
            description: format!(
                "One handler per allowed CPU ({n}), each pinned to its CPU, blocking in read on \
                 the userfaultfd made blocking (the pager's default)."
            ),
            app_cpus: app,
            handlers: per_cpu(Wait::Read, false),
        },
        Config::SpinOther => {
            let o = need_other()?;
            Plan {
                description: format!(
                    "One handler pinned to another CPU ({o}), busy-polling the userfaultfd with \
                     non-blocking reads (never blocks)."
                ),
                app_cpus: app,
                handlers: one(Some(o), Wait::Spin),
            }
        }
        Config::SpinBlock20us => Plan {
            description: format!(
                "One handler per allowed CPU ({n}), each pinned; each keeps polling {} µs after \
                 its last message before blocking in poll.",
                SPIN_BEFORE_BLOCK.as_micros()
            ),
            app_cpus: app,
            handlers: per_cpu(Wait::SpinThenBlock(SPIN_BEFORE_BLOCK), false),
        },
        Config::FifoPerCpu => Plan {
            description: format!(
                "One handler per allowed CPU ({n}), each pinned, blocking in poll, at \
                 SCHED_FIFO priority 1 (the app stays SCHED_OTHER)."
            ),
            app_cpus: app,
            handlers: per_cpu(Wait::Block, true),
        },
        Config::TwoAppsPerCpu => {
            let o = need_other()?;
            Plan {
                description: format!(
                    "Two app threads (CPUs {app_cpu} and {o}), each reading its half of the \
                     pages; one handler per allowed CPU ({n}), each pinned, blocking in poll."
                ),
                app_cpus: vec![app_cpu, o],
                handlers: per_cpu(Wait::Block, false),
            }
        }
        Config::InThreadSigbus => Plan {
            description: IN_THREAD_DESCRIPTION.into(),
            app_cpus: app,
            handlers: Vec::new(),
        },
    })
}

/// The whole run.
#[derive(Serialize)]
struct WakeupReport {
    pages: usize,
    app_cpu: usize,
    /// The CPUs this process may run on.
    allowed_cpus: Vec<usize>,
    /// Accesses slower than this (ns) count as faults.
    fault_threshold_ns: u64,
    configs: Vec<ConfigReport>,
}

/// One configuration: measured, or skipped with the reason.
#[derive(Serialize)]
struct ConfigReport {
    name: &'static str,
    description: String,
    /// Why it did not run (None when it ran).
    skipped: Option<String>,
    #[serde(flatten)]
    measured: Option<Measured>,
}

/// What a configuration that ran measured.
#[derive(Serialize)]
struct Measured {
    app_cpus: Vec<usize>,
    /// Pages read by the app thread(s).
    accesses: u64,
    /// Accesses slower than 1 µs.
    faults: u64,
    /// Latency of the faults, as the app saw them.
    fault_latency: LatencySummary,
    /// From the first app's start to the last app's end.
    wall_s: f64,
    faults_per_s: f64,
    handlers: Vec<HandlerReport>,
    /// In-thread only: what system calls touching a missing page got.
    #[serde(skip_serializing_if = "Option::is_none")]
    kernel_accesses: Option<KernelAccesses>,
}

/// What one handler did.
#[derive(Serialize, Default, Clone)]
struct HandlerReport {
    /// The CPU it was pinned to (None: not pinned).
    cpu: Option<usize>,
    wait: String,
    fifo: bool,
    /// Faults it installed.
    served: u64,
    /// Fault messages it read.
    messages: u64,
    /// Times it returned from a blocking wait with the userfaultfd readable.
    wakeups: u64,
    /// Of those, how many found no message left to read (another handler took it).
    empty_wakeups: u64,
    /// Messages for a page that was already installed (woken, not copied).
    already_present: u64,
}

/// Runs `gleaner bench wakeup`.
pub fn main(args: &WakeupArgs) -> ExitCode {
    match run(args) {
        Ok(report) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).expect("report serialises")
                );
            } else {
                print_table(&report);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gleaner bench wakeup: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &WakeupArgs) -> Result<WakeupReport, String> {
    if args.pages == 0 {
        return Err("--pages must be at least 1".into());
    }
    let cpus = allowed_cpus()?;
    if !cpus.contains(&args.app_cpu) {
        return Err(format!(
            "--app-cpu {}: not one of the CPUs this process may run on {cpus:?}",
            args.app_cpu
        ));
    }
    let mut selected: Vec<Config> = Vec::new();
    for &c in if args.configs.is_empty() {
        &ALL[..]
    } else {
        &args.configs[..]
    } {
        if !selected.contains(&c) {
            selected.push(c);
        }
    }
    let mut configs = Vec::new();
    for config in selected {
        let report = match plan(config, args.app_cpu, &cpus) {
            Err(reason) => {
                eprintln!("bench wakeup: {} skipped: {reason}", config.name());
                ConfigReport {
                    name: config.name(),
                    description: config.summary().into(),
                    skipped: Some(reason),
                    measured: None,
                }
            }
            Ok(plan) => {
                let outcome = measure(&plan, args.pages)
                    .map_err(|e| format!("configuration {}: {e}", config.name()))?;
                match outcome {
                    Outcome::Measured(m) => ConfigReport {
                        name: config.name(),
                        description: plan.description,
                        skipped: None,
                        measured: Some(m),
                    },
                    Outcome::Skipped(reason) => {
                        eprintln!(
                            "bench wakeup: WARNING: {} SKIPPED, NOT MEASURED: {reason}",
                            config.name()
                        );
                        ConfigReport {
                            name: config.name(),
                            description: plan.description,
                            skipped: Some(reason),
                            measured: None,
                        }
                    }
                }
            }
        };
        configs.push(report);
    }
    Ok(WakeupReport {
        pages: args.pages,
        app_cpu: args.app_cpu,
        allowed_cpus: cpus,
        fault_threshold_ns: FAULT_THRESHOLD.as_nanos() as u64,
        configs,
    })
}

/// A configuration's result: measured, or skipped because the handlers could not get the
/// priority it asks for.
enum Outcome {
    Measured(Measured),
    Skipped(String),
}

/// `len` bytes of MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE memory paged 4 KiB at a time
/// (MADV_NOHUGEPAGE), unmapped on drop.
fn mapping(len: usize) -> Result<AnonMapping, String> {
    let m = AnonMapping::new(len, libc::MAP_NORESERVE)
        .map_err(|e| format!("mmap of {len} bytes: {e}"))?;
    m.advise(libc::MADV_NOHUGEPAGE)
        .map_err(|e| format!("madvise(MADV_NOHUGEPAGE): {e}"))?;
    Ok(m)
}

/// What the handlers and app threads of one configuration share.
struct Shared {
    uffd: Uffd,
    base: usize,
    len: usize,
    /// Set once the app threads are done (or setup failed): handlers return.
    stop: AtomicBool,
    /// Made readable with `stop`, to wake handlers blocked in poll.
    stop_fd: OwnedFd,
    /// Set by a handler that failed; app threads stop touching pages.
    failed: AtomicBool,
    /// Where the bell pages start: a fault there stops the handler blocked in read that reads
    /// it.
    bells_at: usize,
    /// Handlers blocking in read that started serving: one bell each stops them.
    reading: AtomicUsize,
}

impl Shared {
    /// Touches one bell page per handler blocking in read, each after the last was answered:
    /// stops them all (a handler that failed unregistered the region, so a touch never hangs).
    fn ring_bells(&self) {
        for i in 0..self.reading.load(Ordering::Acquire) {
            // SAFETY: a page of the live mapping (unmapped only after every thread is joined),
            // readable; the read waits until a handler installs the page or the region is
            // unregistered.
            unsafe { std::ptr::read_volatile((self.bells_at + i * PAGE_SIZE) as *const u8) };
        }
    }

    fn signal_stop(&self) {
        self.stop.store(true, Ordering::Release);
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to the eventfd we own.
        let r = unsafe {
            libc::write(
                self.stop_fd.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        if r != std::mem::size_of::<u64>() as isize {
            // Handlers also check `stop` after every wait; a spinning one never blocks, and a
            // blocked one would hang, so report it loudly.
            eprintln!(
                "bench wakeup: signalling the handlers to stop failed: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

fn eventfd() -> Result<OwnedFd, String> {
    gleaner_sys::eventfd::eventfd(true).map_err(|e| format!("eventfd: {e}"))
}

/// Why a configuration did not measure anything.
enum SetupError {
    /// Pinning failed, or an app thread failed: the run fails.
    Fail(String),
    /// SCHED_FIFO was refused: the configuration is skipped.
    Fifo(String),
}

/// What one app thread measured.
struct AppResult {
    hist: Histogram<u64>,
    accesses: u64,
    wrong: u64,
    start: Instant,
    end: Instant,
}

/// Runs one configuration on a fresh region of `pages` pages.
fn measure(plan: &Plan, pages: usize) -> Result<Outcome, String> {
    // In-thread, one more page that only the kernel touches (see `in_thread`); then one bell
    // page per handler blocking in read, touched to stop it.
    let bells = plan
        .handlers
        .iter()
        .filter(|h| h.wait == Wait::Read)
        .count();
    let region_pages = pages + usize::from(plan.in_thread()) + bells;
    let len = region_pages
        .checked_mul(PAGE_SIZE)
        .ok_or_else(|| format!("--pages {pages} is too large"))?;
    // Unmapped (on every path) only after the scope below has joined every thread that uses it.
    let mapping = mapping(len)?;
    let options = UffdOptions {
        features: if plan.in_thread() {
            features::SIGBUS
        } else {
            0
        },
        ..UffdOptions::default()
    };
    let uffd = match Uffd::open(options) {
        Ok(u) => u,
        Err(e) if plan.in_thread() => {
            return Ok(Outcome::Skipped(format!(
                "a userfaultfd with UFFD_FEATURE_SIGBUS: {e}"
            )))
        }
        Err(e) => return Err(e.to_string()),
    };
    uffd.register(mapping.addr(), len, false)
        .map_err(|e| e.to_string())?;
    if bells > 0 {
        if !uffd.nowait_reads() {
            return Ok(Outcome::Skipped(
                "this kernel cannot tell one userfaultfd read not to block (preadv2 with \
                 RWF_NOWAIT), so the pager polls instead"
                    .into(),
            ));
        }
        uffd.set_blocking(true).map_err(|e| e.to_string())?;
    }
    let src = vec![FILL; PAGE_SIZE];
    // Uninstalled when dropped, after every app thread has been joined.
    let sigbus = if plan.in_thread() {
        Some(SigbusServer::install(
            uffd.as_raw_fd(),
            mapping.addr(),
            len,
            &src,
        )?)
    } else {
        None
    };
    let shared = Shared {
        uffd,
        base: mapping.addr(),
        len,
        bells_at: mapping.addr() + (region_pages - bells) * PAGE_SIZE,
        reading: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        stop_fd: eventfd()?,
        failed: AtomicBool::new(false),
    };
    // Every page once, in a pseudo-random order; app i reads the i-th share of it.
    let order = shuffled(pages, 0x5EED_F00D);
    let share = pages.div_ceil(plan.app_cpus.len());
    let barrier = Barrier::new(plan.app_cpus.len());

    let (handler_results, apps) = std::thread::scope(|s| {
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), SetupError>>();
        let handlers: Vec<_> = plan
            .handlers
            .iter()
            .map(|&spec| {
                let tx = ready_tx.clone();
                let shared = &shared;
                s.spawn(move || handler(shared, spec, tx))
            })
            .collect();
        drop(ready_tx);
        // Every handler reports its setup before any page is touched.
        let mut setup: Result<(), SetupError> = Ok(());
        for _ in 0..plan.handlers.len() {
            let r = ready_rx.recv().unwrap_or_else(|_| {
                Err(SetupError::Fail(
                    "a handler thread exited during setup".into(),
                ))
            });
            if setup.is_ok() {
                setup = r;
            }
        }
        let apps: Result<Vec<AppResult>, SetupError> = match setup {
            Err(e) => Err(e),
            Ok(()) => {
                let threads: Vec<_> = plan
                    .app_cpus
                    .iter()
                    .enumerate()
                    .map(|(i, &cpu)| {
                        let mine = &order[(i * share).min(pages)..((i + 1) * share).min(pages)];
                        let (shared, barrier) = (&shared, &barrier);
                        s.spawn(move || app(shared, cpu, mine, barrier))
                    })
                    .collect();
                // Join every app before looking at any result: one still running may be
                // blocked on a fault that only the handlers can resolve.
                let joined: Vec<Result<AppResult, String>> = threads
                    .into_iter()
                    .map(|t| {
                        t.join()
                            .unwrap_or_else(|_| Err("an app thread panicked".into()))
                    })
                    .collect();
                joined
                    .into_iter()
                    .collect::<Result<Vec<_>, String>>()
                    .map_err(SetupError::Fail)
            }
        };
        shared.signal_stop();
        shared.ring_bells();
        let handler_results: Vec<Result<HandlerReport, String>> = handlers
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err("a handler thread panicked".into()))
            })
            .collect();
        (handler_results, apps)
    });
    // In-thread: the kernel's own accesses to the page no app touched, then the handler's
    // count, before the handler goes and the region is unmapped.
    let mut kernel_accesses = None;
    let mut reports = Vec::new();
    if let Some(server) = &sigbus {
        if apps.is_ok() {
            kernel_accesses = Some(probe_kernel_accesses(shared.base + pages * PAGE_SIZE)?);
        }
        reports.push(HandlerReport {
            cpu: plan.app_cpus.first().copied(),
            wait: "in-thread (SIGBUS)".into(),
            served: server.served(),
            ..Default::default()
        });
    }
    drop(sigbus);
    drop(shared);
    drop(mapping);

    // A handler's error explains an app's failure better than the app's own, so it comes first.
    for r in handler_results {
        reports.push(r.map_err(|e| format!("fault handler {e}"))?);
    }
    let apps = match apps {
        Ok(a) => a,
        Err(SetupError::Fifo(e)) => return Ok(Outcome::Skipped(e)),
        Err(SetupError::Fail(e)) => return Err(e),
    };
    let mut hist = new_hist();
    let (mut accesses, mut wrong) = (0u64, 0u64);
    let start = apps
        .iter()
        .map(|a| a.start)
        .min()
        .expect("at least one app");
    let end = apps.iter().map(|a| a.end).max().expect("at least one app");
    for a in &apps {
        hist.add(&a.hist)
            .map_err(|e| format!("merging histograms: {e}"))?;
        accesses += a.accesses;
        wrong += a.wrong;
    }
    if wrong > 0 {
        return Err(format!(
            "{wrong} of {accesses} accesses read something other than the installed data"
        ));
    }
    if accesses != pages as u64 {
        return Err(format!("{accesses} accesses for {pages} pages"));
    }
    let wall_s = (end - start).as_secs_f64();
    let faults = hist.len();
    Ok(Outcome::Measured(Measured {
        app_cpus: plan.app_cpus.clone(),
        accesses,
        faults,
        fault_latency: LatencySummary::of(&hist),
        wall_s,
        faults_per_s: if wall_s > 0.0 {
            faults as f64 / wall_s
        } else {
            0.0
        },
        handlers: reports,
        kernel_accesses,
    }))
}

/// An app thread: pins itself to `cpu`, waits for the others, then reads one byte of each page
/// in `pages`, timing every access.
fn app(
    shared: &Shared,
    cpu: usize,
    pages: &[usize],
    barrier: &Barrier,
) -> Result<AppResult, String> {
    let pinned = pin_to(cpu);
    let mut hist = new_hist();
    // Every app reaches the barrier, pinned or not, so none waits forever.
    barrier.wait();
    pinned.map_err(|e| format!("pinning the app thread: {e}"))?;
    let (mut accesses, mut wrong) = (0u64, 0u64);
    let start = Instant::now();
    for &p in pages {
        if shared.failed.load(Ordering::Relaxed) {
            break;
        }
        let t = Instant::now();
        // SAFETY: page p < the region's page count, so this byte lies inside the live mapping;
        // a handler installs the page (or, after a handler failure, the range is unregistered
        // and the kernel maps a zero page).
        let v = unsafe { std::ptr::read_volatile((shared.base + p * PAGE_SIZE) as *const u8) };
        let d = t.elapsed();
        if d > FAULT_THRESHOLD {
            hist.saturating_record(d.as_nanos() as u64);
        }
        wrong += (v != FILL) as u64;
        accesses += 1;
    }
    let end = Instant::now();
    if shared.failed.load(Ordering::Acquire) {
        return Err("stopped because a fault handler failed".into());
    }
    Ok(AppResult {
        hist,
        accesses,
        wrong,
        start,
        end,
    })
}

/// A handler thread: set up (pin, priority), report, then serve faults until told to stop.
fn handler(
    shared: &Shared,
    spec: HandlerSpec,
    ready: mpsc::Sender<Result<(), SetupError>>,
) -> Result<HandlerReport, String> {
    let mut rep = HandlerReport {
        cpu: spec.cpu,
        wait: spec.wait.describe(),
        fifo: spec.fifo,
        ..Default::default()
    };
    let setup = (|| {
        if let Some(cpu) = spec.cpu {
            pin_to(cpu).map_err(|e| SetupError::Fail(format!("pinning a handler: {e}")))?;
        }
        if spec.fifo {
            set_fifo(1).map_err(SetupError::Fifo)?;
        }
        Ok(())
    })();
    let ok = setup.is_ok();
    if ok && spec.wait == Wait::Read {
        // Counted before the apps start (they wait for every handler's report).
        shared.reading.fetch_add(1, Ordering::AcqRel);
    }
    // The receiver lives until every handler has reported.
    let _ = ready.send(setup);
    if !ok {
        return Ok(rep);
    }
    let r = serve(shared, spec.wait, &mut rep);
    if let Err(e) = &r {
        // Let the app threads finish: unregistering wakes any thread blocked on a fault in the
        // range, and its retried access is an ordinary anonymous fault.
        shared.failed.store(true, Ordering::Release);
        if let Err(u) = shared.uffd.unregister(shared.base, shared.len) {
            eprintln!("bench wakeup: after a handler error ({e}), unregistering failed: {u}");
        }
    }
    let place = spec
        .cpu
        .map_or("unpinned".to_string(), |c| format!("on CPU {c}"));
    r.map(|()| rep).map_err(|e| format!("{place}: {e}"))
}

/// The handler loop.
fn serve(shared: &Shared, wait: Wait, rep: &mut HandlerReport) -> Result<(), String> {
    let src = vec![FILL; PAGE_SIZE];
    let mut events = Vec::with_capacity(BATCH);
    let mut last_message = Instant::now();
    loop {
        if wait != Wait::Read && shared.stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let block = match wait {
            Wait::Block => true,
            Wait::Read | Wait::Spin => false,
            Wait::SpinThenBlock(d) => last_message.elapsed() >= d,
        };
        if wait == Wait::Read {
            rep.wakeups += 1;
        }
        if block {
            if !wait_readable(shared)? {
                return Ok(());
            }
            rep.wakeups += 1;
        }
        let n = shared
            .uffd
            .read_events(&mut events, BATCH)
            .map_err(|e| e.to_string())?;
        if n == 0 {
            if block {
                rep.empty_wakeups += 1;
            }
            continue;
        }
        rep.messages += n as u64;
        for ev in events.drain(..) {
            let Event::Fault { addr, .. } = ev else {
                return Err(format!("unexpected userfaultfd event {ev:?}"));
            };
            let page = addr & !(PAGE_SIZE - 1);
            if wait == Wait::Read && page >= shared.bells_at && page < shared.base + shared.len {
                // A bell: answer it (the toucher goes on) and stop.
                shared
                    .uffd
                    .zeropage(page, PAGE_SIZE, true)
                    .map_err(|e| e.to_string())?;
                return Ok(());
            }
            if page < shared.base || page >= shared.base + shared.len {
                return Err(format!(
                    "fault at {addr:#x}, outside the region {:#x}..{:#x}",
                    shared.base,
                    shared.base + shared.len
                ));
            }
            // SAFETY: `src` is one page of heap memory, not registered with any userfaultfd;
            // `page` is page-aligned inside the range registered on this descriptor.
            match unsafe { shared.uffd.copy(page, src.as_ptr(), PAGE_SIZE, false, true) } {
                Ok(Installed::Done) => rep.served += 1,
                Ok(Installed::AlreadyPresent) => {
                    rep.already_present += 1;
                    shared
                        .uffd
                        .wake(page, PAGE_SIZE)
                        .map_err(|e| e.to_string())?;
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        last_message = Instant::now();
    }
}

/// Blocks until the userfaultfd is readable (true) or the run is stopping (false).
fn wait_readable(shared: &Shared) -> Result<bool, String> {
    loop {
        let mut fds = [
            libc::pollfd {
                fd: shared.uffd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: shared.stop_fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll on two valid descriptors in an array that lives across the call.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if shared.stop.load(Ordering::Acquire) {
            return Ok(false);
        }
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(format!("poll on the userfaultfd: {e}"));
        }
        if fds[0].revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
            return Err(format!(
                "poll on the userfaultfd returned revents {:#x}",
                fds[0].revents
            ));
        }
        if fds[0].revents & libc::POLLIN != 0 {
            return Ok(true);
        }
    }
}

/// The CPUs this process may run on, in order.
fn allowed_cpus() -> Result<Vec<usize>, String> {
    // SAFETY: cpu_set_t is plain data, for which all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most size_of::<cpu_set_t>() bytes into the live `set`.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(format!(
            "sched_getaffinity: {}",
            std::io::Error::last_os_error()
        ));
    }
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: CPU_ISSET reads bit `i` of the live set, and i < CPU_SETSIZE keeps it in bounds.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect();
    if cpus.is_empty() {
        return Err("sched_getaffinity returned an empty CPU set".into());
    }
    Ok(cpus)
}

/// Pins the calling thread to `cpu` (one of `allowed_cpus`).
fn pin_to(cpu: usize) -> Result<(), String> {
    gleaner_sys::affinity::pin_to(cpu).map_err(|e| format!("pinning to CPU {cpu}: {e}"))
}

/// Puts the calling thread in SCHED_FIFO at `priority`.
fn set_fifo(priority: i32) -> Result<(), String> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: sets the calling thread's own policy from a sched_param that lives across the call.
    let rc = unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) };
    if rc != 0 {
        return Err(format!(
            "pthread_setschedparam(SCHED_FIFO, priority {priority}): {} (needs CAP_SYS_NICE or \
             RLIMIT_RTPRIO >= {priority}, and real-time runtime in this cgroup)",
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    Ok(())
}

/// 0..n in a pseudo-random order fixed by `seed` (Fisher–Yates over splitmix64).
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut state = seed;
    for i in (1..n).rev() {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        v.swap(i, (z % (i as u64 + 1)) as usize);
    }
    v
}

fn print_table(r: &WakeupReport) {
    println!(
        "userfaultfd fault floor: {} pages per configuration, app on CPU {}, allowed CPUs {:?}; \
         a fault is an access slower than {} ns",
        r.pages, r.app_cpu, r.allowed_cpus, r.fault_threshold_ns
    );
    println!(
        "{:<17} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>10}  handlers (cpu: served / empty wake-ups)",
        "config", "accesses", "faults", "mean us", "p50 us", "p99 us", "p99.9 us", "faults/s"
    );
    for c in &r.configs {
        let Some(m) = &c.measured else {
            println!(
                "{:<17} SKIPPED: {}",
                c.name,
                c.skipped.as_deref().unwrap_or("")
            );
            continue;
        };
        let l = &m.fault_latency;
        let handlers: Vec<String> = m
            .handlers
            .iter()
            .map(|h| {
                format!(
                    "{}: {} / {}",
                    h.cpu.map_or("any".to_string(), |c| c.to_string()),
                    h.served,
                    h.empty_wakeups
                )
            })
            .collect();
        println!(
            "{:<17} {:>8} {:>8} {:>8.1} {:>8.1} {:>8.1} {:>9.1} {:>10.0}  {}",
            c.name,
            m.accesses,
            m.faults,
            l.mean_us,
            l.p50_us,
            l.p99_us,
            l.p999_us,
            m.faults_per_s,
            handlers.join(", ")
        );
        if let Some(k) = &m.kernel_accesses {
            println!(
                "{:<17} a system call touching a missing page: read(2) {}; futex(2) {}",
                "", k.read_into_missing_page, k.futex_wait_on_missing_page
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffled_is_a_permutation() {
        let mut v = shuffled(1000, 7);
        assert_ne!(v, (0..1000).collect::<Vec<_>>());
        v.sort_unstable();
        assert_eq!(v, (0..1000).collect::<Vec<_>>());
        assert!(shuffled(0, 1).is_empty());
        assert_eq!(shuffled(1, 1), vec![0]);
    }

    #[test]
    fn configurations_needing_another_cpu_are_skipped_on_one() {
        for c in [Config::BlockOther, Config::SpinOther, Config::TwoAppsPerCpu] {
            let reason = plan(c, 0, &[0]).err().expect("skipped");
            assert!(reason.contains("other than the app's"), "{reason}");
            assert!(plan(c, 0, &[0, 1]).is_ok());
        }
        let p = plan(Config::PerCpu, 0, &[0]).unwrap();
        assert_eq!(p.handlers.len(), 1);
        let p = plan(Config::TwoAppsPerCpu, 1, &[0, 1, 2]).unwrap();
        assert_eq!(p.app_cpus, vec![1, 0]);
        assert_eq!(p.handlers.len(), 3);
        let p = plan(Config::BlockOther, 1, &[0, 1]).unwrap();
        assert_eq!(p.handlers[0].cpu, Some(0));
        // In-thread needs no other CPU and no handler thread.
        let p = plan(Config::InThreadSigbus, 0, &[0]).unwrap();
        assert!(p.in_thread(), "no handler threads");
        assert_eq!(p.app_cpus, vec![0]);
    }
}
