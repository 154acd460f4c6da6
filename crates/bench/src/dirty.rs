//! `gleaner bench dirty-tracking`: the cost of learning which pages were written, measured two
//! ways on the same kernel in the same run.
//!
//! * **sync-wp**: pages are write-protected with `UFFDIO_WRITEPROTECT`; the first write to each
//!   raises a write-protect fault that a handler thread resolves by lifting the protection (what
//!   the pager does today). Cost = the write as the writer sees it, plus re-protecting.
//! * **wp-async**: `UFFD_FEATURE_WP_ASYNC`: the kernel resolves the write itself and records it;
//!   `PAGEMAP_SCAN` later returns the written pages and re-protects them atomically. Cost = the
//!   write as the writer sees it, plus the scan, done in eviction-batch-sized chunks.

use std::time::Instant;

use gleaner_pager::{LatencySummary, PAGE_SIZE};
use gleaner_sys::anon::AnonMapping;
use gleaner_uffd::pagemap::{PageRegion, Pagemap};
use gleaner_uffd::{features, Event, FaultKind, Uffd, UffdOptions};
use serde::Serialize;

use super::new_hist;

/// Arguments of `gleaner bench dirty-tracking`.
#[derive(clap::Args, Debug)]
pub struct DirtyArgs {
    /// Pages written (each once) in each scheme.
    #[arg(long, default_value_t = 16384)]
    pages: usize,
    /// Pages per `PAGEMAP_SCAN` call (the eviction batch size).
    #[arg(long, default_value_t = 32)]
    scan_chunk: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// One scheme's costs, per page.
#[derive(Debug, Serialize)]
pub struct SchemeCost {
    /// The first write to a protected page, as the writing thread sees it.
    pub write: LatencySummary,
    /// Re-protecting (sync-wp: `UFFDIO_WRITEPROTECT` over the range; wp-async: included in scan).
    pub protect_ns_per_page: f64,
    /// wp-async only: finding the written pages and re-protecting them, per page scanned.
    pub scan_ns_per_page: Option<f64>,
    /// wp-async only: scanning pages none of which were written, per page.
    pub clean_scan_ns_per_page: Option<f64>,
    /// Pages the scheme reported written (must equal the pages written).
    pub found_written: usize,
}

/// The report.
#[derive(Debug, Serialize)]
pub struct DirtyReport {
    /// Pages written in each scheme.
    pub pages: usize,
    /// Synchronous write-protect faults.
    pub sync_wp: SchemeCost,
    /// `WP_ASYNC` + `PAGEMAP_SCAN`.
    pub wp_async: SchemeCost,
    /// Mean total per written page, sync-wp / wp-async.
    pub sync_over_async: f64,
}

/// `pages` pages of private anonymous memory, populated, each page made the process's own by a
/// write.
fn populated(pages: usize) -> Result<AnonMapping, String> {
    let m = AnonMapping::new(pages * PAGE_SIZE, libc::MAP_POPULATE)
        .map_err(|e| format!("mmap: {e}"))?;
    for i in 0..pages {
        // SAFETY: inside the mapping just created; makes every page a private anonymous page.
        unsafe { ((m.addr() + i * PAGE_SIZE) as *mut u64).write_volatile(i as u64) };
    }
    Ok(m)
}

/// Writes one word to each page from a fresh thread, timing each write.
fn timed_writes(base: usize, pages: usize) -> std::thread::JoinHandle<LatencySummary> {
    std::thread::spawn(move || {
        let mut h = new_hist();
        for i in 0..pages {
            let t = Instant::now();
            // SAFETY: page i of a live mapping that outlives this thread (joined before drop).
            unsafe { ((base + i * PAGE_SIZE + 8) as *mut u64).write_volatile(1) };
            h.saturating_record(t.elapsed().as_nanos() as u64);
        }
        LatencySummary::of(&h)
    })
}

fn sync_wp(pages: usize) -> Result<SchemeCost, String> {
    let m = populated(pages)?;
    let uffd = Uffd::open(UffdOptions {
        features: features::PAGEFAULT_FLAG_WP,
        allow_user_mode_only: false,
    })
    .map_err(|e| e.to_string())?;
    uffd.register(m.addr(), m.len(), true)
        .map_err(|e| e.to_string())?;
    let t = Instant::now();
    uffd.write_protect(m.addr(), m.len(), true, false)
        .map_err(|e| e.to_string())?;
    let protect = t.elapsed().as_nanos() as f64 / pages as f64;
    let writer = timed_writes(m.addr(), pages);
    let mut events = Vec::new();
    let mut found = 0;
    while found < pages {
        let mut pfd = libc::pollfd {
            fd: uffd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one valid pollfd living across the call.
        unsafe { libc::poll(&mut pfd, 1, 1000) };
        uffd.read_events(&mut events, 16)
            .map_err(|e| e.to_string())?;
        for ev in events.drain(..) {
            if let Event::Fault {
                kind: FaultKind::WriteProtect,
                addr,
                ..
            } = ev
            {
                uffd.write_protect(addr, PAGE_SIZE, false, true)
                    .map_err(|e| e.to_string())?;
                found += 1;
            }
        }
    }
    let write = writer.join().map_err(|_| "writer panicked")?;
    Ok(SchemeCost {
        write,
        protect_ns_per_page: protect,
        scan_ns_per_page: None,
        clean_scan_ns_per_page: None,
        found_written: found,
    })
}

fn wp_async(pages: usize, chunk: usize) -> Result<SchemeCost, String> {
    let m = populated(pages)?;
    let uffd = Uffd::open(UffdOptions {
        features: features::PAGEFAULT_FLAG_WP | features::WP_ASYNC,
        allow_user_mode_only: false,
    })
    .map_err(|e| e.to_string())?;
    uffd.register(m.addr(), m.len(), true)
        .map_err(|e| e.to_string())?;
    let t = Instant::now();
    uffd.write_protect(m.addr(), m.len(), true, false)
        .map_err(|e| e.to_string())?;
    let protect = t.elapsed().as_nanos() as f64 / pages as f64;
    let write = timed_writes(m.addr(), pages)
        .join()
        .map_err(|_| "writer panicked")?;
    let pm = Pagemap::open().map_err(|e| format!("/proc/self/pagemap: {e}"))?;
    let mut out: Vec<PageRegion> = Vec::with_capacity(chunk);
    let scan = |out: &mut Vec<PageRegion>| -> Result<(usize, f64), String> {
        let mut found = 0;
        let t = Instant::now();
        for start in (0..pages).step_by(chunk) {
            let end = (start + chunk).min(pages);
            out.clear();
            pm.take_written(
                m.addr() + start * PAGE_SIZE,
                m.addr() + end * PAGE_SIZE,
                out,
            )
            .map_err(|e| format!("PAGEMAP_SCAN: {e}"))?;
            found += out
                .iter()
                .map(|r| (r.end - r.start) as usize / PAGE_SIZE)
                .sum::<usize>();
        }
        Ok((found, t.elapsed().as_nanos() as f64 / pages as f64))
    };
    let (found, scan_ns) = scan(&mut out)?;
    let (found_again, clean_ns) = scan(&mut out)?;
    if found_again != 0 {
        return Err(format!(
            "PAGEMAP_SCAN did not re-protect: {found_again} pages reported written twice"
        ));
    }
    Ok(SchemeCost {
        write,
        protect_ns_per_page: protect,
        scan_ns_per_page: Some(scan_ns),
        clean_scan_ns_per_page: Some(clean_ns),
        found_written: found,
    })
}

/// Runs both schemes and reports.
pub fn run(args: &DirtyArgs) -> Result<DirtyReport, String> {
    let sync = sync_wp(args.pages)?;
    let asyn = wp_async(args.pages, args.scan_chunk.max(1))?;
    for (name, s) in [("sync-wp", &sync), ("wp-async", &asyn)] {
        if s.found_written != args.pages {
            return Err(format!(
                "{name} found {} written pages of {}",
                s.found_written, args.pages
            ));
        }
    }
    let total = |s: &SchemeCost| {
        s.write.mean_us * 1000.0 + s.protect_ns_per_page + s.scan_ns_per_page.unwrap_or(0.0)
    };
    Ok(DirtyReport {
        pages: args.pages,
        sync_over_async: total(&sync) / total(&asyn),
        sync_wp: sync,
        wp_async: asyn,
    })
}

/// Prints the report for people.
pub fn print_human(r: &DirtyReport) {
    println!("dirty tracking, {} pages written once each", r.pages);
    for (name, s) in [("sync-wp ", &r.sync_wp), ("wp-async", &r.wp_async)] {
        println!(
            "  {name}: write p50 {:.2} us mean {:.2} us p99 {:.2} us; protect {:.0} ns/page; scan {} ns/page; clean scan {} ns/page",
            s.write.p50_us,
            s.write.mean_us,
            s.write.p99_us,
            s.protect_ns_per_page,
            s.scan_ns_per_page.map_or("-".into(), |v| format!("{v:.0}")),
            s.clean_scan_ns_per_page.map_or("-".into(), |v| format!("{v:.0}")),
        );
    }
    println!(
        "  cost per written page, sync-wp / wp-async: {:.1}x",
        r.sync_over_async
    );
}
