//! `gleaner node`: the node coordinator daemon (soft-memory pools, Midas) and its status.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use gleaner_node::daemon::{Config, Daemon};
use gleaner_node::policy::{Params, PolicyKind};
use gleaner_node::pressure::Source;
use gleaner_proto::units::parse_size;

/// Flags of `gleaner node`.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  gleaner node                          # foreground, default socket\n  \
                  gleaner node --policy static --soft-budget 2G\n  \
                  gleaner node status"
)]
pub struct NodeArgs {
    #[command(subcommand)]
    cmd: Option<NodeCommand>,
    /// The registration socket. Default: $GLEANER_NODE_SOCKET, else /run/gleaner/node.sock for
    /// root, else /dev/shm/gleaner-node-UID.sock.
    #[arg(long, value_name = "PATH", global = true)]
    socket: Option<PathBuf>,
    /// Allocation policy: midas (marginal utility by rebuild cost, the dissertation's),
    /// midas-victim (victim hits x miss penalty, the released code's), static (equal
    /// partition) or cliffhanger (hit-ratio gradient).
    #[arg(long, default_value = "midas", value_parser = |s: &str| s.parse::<PolicyKind>())]
    policy: PolicyKind,
    /// Seconds between allocation rounds.
    #[arg(long, default_value_t = 5.0, value_name = "SECS", value_parser = positive)]
    interval: f64,
    /// Milliseconds between pressure readings (and enforcement of grants).
    #[arg(long, default_value_t = 50, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    tick_ms: u64,
    /// Milliseconds a pool's runtime has to shrink by itself before the daemon punches its
    /// coldest segments (immediately under severe pressure).
    #[arg(long, default_value_t = 500, value_name = "MS")]
    grace_ms: u64,
    /// Probe size of the midas policy.
    #[arg(long, default_value = "64M", value_name = "SIZE", value_parser = parse_size)]
    probe: u64,
    /// The most one round moves between two pools.
    #[arg(long, default_value = "256M", value_name = "SIZE", value_parser = parse_size)]
    move_max: u64,
    /// Cliffhanger's step (and the victim estimator's least step).
    #[arg(long, default_value = "32M", value_name = "SIZE", value_parser = parse_size)]
    step: u64,
    /// A new pool's first grant when memory is free.
    #[arg(long, default_value = "100M", value_name = "SIZE", value_parser = parse_size)]
    initial: u64,
    /// Memory kept free for everything else. Default: 5% of the machine (or cgroup), at least
    /// 64 MiB. While the memory others use grows, the daemon keeps that growth over five ticks
    /// (at least 50 ms) free as well, so a fast allocator does not reach the limit between two
    /// readings (`gleaner node status` shows `reserve_now`).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    reserve: Option<u64>,
    /// The most all soft pools hold together. Default: all idle memory beyond the reserve.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    soft_budget: Option<u64>,
    /// The most the soft pools and the elastic far programs (`gleaner run --local-mem
    /// FLOOR..CEILING`) are granted together. Default: idle memory plus what they hold, less
    /// the reserve. Programs' floors are granted even beyond it.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    elastic_budget: Option<u64>,
    /// The most one round moves between two far programs (or a program and the soft pools).
    #[arg(long, default_value = "256M", value_name = "SIZE", value_parser = parse_size)]
    elastic_step: u64,
    /// Coordinate one cgroup v2 (read its memory.max, memory.current and memory.pressure)
    /// rather than the whole machine.
    #[arg(long, value_name = "DIR")]
    cgroup: Option<PathBuf>,
    /// Exit after this many seconds with no registered pool (daemons started on demand).
    #[arg(long, value_name = "SECS", value_parser = positive)]
    exit_when_idle: Option<f64>,
    /// How the batch reclaimer (Hermes) drops batch jobs' page cache under its watermark.
    /// `eager`: whole files, every 250 ms while under the watermark (measured: it keeps a
    /// service's own file cache in memory beside a streaming batch job; a few % of a CPU).
    /// `adaptive`: only what is needed, behind the reader of a file being read, and reclaims
    /// that do not hold back off, 250 ms doubling up to 4 s apart (about half the CPU, but
    /// measured to lose eager's gains beside a streaming batch job).
    #[arg(long, value_enum, value_name = "MODE", default_value = "eager")]
    batch_reclaim: BatchReclaim,
    /// Serve Prometheus metrics over HTTP at http://ADDR/metrics (HOST:PORT, e.g.
    /// 127.0.0.1:9471; port 0 picks a free one, logged): memory and pressure, the soft budget,
    /// each pool's grant, residency, hits, misses and rebuild time, punches, errors.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
}

/// `gleaner node --batch-reclaim`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum BatchReclaim {
    /// Whole files, every 250 ms while under the watermark (the default).
    Eager,
    /// Only what is needed, behind the reader; futile reclaims back off.
    Adaptive,
}

#[derive(Subcommand, Debug)]
enum NodeCommand {
    /// Print the running daemon's state as JSON: each soft pool's and far program's grant and
    /// share, what it holds, its counters, and the daemon's last decisions.
    Status,
    /// Mark a running process, or a cgroup, for the batch reclaimer (Hermes): `--batch` (its
    /// page cache may be dropped under pressure, largest file first) or `--latency-critical`
    /// (its files are spared and its growth sizes the free memory kept). A process's mark lasts
    /// until it exits; a cgroup's (`--cgroup DIR`) covers every process in it, those that join
    /// later included, until the cgroup is removed. Starts a daemon if none runs.
    Mark {
        /// The process to mark.
        #[arg(required_unless_present = "cgroup", conflicts_with = "cgroup")]
        pid: Option<i32>,
        /// Mark the cgroup at this directory (v1 or v2; the one holding its `cgroup.procs`,
        /// e.g. /sys/fs/cgroup/batch or /sys/fs/cgroup/memory/batch) instead of one process.
        #[arg(long, value_name = "DIR")]
        cgroup: Option<std::path::PathBuf>,
        /// Mark it a batch job.
        #[arg(
            long,
            conflicts_with = "latency_critical",
            required_unless_present = "latency_critical"
        )]
        batch: bool,
        /// Mark it latency-critical.
        #[arg(long)]
        latency_critical: bool,
    },
}

fn positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("`{s}`: give a number of seconds above 0")),
    }
}

/// Runs `gleaner node`.
pub fn main(args: NodeArgs) -> ExitCode {
    let socket = args
        .socket
        .clone()
        .unwrap_or_else(gleaner_node::client::default_socket);
    if let Some(NodeCommand::Mark {
        pid, cgroup, batch, ..
    }) = args.cmd
    {
        use gleaner_node::proto::Class;
        let class = if batch {
            Class::Batch
        } else {
            Class::LatencyCritical
        };
        let done = match (pid, &cgroup) {
            (_, Some(dir)) => {
                let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
                gleaner_node::client::mark_cgroup(&socket, &dir, class, true).map(|n| {
                    eprintln!(
                        "gleaner node mark: cgroup {} marked ({n} processes in it now)",
                        dir.display()
                    )
                })
            }
            (Some(pid), None) => gleaner_node::client::mark(&socket, pid, class, true),
            (None, None) => unreachable!("clap requires a pid or --cgroup"),
        };
        return match done {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("gleaner node mark: {e}");
                ExitCode::from(1)
            }
        };
    }
    if let Some(NodeCommand::Status) = args.cmd {
        return match gleaner_node::client::status(&socket) {
            Ok(v) => {
                println!("{}", serde_json::to_string_pretty(&v).unwrap());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("gleaner node status: no daemon answered: {e}");
                ExitCode::from(1)
            }
        };
    }
    let source = match &args.cgroup {
        Some(d) => Source::Cgroup(d.clone()),
        None => Source::Machine,
    };
    let total = match source.sample() {
        Ok(s) => s.total,
        Err(e) => {
            eprintln!("gleaner node: cannot read memory pressure: {e}");
            return ExitCode::from(2);
        }
    };
    let cfg = Config {
        socket: socket.clone(),
        policy: args.policy,
        params: Params {
            probe: args.probe,
            move_max: args.move_max,
            step: args.step,
            full_fraction: 0.9,
            initial: args.initial,
        },
        interval: Duration::from_secs_f64(args.interval),
        tick: Duration::from_millis(args.tick_ms),
        grace: Duration::from_millis(args.grace_ms),
        reserve: args.reserve.unwrap_or((total / 20).max(64 << 20)),
        soft_budget: args.soft_budget,
        elastic_budget: args.elastic_budget,
        elastic: gleaner_node::elastic::Params {
            step: args.elastic_step,
            ..Default::default()
        },
        source,
        exit_when_idle: args.exit_when_idle.map(Duration::from_secs_f64),
        batch_reclaim: match args.batch_reclaim {
            BatchReclaim::Adaptive => gleaner_node::batch::Mode::Adaptive,
            BatchReclaim::Eager => gleaner_node::batch::Mode::Eager,
        },
    };
    let (daemon, listener) = match Daemon::bind(cfg) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("gleaner node: {e}");
            return ExitCode::from(2);
        }
    };
    let mut signals = match signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ]) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("gleaner node: signals: {e}");
            return ExitCode::from(2);
        }
    };
    let metrics = match &args.metrics {
        Some(addr) => {
            let d = daemon.clone();
            match gleaner_metrics::serve(addr, "node-metrics", move || {
                gleaner_node::metrics::render(&d.status())
            }) {
                Ok(m) => {
                    eprintln!("gleaner node: metrics at http://{}/metrics", m.local_addr());
                    Some(m)
                }
                Err(e) => {
                    eprintln!("gleaner node: {e}");
                    return ExitCode::from(2);
                }
            }
        }
        None => None,
    };
    let d = daemon.clone();
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            d.stop();
        }
    });
    println!("listening on {}", socket.display());
    log::info!(
        "gleaner node: policy {:?}, socket {}",
        args.policy,
        socket.display()
    );
    daemon.serve(listener);
    if let Some(m) = metrics {
        m.stop();
    }
    ExitCode::SUCCESS
}
