//! The access scan: which resident pages the program used since the last look, for the
//! eviction order.
//!
//! User space sees faults, not accesses: a page that is mapped is read and written without the
//! pager knowing, so an eviction order fed only with page-ins takes a page that is hot and resident
//! for one untouched since it arrived, and evicts it (memcached at 50% local memory took well over
//! Linux's far faults per request that way: `bench/results/access-scan/README.md`). Linux reads the
//! accessed bit of every resident page; an ordinary process cannot.
//!
//! # The signal: written bits
//!
//! Under asynchronous dirty tracking (`UFFD_FEATURE_WP_ASYNC`) every page is installed
//! write-protected and the kernel lets the first write through by itself, leaving the page
//! *written* in its page table. The scan reads those bits over the region's touched pages with
//! `PAGEMAP_SCAN` and write-protects the written pages again in the same call
//! (`PM_SCAN_WP_MATCHING`), so each scan reports exactly the pages written since the previous
//! one: a reference bit for every page the program writes. Servers write on access:
//! memcached's item header (reference count, LRU time) on every GET, redis's object LRU clock,
//! CPython's reference counts, a garbage collector's marks. Pages only read stay invisible, as
//! before; a fault on one (it was evicted) still counts as its use.
//!
//! The reported pages go to the eviction policy as accesses
//! ([`EvictionPolicy::on_referenced`](crate::evict::order::EvictionPolicy::on_referenced), in
//! chunks, so a fault handler never waits long for the policy's lock), and into the fault trace as
//! `referenced` records, so `gleaner trace replay` compares orders with the same information.
//!
//! Eviction used to learn from the same bit whether a victim was written since it was
//! installed. It no longer can rely on that: a victim the scan re-protected reads as unwritten.
//! Nothing is lost by it: a victim that reads as unwritten is compared with its far copy and
//! written back if it differs, or written back when there is no far copy to compare (the
//! default drops a page's far copy when it comes back) (`evict/batch.rs`).
//!
//! # Cost and period
//!
//! A scan costs its own CPU (measured per scan, in the stats) and, for every page written again
//! after it, one write-protect fault that the kernel resolves by itself (no trip to user space,
//! about a microsecond of the writing thread). Both grow with how often it runs. It runs on a
//! reclaim thread, before a batch, when due: only a region that evicts needs the bits. The
//! period adapts to the eviction order's turnover: a quarter of the time the budget takes to
//! turn over at the current eviction rate (so a page used at least once per turnover has its
//! bit seen before its turn to leave), no shorter than [`MIN_PERIOD`] and than 50 times the last
//! scan's CPU time (the scan then stays under 2% of a CPU), no longer than [`MAX_PERIOD`].
//!
//! # Other signals
//!
//! DAMON's virtual-address monitoring and idle page tracking would also see reads. They are
//! probed once (when the stats are first read, not at every process's start) and listed in the
//! stats with why they are not used: this kernel offers DAMON's physical-address operations
//! only and no idle page tracking, and neither is built here yet. Synchronous dirty tracking has no
//! written bits to read (its clean pages' writes are faults the policy already sees): the scan is
//! off there, and the stats say so.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use gleaner_uffd::pagemap::PageRegion;

use crate::config::AccessScanSetting;
use crate::observe::stats::AccessStats;

/// The shortest adaptive period between scans.
pub const MIN_PERIOD: Duration = Duration::from_millis(20);

/// The longest adaptive period between scans.
pub const MAX_PERIOD: Duration = Duration::from_secs(1);

/// A scan's CPU time may be at most this share of its period (1/50: 2% of a CPU).
const CPU_SHARE_DIVISOR: u32 = 50;

/// Pages handed to the policy per lock acquisition.
pub(crate) const POLICY_CHUNK: usize = 256;

/// Runs of written pages read per `PAGEMAP_SCAN` call.
const RUNS_PER_CALL: usize = 1024;

/// One region's access scan.
pub(crate) struct AccessScan {
    /// Why written-bit scanning is off (`None`: on).
    off: Option<&'static str>,
    /// A fixed period (`AccessScanSetting::Every`), else adaptive.
    fixed: Option<Duration>,
    /// Set once the kernel refuses a scan: why; no scan is tried after.
    failed: OnceLock<String>,
    /// Held by the thread scanning (`try_lock`: one scan at a time; others skip).
    work: Mutex<Work>,
    /// The other signals, probed at the first look at the stats (not at every process's start).
    unavailable: OnceLock<BTreeMap<String, String>>,
    started: Instant,
    scans: AtomicU64,
    pages_referenced: AtomicU64,
    cpu_ns: AtomicU64,
    period_ns: AtomicU64,
}

/// The scanning thread's scratch and schedule.
pub(crate) struct Work {
    /// Runs of written pages, as `PAGEMAP_SCAN` returns them.
    pub(crate) runs: Vec<PageRegion>,
    /// The pages of one call's runs.
    pub(crate) pages: Vec<usize>,
    /// When the next scan is due.
    next: Instant,
    /// When the last scan ran, and the evictions counted then (for the eviction rate).
    last: Instant,
    last_evicted: u64,
}

impl AccessScan {
    /// The scan for a region, as `setting` asks; `written_bits`: its dirty tracking is
    /// asynchronous (the kernel keeps the bits the scan reads).
    pub(crate) fn new(setting: AccessScanSetting, written_bits: bool) -> AccessScan {
        let off = match (setting, written_bits) {
            (AccessScanSetting::Off, _) => Some("turned off (--access-scan off)"),
            (_, false) => Some(
                "synchronous dirty tracking has no written bits to read (its clean pages' \
                 writes are faults the policy sees already)",
            ),
            _ => None,
        };
        let fixed = match setting {
            AccessScanSetting::Every(d) => Some(d),
            _ => None,
        };
        let now = Instant::now();
        AccessScan {
            off,
            fixed,
            failed: OnceLock::new(),
            work: Mutex::new(Work {
                runs: Vec::with_capacity(RUNS_PER_CALL),
                pages: Vec::new(),
                next: now,
                last: now,
                last_evicted: 0,
            }),
            unavailable: OnceLock::new(),
            started: now,
            scans: AtomicU64::new(0),
            pages_referenced: AtomicU64::new(0),
            cpu_ns: AtomicU64::new(0),
            period_ns: AtomicU64::new(fixed.unwrap_or(MIN_PERIOD).as_nanos() as u64),
        }
    }

    /// Whether written-bit scanning is on.
    pub(crate) fn is_on(&self) -> bool {
        self.off.is_none() && self.failed.get().is_none()
    }

    /// The scan's schedule and scratch, if a scan is due and no other thread is scanning
    /// (the walk itself: `evict/access_walk.rs`).
    pub(crate) fn due(&self) -> Option<MutexGuard<'_, Work>> {
        if !self.is_on() {
            return None;
        }
        let w = self.work.try_lock().ok()?;
        (Instant::now() >= w.next).then_some(w)
    }

    /// The scan's schedule and scratch now, waiting for a scan in progress; an error says why
    /// the scan is off.
    pub(crate) fn now(&self) -> Result<MutexGuard<'_, Work>, String> {
        if let Some(why) = self.off.or(self.failed.get().map(String::as_str)) {
            return Err(why.to_string());
        }
        Ok(self.work.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The kernel refused a scan: none is tried again, and the stats say why.
    pub(crate) fn fail(&self, why: String) {
        log::warn!("access scan off: {why}");
        let _ = self.failed.set(why);
    }

    /// Why the scan failed, if it did.
    pub(crate) fn failure(&self) -> Option<&str> {
        self.failed.get().map(String::as_str)
    }

    /// Records a scan that started at `started`, took `cpu` of its thread and reported
    /// `referenced` pages, and schedules the next from the eviction count now (`evicted`) and
    /// the budget.
    pub(crate) fn finish(
        &self,
        w: &mut Work,
        started: Instant,
        cpu: Duration,
        referenced: usize,
        evicted: u64,
        budget_pages: usize,
    ) {
        self.scans.fetch_add(1, Ordering::Relaxed);
        self.pages_referenced
            .fetch_add(referenced as u64, Ordering::Relaxed);
        self.cpu_ns
            .fetch_add(cpu.as_nanos() as u64, Ordering::Relaxed);
        let since = started.saturating_duration_since(w.last);
        let rate = if since.is_zero() {
            0.0
        } else {
            evicted.saturating_sub(w.last_evicted) as f64 / since.as_secs_f64()
        };
        w.last = started;
        w.last_evicted = evicted;
        let period = self
            .fixed
            .unwrap_or_else(|| adaptive_period(budget_pages, rate, cpu));
        self.period_ns
            .store(period.as_nanos() as u64, Ordering::Relaxed);
        w.next = started + period;
    }

    /// The stats.
    pub(crate) fn stats(&self) -> AccessStats {
        let mut unavailable = self.unavailable.get_or_init(probe_other_signals).clone();
        if let Some(why) = self.off {
            unavailable.insert("written-bits".into(), why.into());
        } else if let Some(why) = self.failure() {
            unavailable.insert("written-bits".into(), why.to_string());
        }
        let cpu_ms = self.cpu_ns.load(Ordering::Relaxed) as f64 / 1e6;
        let life = self.started.elapsed().as_secs_f64().max(1e-3);
        AccessStats {
            signals: if self.is_on() {
                vec!["written-bits"]
            } else {
                Vec::new()
            },
            unavailable,
            scans: self.scans.load(Ordering::Relaxed),
            pages_referenced: self.pages_referenced.load(Ordering::Relaxed),
            cpu_ms,
            cpu_ms_per_s: cpu_ms / life,
            period_ms: self.period_ns.load(Ordering::Relaxed) as f64 / 1e6,
        }
    }
}

/// The adaptive period (see the module's doc): a quarter of the budget's turnover time at
/// `evict_rate` pages per second, at least [`MIN_PERIOD`] and 50 times `last_cpu`, at most
/// [`MAX_PERIOD`].
pub(crate) fn adaptive_period(
    budget_pages: usize,
    evict_rate: f64,
    last_cpu: Duration,
) -> Duration {
    let floor = MIN_PERIOD.max(last_cpu * CPU_SHARE_DIVISOR).min(MAX_PERIOD);
    if evict_rate <= 0.0 {
        return MAX_PERIOD.max(floor);
    }
    let turnover = Duration::from_secs_f64((budget_pages as f64 / evict_rate).min(3600.0));
    (turnover / 4).clamp(floor, MAX_PERIOD.max(floor))
}

/// The access signals not used here, each with why (DAMON, idle page tracking).
fn probe_other_signals() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let damon = std::path::Path::new("/sys/kernel/mm/damon/admin");
    let why = if !damon.exists() {
        "no DAMON in this kernel (or its sysfs interface is not mounted)".to_string()
    } else {
        match gleaner_fds::read_to_string(
            "/sys/kernel/mm/damon/admin/kdamonds/0/contexts/0/avail_operations",
        ) {
            Ok(ops) if !ops.split_whitespace().any(|o| o == "vaddr") => format!(
                "DAMON offers only `{}` here (virtual-address monitoring is needed)",
                ops.trim()
            ),
            _ => "DAMON's virtual-address monitoring is not used by gleaner yet".to_string(),
        }
    };
    out.insert("damon".to_string(), why);
    let idle = if std::path::Path::new("/sys/kernel/mm/page_idle/bitmap").exists() {
        "idle page tracking is not used by gleaner yet (it needs page frame numbers: \
         CAP_SYS_ADMIN)"
    } else {
        "no idle page tracking in this kernel"
    };
    out.insert("idle-page".to_string(), idle.to_string());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_period_is_a_quarter_of_the_turnover_within_its_bounds() {
        // 64k pages turning over at 32k pages/s: 2 s, a quarter is 500 ms.
        let p = adaptive_period(65_536, 32_768.0, Duration::from_micros(100));
        assert_eq!(p, Duration::from_millis(500));
        // Fast turnover: the floor.
        assert_eq!(
            adaptive_period(1_000, 1e6, Duration::from_micros(10)),
            MIN_PERIOD
        );
        // An expensive scan (2 ms) keeps it at 50x its cost.
        assert_eq!(
            adaptive_period(1_000, 1e6, Duration::from_millis(2)),
            Duration::from_millis(100)
        );
        // No eviction: the longest.
        assert_eq!(adaptive_period(1_000, 0.0, Duration::ZERO), MAX_PERIOD);
        // Slow turnover: capped.
        assert_eq!(adaptive_period(1 << 20, 10.0, Duration::ZERO), MAX_PERIOD);
    }
}
