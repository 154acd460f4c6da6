//! Prefetching in the engine: which pages to fetch ahead of demand (a `gleaner_policy` prefetcher),
//! and how a prefetched page reaches the program.
//!
//! After a demand fault is installed and its thread woken, the handler asks the prefetcher for
//! candidates (the faulting thread's id comes with each fault, so streams are per thread), claims
//! those that are REMOTE (→ PREFETCHING), takes a budget slot for each (never waiting, never
//! reclaiming directly: a prefetch that does not fit is dropped) and reads them in one batched
//! request. Prefetches therefore travel after the demand fetch that triggered them, never in
//! front of it. A demand fault on a page whose prefetch is in flight does not fetch it again: it
//! moves the page to FETCHING and the prefetching handler installs it on arrival (a *late*
//! prefetch).
//!
//! Two ways to hand prefetched pages to the program ([`PrefetchInstall`]):
//! * `marker` (default): every page of a window but the last is installed at once (mapped,
//!   write-protected, clean: its first use costs nothing); the last one, the *marker*, is staged
//!   unmapped. The marker's fault, served from local memory, confirms the window (its pages count
//!   as used) and triggers the next window, like Linux's readahead marker.
//! * `staged`: every prefetched page waits unmapped in the staging buffer; each first use is a
//!   fault served locally (no network), so every hit is seen exactly, at the price of a
//!   userfaultfd round trip per page.
//!
//! Timeliness (Leap): the time from a staged page's arrival to its first use (p50, p95).
//!
//! Staged pages hold budget slots; the staging buffer is bounded and drops its oldest entry (the
//! page stays REMOTE, its memnode copy valid) when full. Metrics follow Leap: accuracy = used /
//! issued, coverage = used / (used + demand misses), and late prefetches counted apart.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use gleaner_policy::prefetch::{Fault, Prefetcher, PrefetcherKind};
use serde::Serialize;

use crate::observe::counters::{LatencyHistogram, RegionCounters};
use crate::PAGE_SIZE;

/// How prefetched pages reach the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrefetchInstall {
    /// Install all but the last page of a window; stage that one as the window's marker.
    #[default]
    Marker,
    /// Stage every prefetched page; each first use is a (local) fault.
    Staged,
}

impl std::str::FromStr for PrefetchInstall {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "marker" => Ok(PrefetchInstall::Marker),
            "staged" => Ok(PrefetchInstall::Staged),
            _ => Err(format!(
                "invalid prefetch install mode `{s}` (expected marker or staged)"
            )),
        }
    }
}

impl std::fmt::Display for PrefetchInstall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PrefetchInstall::Marker => "marker",
            PrefetchInstall::Staged => "staged",
        })
    }
}

/// A prefetched page waiting unmapped for its first use.
pub(crate) struct Staged {
    /// The page's contents (identical to its memnode copy).
    pub(crate) data: Box<[u8; PAGE_SIZE]>,
    /// Pages of the same window installed at once (marker mode): they count as used when this
    /// marker is used, and as wasted when it is dropped unused.
    pub(crate) window: Vec<usize>,
    /// When it arrived (for timeliness: prefetch to first use).
    staged_at: Instant,
}

#[derive(Default)]
struct Staging {
    pages: HashMap<usize, Staged>,
    /// Staging order, oldest first (entries already taken are skipped lazily).
    order: VecDeque<usize>,
}

/// The region's prefetching state.
pub(crate) struct Prefetch {
    kind: PrefetcherKind,
    install: PrefetchInstall,
    prefetcher: Mutex<Box<dyn Prefetcher>>,
    staging: Mutex<Staging>,
    max_staged: usize,
    issued: AtomicU64,
    /// Pages of prefetches the memnode dropped as late.
    dropped_late: AtomicU64,
    /// See [`Prefetch::deadline`] (0: none yet).
    deadline_us: AtomicU64,
    /// The deadline was configured: timeliness does not change it.
    fixed_deadline: std::sync::atomic::AtomicBool,
    used: AtomicU64,
    late: AtomicU64,
    wasted: AtomicU64,
    windows: AtomicU64,
    staged_hits: AtomicU64,
    /// Time from a staged page's arrival to its first use.
    timeliness: LatencyHistogram,
}

/// Prefetch statistics (Leap's definitions).
#[derive(Debug, Clone, Serialize)]
pub struct PrefetchStats {
    /// The prefetcher, e.g. `leap` or `none`.
    pub prefetcher: String,
    /// How prefetched pages are handed over: `marker` or `staged`.
    pub install: String,
    /// Pages fetched ahead of demand.
    pub issued: u64,
    /// Prefetched pages used: staged pages whose first use faulted, and (marker mode) the
    /// installed pages of windows whose marker was used.
    pub used: u64,
    /// Prefetches a demand fault reached while they were in flight (fetched once, installed on
    /// arrival).
    pub late: u64,
    /// Prefetched pages known unused: staged pages dropped before any use, with their windows.
    pub wasted: u64,
    /// Prefetch requests (windows) sent.
    pub windows: u64,
    /// Pages of prefetches the memnode dropped for waiting past their deadline on its link
    /// (`gleaner memnode --bandwidth`): never read, fetched on demand if used.
    pub dropped_late: u64,
    /// Faults served from the staging buffer (no network).
    pub staged_hits: u64,
    /// Pages staged now.
    pub staged_now: usize,
    /// Timeliness (Leap): time from a staged prefetched page's arrival to its first use, median,
    /// in microseconds (none before the first staged hit).
    pub timeliness_p50_us: Option<f64>,
    /// The same, 95th percentile (the percentile Leap quotes).
    pub timeliness_p95_us: Option<f64>,
    /// The most pages a window takes now: what the link to the memnode moves in half a
    /// millisecond at the recent write-backs' pace, at most a request's worth (256).
    pub window_cap: usize,
    /// used / issued.
    pub accuracy: f64,
    /// used / (used + demand remote faults).
    pub coverage: f64,
    /// late / issued.
    pub late_ratio: f64,
}

impl Prefetch {
    /// A fixed deadline (see [`Prefetch::deadline`]) instead of one learnt from timeliness.
    pub(crate) fn with_deadline(self, deadline: Option<std::time::Duration>) -> Self {
        if let Some(d) = deadline {
            self.deadline_us
                .store(d.as_micros().max(1) as u64, Ordering::Relaxed);
            self.fixed_deadline.store(true, Ordering::Relaxed);
        }
        self
    }

    /// Prefetching with `kind`, staging at most `max_staged` pages.
    pub(crate) fn new(kind: PrefetcherKind, install: PrefetchInstall, max_staged: usize) -> Self {
        Prefetch {
            kind,
            install,
            prefetcher: Mutex::new(kind.build()),
            staging: Mutex::new(Staging::default()),
            max_staged: max_staged.max(1),
            issued: AtomicU64::new(0),
            used: AtomicU64::new(0),
            late: AtomicU64::new(0),
            wasted: AtomicU64::new(0),
            windows: AtomicU64::new(0),
            dropped_late: AtomicU64::new(0),
            deadline_us: AtomicU64::new(0),
            fixed_deadline: std::sync::atomic::AtomicBool::new(false),
            staged_hits: AtomicU64::new(0),
            timeliness: LatencyHistogram::default(),
        }
    }

    /// Whether any prefetching happens.
    pub(crate) fn enabled(&self) -> bool {
        self.kind != PrefetcherKind::None
    }

    /// How prefetched pages are handed over.
    pub(crate) fn install_mode(&self) -> PrefetchInstall {
        self.install
    }

    /// Reports a page-in fault to the prefetcher and appends its candidates to `out`. For a
    /// marker hit, `window` pages are reported as used too.
    pub(crate) fn on_fault(
        &self,
        page: usize,
        tid: u32,
        hit: Option<&[usize]>,
        out: &mut Vec<u64>,
    ) {
        if !self.enabled() {
            return;
        }
        let mut p = self.prefetcher.lock().expect("prefetcher lock");
        if let Some(window) = hit {
            for &w in window {
                p.on_prefetch_hit(w as u64, tid);
            }
        }
        p.on_fault(
            Fault {
                page: page as u64,
                tid,
                prefetch_hit: hit.is_some(),
            },
            out,
        );
    }

    /// Takes `page`'s staged data if it is staged (its first use): counts the hit.
    pub(crate) fn take_staged(&self, page: usize) -> Option<Staged> {
        if !self.enabled() {
            return None;
        }
        let st = self
            .staging
            .lock()
            .expect("staging lock")
            .pages
            .remove(&page)?;
        RegionCounters::add(&self.used, 1 + st.window.len() as u64);
        RegionCounters::add(&self.staged_hits, 1);
        self.timeliness.record(st.staged_at.elapsed());
        if self.staged_hits.load(Ordering::Relaxed).is_multiple_of(64)
            && !self.fixed_deadline.load(Ordering::Relaxed)
        {
            if let Some(us) = self.timeliness.quantile_us(0.95) {
                self.deadline_us
                    .store((us as u64).max(1000), Ordering::Relaxed);
            }
        }
        Some(st)
    }

    /// Forgets `page`'s staged data (the page is leaving REMOTE another way: discarded, or
    /// brought home before fork). Returns whether it was staged (then its budget slot is the
    /// caller's to release).
    pub(crate) fn forget(&self, page: usize) -> bool {
        if !self.enabled() {
            return false;
        }
        match self
            .staging
            .lock()
            .expect("staging lock")
            .pages
            .remove(&page)
        {
            Some(st) => {
                RegionCounters::add(&self.wasted, 1 + st.window.len() as u64);
                true
            }
            None => false,
        }
    }

    /// Whether `page` is staged (stable while the caller owns the page's state).
    pub(crate) fn is_staged(&self, page: usize) -> bool {
        self.enabled()
            && self
                .staging
                .lock()
                .expect("staging lock")
                .pages
                .contains_key(&page)
    }

    /// Takes back an entry just staged whose page a demand fault claimed before it was published
    /// (the page is installed instead; not a hit of its own, it counts as late).
    /// Returns false if the entry was already dropped to make room (its slot released).
    pub(crate) fn unstage(&self, page: usize) -> bool {
        self.staging
            .lock()
            .expect("staging lock")
            .pages
            .remove(&page)
            .is_some()
    }

    /// Stages `page` (the caller owns it in PREFETCHING and holds its budget slot). Returns how
    /// many older staged pages were dropped to make room: their slots are the caller's to release.
    pub(crate) fn stage(&self, page: usize, data: &[u8], window: Vec<usize>) -> usize {
        let mut buf = Box::new([0u8; PAGE_SIZE]);
        buf.copy_from_slice(data);
        let mut s = self.staging.lock().expect("staging lock");
        let mut dropped = 0;
        while s.pages.len() >= self.max_staged {
            let Some(old) = s.order.pop_front() else {
                break;
            };
            if let Some(st) = s.pages.remove(&old) {
                RegionCounters::add(&self.wasted, 1 + st.window.len() as u64);
                dropped += 1;
            }
        }
        let staged = Staged {
            data: buf,
            window,
            staged_at: Instant::now(),
        };
        if let Some(old) = s.pages.insert(page, staged) {
            // Staged again (a second prefetch raced with the first one's staging): the older
            // copy's slot goes back.
            RegionCounters::add(&self.wasted, 1 + old.window.len() as u64);
            dropped += 1;
        }
        s.order.push_back(page);
        // Keep the order queue from growing without bound with entries already taken.
        if s.order.len() > 4 * self.max_staged {
            let Staging { pages, order } = &mut *s;
            order.retain(|p| pages.contains_key(p));
        }
        dropped
    }

    /// Counts `pages` prefetched pages the memnode dropped as late.
    pub(crate) fn count_dropped_late(&self, pages: usize) {
        RegionCounters::add(&self.dropped_late, pages as u64);
    }

    /// How long a prefetch may wait at the memnode before it would arrive too late to help:
    /// the 95th percentile of the time prefetched pages wait for their first use, once there
    /// are enough samples (none before: no deadline), at least a millisecond.
    /// Read on every prefetch, so kept ready: recomputed every 64th staged hit.
    pub(crate) fn deadline(&self) -> Option<std::time::Duration> {
        match self.deadline_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(std::time::Duration::from_micros(us)),
        }
    }

    pub(crate) fn count_issued(&self, pages: usize) {
        RegionCounters::add(&self.issued, pages as u64);
        RegionCounters::add(&self.windows, 1);
    }

    /// Counts `pages` prefetched pages as used (a window confirmed by a late marker).
    pub(crate) fn credit_used(&self, pages: usize) {
        RegionCounters::add(&self.used, pages as u64);
    }

    pub(crate) fn count_late(&self) {
        RegionCounters::add(&self.late, 1);
        // A late prefetch still saved the fetch: the demand used the prefetched page.
        RegionCounters::add(&self.used, 1);
    }

    /// A snapshot for the stats JSON; `demand_misses` is the count of remote demand faults.
    pub(crate) fn stats(&self, demand_misses: u64, window_cap: usize) -> PrefetchStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (issued, used) = (get(&self.issued), get(&self.used));
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        PrefetchStats {
            prefetcher: self.kind.to_string(),
            install: self.install.to_string(),
            issued,
            used,
            late: get(&self.late),
            wasted: get(&self.wasted),
            windows: get(&self.windows),
            dropped_late: get(&self.dropped_late),
            staged_hits: get(&self.staged_hits),
            staged_now: self.staging.lock().expect("staging lock").pages.len(),
            timeliness_p50_us: self.timeliness.quantile_us(0.50),
            timeliness_p95_us: self.timeliness.quantile_us(0.95),
            window_cap,
            accuracy: ratio(used, issued),
            coverage: ratio(used, used + demand_misses),
            late_ratio: ratio(get(&self.late), issued),
        }
    }
}
