//! `gleaner run --latency-critical`, `--batch` and `--far off` (Hermes, Middleware'21): what the
//! launcher adds for a latency-critical service (the preload library's reserve, its settings and
//! its stats) and for a batch job (its mark with the node daemon), and the launch of a program
//! on plain local memory, with no memnode and no pager.

use std::path::Path;
use std::process::{Command, ExitCode};
use std::sync::atomic::Ordering;
use std::time::Instant;

use gleaner_node::proto::Class;
use gleaner_proto::units::{format_size, parse_size};
use serde_json::{json, Value};

use super::report::StatsDir;
use super::signals::{SignalForwarder, CHILD_PID};
use super::{
    exit_outcome, find_preload_library, preload_list, resolve_command, spawn_program, write_stats,
    RunArgs, SetupError,
};

/// Sets the reserve's variables on `cmd` for `--latency-critical`.
pub(super) fn configure(cmd: &mut Command, args: &RunArgs) -> Result<(), SetupError> {
    if !args.latency_critical {
        return Ok(());
    }
    let max = parse_size(&args.reserve_max)
        .map_err(|e| SetupError::new(format!("--reserve-max: {e}")))?;
    cmd.env("GLEANER_LATENCY_CRITICAL", "1")
        .env("GLEANER_RESERVE_MAX", max.to_string());
    Ok(())
}

/// Marks `pid` a batch job with the node daemon, starting one if none runs. A failure is said,
/// and the program runs on unmarked.
pub(super) fn mark_batch(pid: i32) {
    let socket = gleaner_node::client::default_socket();
    let marked = gleaner_node::client::mark(&socket, pid, Class::Batch, true);
    if let Err(e) = marked {
        eprintln!(
            "gleaner run: warning: the program runs unmarked: the node daemon on {} did not \
             mark it batch: {e}",
            socket.display()
        );
    }
}

/// The reserve stats each latency-critical process of the run left in `dir`.
pub(super) fn reserve_reports(dir: &Path) -> Vec<Value> {
    let mut out: Vec<Value> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("reserve-") && n.ends_with(".json")
        })
        .filter_map(|e| serde_json::from_str(&std::fs::read_to_string(e.path()).ok()?).ok())
        .collect();
    out.sort_by_key(|d: &Value| d["pid"].as_u64());
    out
}

/// The run's `latency_critical` section: each process's reserve and their sums.
pub(super) fn reserve_json(reports: &[Value]) -> Value {
    if reports.is_empty() {
        return Value::Null;
    }
    let sum = |k: &str| -> u64 {
        reports
            .iter()
            .map(|d| d["reserve"][k].as_u64().unwrap_or(0))
            .sum()
    };
    json!({
        "processes": reports,
        "hits": sum("hits"),
        "misses": sum("misses"),
        "partial_hits": sum("partial_hits"),
        "busy": sum("busy"),
        "fallbacks": sum("fallbacks"),
        "populated_bytes": sum("populated_bytes"),
        "reserve_bytes_at_exit": sum("reserve_bytes"),
    })
}

/// One line for the run's summary.
pub(super) fn summary_line(reports: &[Value]) -> Option<String> {
    let j = reserve_json(reports);
    if j.is_null() {
        return None;
    }
    let n = |k: &str| j[k].as_u64().unwrap_or(0);
    let secs = |k: &str| -> f64 {
        reports
            .iter()
            .map(|d| d["reserve"][k].as_f64().unwrap_or(0.0))
            .sum()
    };
    Some(format!(
        "latency-critical reserve: {} hits, {} misses ({} of them partial, {} on a busy lock), \
         {} fallbacks; {} pre-faulted, {} ready at exit; thread CPU {:.2} s ({:.2} s of it \
         pre-faulting)",
        n("hits"),
        n("misses"),
        n("partial_hits"),
        n("busy"),
        n("fallbacks"),
        format_size(n("populated_bytes")),
        format_size(n("reserve_bytes_at_exit")),
        secs("thread_cpu_seconds"),
        secs("thread_populate_cpu_seconds")
    ))
}

/// `gleaner run --far off`: the program on plain local memory, with the preload library only for
/// the reserve (`--latency-critical`), and its mark (`--batch`).
pub(super) fn run_local(args: RunArgs) -> Result<ExitCode, SetupError> {
    if args.local_mem.is_some() || args.local_ratio.is_some() || args.memnode.is_some() {
        return Err(SetupError::new(
            "--far off runs the program on plain local memory: --local-mem, --local-ratio and \
             --memnode need far memory",
        ));
    }
    if !args.latency_critical && !args.batch {
        return Err(SetupError::new(
            "--far off alone changes nothing: give --latency-critical or --batch (or run the \
             program without gleaner)",
        ));
    }
    let program = resolve_command(&args.command[0])?;
    let stats_dir = StatsDir::create()?;
    let mut cmd = Command::new(&program);
    std::os::unix::process::CommandExt::arg0(&mut cmd, &args.command[0]);
    cmd.args(&args.command[1..]);
    if args.latency_critical {
        let preload = find_preload_library()?;
        cmd.env("LD_PRELOAD", preload_list(&preload))
            .env("GLEANER_REPORT_DIR", stats_dir.path())
            // No budget: the library runs no pager, only the reserve.
            .env_remove("GLEANER_LOCAL_MEM");
        configure(&mut cmd, &args)?;
    }
    let signals = SignalForwarder::install()?;
    let started = Instant::now();
    let mut child = spawn_program(&mut cmd, &program, args.batch)?;
    let status = child.wait();
    CHILD_PID.store(0, Ordering::SeqCst);
    signals.stop();
    let wall = started.elapsed();
    let status = status.map_err(|e| SetupError::new(format!("waiting for the program: {e}")))?;
    let name = args.command[0].to_string_lossy().into_owned();
    let (exit, outcome) = exit_outcome(status, &name);
    let reserves = reserve_reports(stats_dir.path());
    let report = json!({
        "command": args.command.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>(),
        "outcome": outcome,
        "exit_status": exit,
        "wall_seconds": wall.as_secs_f64(),
        "far_memory": false,
        "latency_critical": reserve_json(&reserves),
        "batch": args.batch,
    });
    write_stats(args.stats.as_deref(), &report);
    if !args.quiet {
        eprintln!(
            "gleaner run: {name} {outcome} after {:.2} s on local memory (far memory off){}",
            wall.as_secs_f64(),
            if args.batch { ", marked batch" } else { "" }
        );
        if let Some(line) = summary_line(&reserves) {
            eprintln!("{line}");
        }
    }
    Ok(ExitCode::from(exit))
}
