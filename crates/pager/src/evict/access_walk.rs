//! The access scan's walk over a region (`evict/access.rs` says what it is for): one `PAGEMAP_SCAN`
//! call after another over the touched pages, each reporting runs of pages written since the
//! previous scan and protecting them again; the pages go to the eviction policy and the fault
//! trace.

use std::time::{Duration, Instant};

use gleaner_uffd::pagemap::Pagemap;

use crate::engine::Engine;
use crate::evict::access::{Work, POLICY_CHUNK};
use crate::PAGE_SIZE;

/// Scans `s` through `pagemap` if a scan is due and no other thread is scanning. Returns the
/// pages reported written (0 when no scan ran).
pub(crate) fn scan_if_due(s: &Engine, pagemap: &Pagemap) -> usize {
    let Some(mut w) = s.access.due() else {
        return 0;
    };
    walk(s, pagemap, &mut w, None)
}

/// Scans now, waiting for a scan in progress, and returns the pages reported written (a hook
/// for tests and diagnostics: `Region::scan_accesses_now`). An error says why the scan is off.
pub(crate) fn scan_now(s: &Engine, pagemap: &Pagemap) -> Result<Vec<usize>, String> {
    let mut w = s.access.now()?;
    let mut seen = Vec::new();
    walk(s, pagemap, &mut w, Some(&mut seen));
    match s.access.failure() {
        Some(why) => Err(why.to_string()),
        None => Ok(seen),
    }
}

/// One scan (the caller holds the scan's `w`); the pages reported are also appended to `seen`
/// when given.
fn walk(s: &Engine, pagemap: &Pagemap, w: &mut Work, mut seen: Option<&mut Vec<usize>>) -> usize {
    let started = Instant::now();
    let cpu0 = crate::cpus::thread_cpu_ns();
    let end_page = s.mem.table.touched_end();
    let (start, end) = (s.mem.addr_of(0), s.mem.addr_of(end_page));
    let mut at = start;
    let mut referenced = 0;
    let t_ns = s.reclaim.clock_ns();
    while at < end {
        w.runs.clear();
        let stop = match pagemap.harvest_written(at, end, &mut w.runs) {
            Ok(stop) => stop,
            Err(e) => {
                s.access.fail(format!(
                    "the kernel refused PAGEMAP_SCAN with write protection: {e}"
                ));
                return referenced;
            }
        };
        w.pages.clear();
        for r in &w.runs {
            let mut a = r.start as usize;
            while a < r.end as usize {
                if let Some(p) = s.mem.page_of(a) {
                    w.pages.push(p);
                }
                a += PAGE_SIZE;
            }
        }
        referenced += w.pages.len();
        if let Some(seen) = seen.as_deref_mut() {
            seen.extend_from_slice(&w.pages);
        }
        for chunk in w.pages.chunks(POLICY_CHUNK) {
            s.policy.lock().expect("policy lock").on_referenced(chunk);
        }
        if let Some(trace) = &s.trace {
            trace.record_referenced(t_ns, &w.pages);
        }
        // The walk stops early only when the runs filled up.
        at = if w.runs.len() < w.runs.capacity() || stop <= at {
            end
        } else {
            stop
        };
    }
    let cpu = Duration::from_nanos(crate::cpus::thread_cpu_ns().saturating_sub(cpu0));
    let evicted = s
        .counters
        .evicted_clean
        .load(std::sync::atomic::Ordering::Relaxed)
        + s.counters
            .evicted_dirty
            .load(std::sync::atomic::Ordering::Relaxed);
    s.access
        .finish(w, started, cpu, referenced, evicted, s.budget.pages());
    referenced
}
