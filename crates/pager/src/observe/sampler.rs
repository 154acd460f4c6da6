//! The stats trace: a line of JSON every [`STATS_TRACE_INTERVAL`] with the reclaim scheduler's
//! state and the fault and eviction counters, so a run's phases can be followed over time.
//!
//! The sampler only observes: no decision depends on it (the reclaim scheduler is driven inline
//! by page charges). It reads counters and the scheduler, never the region's memory.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::engine::Engine;

/// How often the stats trace gets a line.
pub const STATS_TRACE_INTERVAL: Duration = Duration::from_millis(100);

#[derive(Serialize)]
struct Sample {
    t_ms: u64,
    resident_pages: usize,
    zero_fill: u64,
    zero_filled_ahead: u64,
    remote_faults: u64,
    evicted: u64,
    waited_on_budget: u64,
    threads_awake: usize,
    target_threads: usize,
    low_watermark_pages: u64,
    high_watermark_pages: u64,
    swap_intensity: u64,
    s_in_pages_per_s: u64,
    s_out_pages_per_s: u64,
    turnaround_avg_ns: Option<u64>,
    direct_waits: u64,
    pool_cpu_ns: u64,
    pool_busy_ns: u64,
}

/// Opens the trace file (truncating it); an error names the path.
pub(crate) fn open(path: &Path) -> std::io::Result<BufWriter<File>> {
    gleaner_fds::make_held(|| File::create(path)).map(BufWriter::new)
}

/// The sampler's loop: one line per interval until the region stops, then a last one.
pub(crate) fn run(shared: Arc<Engine>, mut out: BufWriter<File>) {
    let started = Instant::now();
    loop {
        let stopping = shared
            .budget
            .nap_unless(STATS_TRACE_INTERVAL, || shared.stopping());
        let c = &shared.counters;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let r = shared
            .reclaim
            .stats(get(&c.zero_fills) + get(&c.remote_faults));
        let s = Sample {
            t_ms: started.elapsed().as_millis() as u64,
            resident_pages: shared.budget.resident(),
            zero_fill: get(&c.zero_fills),
            zero_filled_ahead: get(&c.zero_filled_ahead),
            remote_faults: get(&c.remote_faults),
            evicted: get(&c.evicted_clean) + get(&c.evicted_dirty),
            waited_on_budget: get(&c.waited_on_budget),
            threads_awake: r.threads_awake,
            target_threads: r.scheduler.target_threads,
            low_watermark_pages: r.scheduler.low_watermark_pages,
            high_watermark_pages: r.scheduler.high_watermark_pages,
            swap_intensity: r.scheduler.swap_intensity,
            s_in_pages_per_s: r.scheduler.s_in_pages_per_s,
            s_out_pages_per_s: r.scheduler.s_out_pages_per_s,
            turnaround_avg_ns: r.scheduler.turnaround_avg_ns,
            direct_waits: r.direct_waits,
            pool_cpu_ns: r.pool_cpu_ns,
            pool_busy_ns: r.pool_busy_ns,
        };
        let line = serde_json::to_string(&s).expect("sample serialises");
        if let Err(e) = writeln!(out, "{line}").and_then(|_| out.flush()) {
            log::warn!("stats trace: {e}; no more samples are written");
            return;
        }
        if stopping {
            return;
        }
    }
}
