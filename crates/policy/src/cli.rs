//! `gleaner trace`: replay a fault trace offline under every prefetcher and eviction policy
//! (`replay`), or write a synthetic trace (`synth`).
//!
//! The `gleaner` binary mounts [`TraceCommand`] as `gleaner trace` and calls [`main`].

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::Serialize;

use crate::evict::{self, Visibility};
use crate::prefetch;
use crate::sim::{self, SimConfig, SimResult};
use crate::trace::{self, synth, Header};

/// `gleaner trace`: fault traces and the offline simulator.
#[derive(clap::Args, Debug)]
pub struct TraceCommand {
    /// What to do.
    #[command(subcommand)]
    pub command: TraceSubcommand,
}

/// Subcommands of `gleaner trace`.
#[derive(clap::Subcommand, Debug)]
pub enum TraceSubcommand {
    /// Replay a trace with a given local memory under each prefetcher × eviction policy, with
    /// exact LRU and Belady's optimum as references; report misses, accuracy, coverage and
    /// timeliness.
    Replay(ReplayArgs),
    /// Write a synthetic trace (every access recorded).
    Synth(SynthArgs),
}

/// Arguments of `gleaner trace replay`.
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// The trace file.
    pub file: PathBuf,
    /// Local memory: a page count (`2048`), a size with a unit (`64M`), or a percentage of the
    /// trace's footprint in distinct pages (`50%`).
    #[arg(long)]
    pub local: String,
    /// Prefetchers, comma-separated: none, next:N, stride, readahead, leap, leap:PWMAX, or all.
    #[arg(long, default_value = "all")]
    pub prefetch: String,
    /// Eviction policies, comma-separated: fifo, clock, refault, rackmem (rackmem:N sets
    /// min_free to N pages, rackmem:N% to N% of the local memory), recency (recency:N% with a
    /// probation of N%), active, frequency, lru, belady, or all.
    #[arg(long, default_value = "all")]
    pub evict: String,
    /// What CLOCK, RackMem, recency, active and frequency may see: `fault` (what user space sees), `oracle`
    /// (every access), or `both` (one row each). LRU and Belady are always oracle.
    #[arg(long, default_value = "both")]
    pub visibility: String,
    /// Fetch latency in microseconds of trace time: a prefetch used sooner is counted late.
    #[arg(long, default_value_t = sim::DEFAULT_LATENCY_NS as f64 / 1000.0)]
    pub latency_us: f64,
    /// Replays run in parallel on this many threads (default: the available CPUs).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `gleaner trace synth`.
#[derive(clap::Args, Debug)]
pub struct SynthArgs {
    /// Pattern: seq, stride:N, interleave:A,B (two threads), random, zipf or zipf:S.
    #[arg(long)]
    pub pattern: String,
    /// Footprint in distinct pages.
    #[arg(long)]
    pub pages: u64,
    /// Number of accesses to record.
    #[arg(long)]
    pub accesses: u64,
    /// Output file (overwritten).
    #[arg(long)]
    pub out: PathBuf,
    /// Random seed (random and zipf).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Nanoseconds between accesses.
    #[arg(long, default_value_t = 1000)]
    pub gap_ns: u64,
}

/// Runs `gleaner trace ...`; errors go to stderr with exit status 1.
pub fn main(cmd: TraceCommand) -> ExitCode {
    let result = match cmd.command {
        TraceSubcommand::Replay(a) => replay(&a),
        TraceSubcommand::Synth(a) => synth_cmd(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gleaner trace: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Parses `--local`: pages, a size with a unit (converted with `page_size`), or a percentage of
/// `footprint` pages. The result is at least 1 page.
pub fn parse_local(s: &str, page_size: u32, footprint: usize) -> Result<usize, String> {
    let t = s.trim();
    let bad =
        || format!("--local `{s}`: expected pages (2048), a size (64M) or a percentage (50%)");
    let pages = if let Some(p) = t.strip_suffix('%') {
        let pct: f64 = p.trim().parse().map_err(|_| bad())?;
        if !(pct.is_finite() && pct > 0.0) {
            return Err(bad());
        }
        (footprint as f64 * pct / 100.0).ceil() as usize
    } else if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        t.parse::<usize>().map_err(|_| bad())?
    } else {
        let bytes = gleaner_proto::units::parse_size(t).map_err(|e| format!("--local: {e}"))?;
        usize::try_from(bytes / u64::from(page_size.max(1))).map_err(|_| bad())?
    };
    if pages == 0 {
        return Err(format!("--local `{s}` is less than one page"));
    }
    Ok(pages)
}

/// Parses `--visibility`.
fn parse_visibility(s: &str) -> Result<Vec<Visibility>, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "both" => Ok(vec![Visibility::Fault, Visibility::Oracle]),
        other => Ok(vec![other
            .parse::<Visibility>()
            .map_err(|e| format!("{e}, or both"))?]),
    }
}

#[derive(Serialize)]
struct ReplayReport<'a> {
    file: String,
    header: Header,
    records: usize,
    footprint_pages: usize,
    capacity_pages: usize,
    latency_ns: u64,
    results: &'a [SimResult],
}

fn replay(a: &ReplayArgs) -> Result<(), String> {
    let prefetchers = prefetch::parse_list(&a.prefetch).map_err(|e| e.to_string())?;
    let evicts = evict::parse_list(&a.evict).map_err(|e| e.to_string())?;
    let visibilities = parse_visibility(&a.visibility)?;
    if prefetchers.is_empty() || evicts.is_empty() {
        return Err("--prefetch and --evict need at least one entry each".into());
    }
    if !(a.latency_us.is_finite() && a.latency_us >= 0.0) {
        return Err(format!("--latency-us {} is not a duration", a.latency_us));
    }
    let (header, records) =
        trace::read_file(&a.file).map_err(|e| format!("{}: {e}", a.file.display()))?;
    if records.is_empty() {
        return Err(format!("{}: the trace has no records", a.file.display()));
    }
    let footprint = sim::footprint(&records);
    let capacity = parse_local(&a.local, header.page_size, footprint)?;
    let cfg = SimConfig {
        capacity,
        latency_ns: (a.latency_us * 1000.0).round() as u64,
    };
    let combos = sim::combos(&prefetchers, &evicts, &visibilities);
    let threads = a.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let results = sim::run_all(&records, &cfg, &combos, threads);
    if a.json {
        let report = ReplayReport {
            file: a.file.display().to_string(),
            header,
            records: records.len(),
            footprint_pages: footprint,
            capacity_pages: capacity,
            latency_ns: cfg.latency_ns,
            results: &results,
        };
        let s = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        println!("{s}");
    } else {
        print!(
            "{}",
            format_table(&a.file, records.len(), footprint, &cfg, &results)
        );
    }
    Ok(())
}

/// The replay table: one row per result, with misses also relative to exact LRU under the same
/// prefetcher when an LRU row exists.
pub fn format_table(
    file: &Path,
    records: usize,
    footprint: usize,
    cfg: &SimConfig,
    results: &[SimResult],
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "trace {}: {records} references, footprint {footprint} pages; local {} pages ({:.1}% of \
         footprint); fetch latency {:.1} us",
        file.display(),
        cfg.capacity,
        100.0 * cfg.capacity as f64 / footprint.max(1) as f64,
        cfg.latency_ns as f64 / 1000.0
    );
    let _ = writeln!(
        s,
        "{:<11} {:<8} {:<6} {:>10} {:>7} {:>7} {:>10} {:>6} {:>6} {:>6} {:>9} {:>9} {:>9}",
        "prefetch",
        "evict",
        "sees",
        "misses",
        "miss%",
        "vs-lru",
        "pf-issued",
        "acc%",
        "cov%",
        "late%",
        "t-p50us",
        "t-p95us",
        "minor"
    );
    for r in results {
        let lru = results
            .iter()
            .find(|x| x.prefetcher == r.prefetcher && x.evict == "lru")
            .map(|x| x.misses);
        let vs = match lru {
            Some(l) if l > 0 => format!("{:.3}", r.misses as f64 / l as f64),
            _ => "-".into(),
        };
        let us = |v: Option<u64>| v.map_or("-".into(), |n| format!("{:.1}", n as f64 / 1000.0));
        let pct = |x: f64| format!("{:.1}", 100.0 * x);
        let late = if r.prefetch_hits == 0 {
            "-".to_string()
        } else {
            pct(r.prefetch_late as f64 / r.prefetch_hits as f64)
        };
        let _ = writeln!(
            s,
            "{:<11} {:<8} {:<6} {:>10} {:>7} {:>7} {:>10} {:>6} {:>6} {:>6} {:>9} {:>9} {:>9}",
            r.prefetcher,
            r.evict,
            r.visibility.to_string(),
            r.misses,
            pct(r.miss_ratio),
            vs,
            r.prefetch_issued,
            pct(r.accuracy),
            pct(r.coverage),
            late,
            us(r.timeliness_p50_ns),
            us(r.timeliness_p95_ns),
            r.minor_faults
        );
    }
    s
}

fn synth_cmd(a: &SynthArgs) -> Result<(), String> {
    let pattern: synth::Pattern = a.pattern.parse()?;
    if a.pages == 0 {
        return Err("--pages must be at least 1".into());
    }
    let cfg = synth::SynthConfig {
        pattern,
        pages: a.pages,
        accesses: a.accesses,
        gap_ns: a.gap_ns,
        seed: a.seed,
    };
    let records = synth::generate(&cfg);
    trace::write_file(&a.out, Header::default(), &records)
        .map_err(|e| format!("{}: {e}", a.out.display()))?;
    eprintln!(
        "wrote {} records ({pattern}, {} pages) to {}",
        records.len(),
        a.pages,
        a.out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_sizes() {
        assert_eq!(parse_local("2048", 4096, 10), Ok(2048));
        assert_eq!(parse_local("1M", 4096, 10), Ok(256));
        assert_eq!(parse_local("50%", 4096, 1001), Ok(501));
        assert!(parse_local("0", 4096, 10).is_err());
        assert!(parse_local("1K", 4096, 10)
            .unwrap_err()
            .contains("less than one page"));
        assert!(parse_local("x%", 4096, 10).is_err());
        assert!(parse_local("12Q", 4096, 10).is_err());
        assert_eq!(
            parse_visibility("both").unwrap(),
            vec![Visibility::Fault, Visibility::Oracle]
        );
        assert!(parse_visibility("psychic").is_err());
    }
}
