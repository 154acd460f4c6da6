//! The offline simulator: replays a trace against a local cache of fixed capacity under one
//! (prefetcher, eviction policy) pair and counts what the engine would see.
//!
//! # Model
//!
//! Each trace record is one reference to a page (fault kinds are not trusted: the simulator
//! decides what faults). For reference `i` to page `p`:
//!
//! * `p` **resident and mapped**: a *hit*. Invisible to the prefetcher; delivered to the eviction
//!   policy as [`Touch::Hit`] only if the policy is [`Visibility::Oracle`].
//! * `p` **resident, unmapped by the policy** ([`EvictPolicy::is_mapped`] false): a *minor fault*
//!   (no I/O), delivered as [`Touch::Refault`]. Not shown to the prefetcher (it only sees
//!   page-ins).
//! * `p` **prefetched and not used yet**: a *prefetch hit* (the page waits unmapped, as in the
//!   engine's staging buffer, so its first use is a fault). Delivered as [`Touch::PrefetchHit`]
//!   and to the prefetcher as a fault with `prefetch_hit = true`.
//! * otherwise a *demand miss*: room is made (see below), the page is inserted as
//!   [`Insert::Demand`], and the prefetcher is told.
//!
//! The prefetcher's candidates that are not resident are fetched at once as
//! [`Insert::Prefetch`], each after making room; they count against the capacity. At most half
//! the capacity is prefetched per fault, so a tiny cache cannot be flushed by one decision.
//! Making room means asking the policy for victims until fewer than `capacity` pages are
//! resident; a victim that was prefetched and never used is *wasted*.
//!
//! # Metrics (Leap's definitions, Leap, USENIX ATC 2020)
//!
//! * **accuracy** = prefetch hits ÷ prefetches issued (pages actually fetched);
//! * **coverage** = prefetch hits ÷ (prefetch hits + demand misses), i.e. the share of page-in
//!   faults served by a prefetch;
//! * **timeliness** = for each used prefetched page, time from its prefetch to its first use (p50
//!   and p95 reported). Trace time is not stretched by misses (the trace is replayed as
//!   recorded). A fetch takes `latency_ns`: a prefetch used less than `latency_ns` after it was
//!   issued is counted as a *late* prefetch hit (the access waits for the rest of the fetch). Late
//!   hits still count as hits for accuracy and coverage.

use std::sync::Arc;

use serde::Serialize;

use crate::evict::{EvictKind, EvictPolicy, Future, Insert, PageMap, PageSet, Touch, Visibility};
use crate::prefetch::{Fault, Prefetcher, PrefetcherKind};
use crate::trace::{Kind, Record};

/// The default fetch latency: 20 µs, a 4 KiB remote fetch over TCP in the engine's measured range.
pub const DEFAULT_LATENCY_NS: u64 = 20_000;

/// Replay parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimConfig {
    /// Local capacity in pages (at least 1).
    pub capacity: usize,
    /// Time a fetch takes, in trace nanoseconds (for timeliness).
    pub latency_ns: u64,
}

impl SimConfig {
    /// A configuration with the default latency.
    pub fn new(capacity: usize) -> Self {
        SimConfig {
            capacity,
            latency_ns: DEFAULT_LATENCY_NS,
        }
    }
}

/// What one replay measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimResult {
    /// The prefetcher's name.
    pub prefetcher: String,
    /// The eviction policy's name.
    pub evict: String,
    /// What the eviction policy could see (`fault` or `oracle`).
    pub visibility: Visibility,
    /// Local capacity in pages.
    pub capacity_pages: usize,
    /// References replayed.
    pub references: u64,
    /// References to mapped resident pages (no fault).
    pub hits: u64,
    /// Demand misses (a fetch on the critical path), cold ones included.
    pub misses: u64,
    /// First references to a page (misses no policy can avoid without prefetching).
    pub cold_misses: u64,
    /// Faults on pages the policy had unmapped but kept (no I/O): the cost of sampling accesses.
    pub minor_faults: u64,
    /// Faults the handler would see: misses, prefetch hits and minor faults.
    pub faults: u64,
    /// Pages fetched by prefetching.
    pub prefetch_issued: u64,
    /// Prefetched pages used (first use counted once).
    pub prefetch_hits: u64,
    /// Prefetch hits that came less than the fetch latency after the prefetch.
    pub prefetch_late: u64,
    /// Prefetched pages evicted before any use.
    pub prefetch_wasted: u64,
    /// Prefetched pages still unused at the end of the trace.
    pub prefetch_unused_at_end: u64,
    /// Candidates dropped because they were already resident.
    pub prefetch_redundant: u64,
    /// Pages evicted.
    pub evictions: u64,
    /// [`Kind::Referenced`] records on resident pages, handed to the policy as
    /// [`Touch::Scanned`].
    pub scan_referenced: u64,
    /// Misses ÷ references.
    pub miss_ratio: f64,
    /// Prefetch hits ÷ prefetches issued (0 when none issued).
    pub accuracy: f64,
    /// Prefetch hits ÷ (prefetch hits + misses) (0 when neither happened).
    pub coverage: f64,
    /// Median time from prefetch to first use, in ns.
    pub timeliness_p50_ns: Option<u64>,
    /// 95th percentile of the time from prefetch to first use, in ns.
    pub timeliness_p95_ns: Option<u64>,
}

/// Replays `records` with `prefetcher` and `policy`. `policy` must be fresh; a [`Belady`]
/// policy must have been built from the future of exactly these records.
///
/// [`Belady`]: crate::evict::Belady
pub fn simulate(
    records: &[Record],
    prefetcher: &mut dyn Prefetcher,
    policy: &mut dyn EvictPolicy,
    cfg: &SimConfig,
) -> SimResult {
    let capacity = cfg.capacity.max(1);
    let max_prefetch = capacity / 2;
    let oracle = policy.visibility() == Visibility::Oracle;
    // Resident pages; `Some(t)` = prefetched at time t and not used yet.
    let mut resident: PageMap<Option<u64>> = PageMap::default();
    let mut seen = PageSet::default();
    let mut candidates: Vec<u64> = Vec::new();
    let mut gaps: Vec<u64> = Vec::new();
    let mut r = SimResult {
        prefetcher: prefetcher.name(),
        evict: policy.name(),
        visibility: policy.visibility(),
        capacity_pages: capacity,
        references: records.len() as u64,
        hits: 0,
        misses: 0,
        cold_misses: 0,
        minor_faults: 0,
        faults: 0,
        prefetch_issued: 0,
        prefetch_hits: 0,
        prefetch_late: 0,
        prefetch_wasted: 0,
        prefetch_unused_at_end: 0,
        prefetch_redundant: 0,
        evictions: 0,
        scan_referenced: 0,
        miss_ratio: 0.0,
        accuracy: 0.0,
        coverage: 0.0,
        timeliness_p50_ns: None,
        timeliness_p95_ns: None,
    };

    let make_room = |resident: &mut PageMap<Option<u64>>,
                     policy: &mut dyn EvictPolicy,
                     r: &mut SimResult,
                     at: usize| {
        while resident.len() >= capacity {
            let v = policy
                .victim(at)
                .expect("the eviction policy lost track of resident pages");
            match resident.remove(&v) {
                Some(Some(_)) => r.prefetch_wasted += 1,
                Some(None) => {}
                None => panic!("the eviction policy evicted page {v}, which is not resident"),
            }
            r.evictions += 1;
        }
    };

    for (i, rec) in records.iter().enumerate() {
        let page = rec.page;
        if rec.kind == Kind::Referenced {
            // A reference bit, not a reference (`Kind::Referenced`).
            r.references -= 1;
            if resident.get(&page) == Some(&None) {
                r.scan_referenced += 1;
                policy.touch(page, Touch::Scanned, i);
            }
            continue;
        }
        let fault = match resident.get_mut(&page) {
            Some(slot @ Some(_)) => {
                let issued = slot.take().expect("matched Some");
                let gap = rec.time_ns.saturating_sub(issued);
                gaps.push(gap);
                if gap < cfg.latency_ns {
                    r.prefetch_late += 1;
                }
                r.prefetch_hits += 1;
                policy.touch(page, Touch::PrefetchHit, i);
                Some(true)
            }
            Some(None) => {
                if !policy.is_mapped(page) {
                    r.minor_faults += 1;
                    policy.touch(page, Touch::Refault, i);
                } else {
                    r.hits += 1;
                    if oracle {
                        policy.touch(page, Touch::Hit, i);
                    }
                }
                None
            }
            None => {
                r.misses += 1;
                if seen.insert(page) {
                    r.cold_misses += 1;
                }
                make_room(&mut resident, policy, &mut r, i);
                resident.insert(page, None);
                policy.insert(page, Insert::Demand, i);
                Some(false)
            }
        };
        let Some(prefetch_hit) = fault else {
            continue;
        };
        candidates.clear();
        prefetcher.on_fault(
            Fault {
                page,
                tid: rec.tid,
                prefetch_hit,
            },
            &mut candidates,
        );
        let mut issued_now = 0usize;
        for &c in &candidates {
            if c == page || resident.contains_key(&c) {
                r.prefetch_redundant += 1;
                continue;
            }
            if issued_now >= max_prefetch {
                break;
            }
            make_room(&mut resident, policy, &mut r, i);
            resident.insert(c, Some(rec.time_ns));
            policy.insert(c, Insert::Prefetch, i);
            r.prefetch_issued += 1;
            issued_now += 1;
        }
        debug_assert_eq!(policy.len(), resident.len());
    }

    r.prefetch_unused_at_end = resident.values().filter(|v| v.is_some()).count() as u64;
    r.faults = r.misses + r.prefetch_hits + r.minor_faults;
    r.miss_ratio = ratio(r.misses, r.references);
    r.accuracy = ratio(r.prefetch_hits, r.prefetch_issued);
    r.coverage = ratio(r.prefetch_hits, r.prefetch_hits + r.misses);
    r.timeliness_p50_ns = percentile(&mut gaps, 0.50);
    r.timeliness_p95_ns = percentile(&mut gaps, 0.95);
    r
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// The `q` quantile (nearest rank) of `v`, reordering it; `None` if empty.
fn percentile(v: &mut [u64], q: f64) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    Some(*v.select_nth_unstable(rank).1)
}

/// The number of distinct pages referenced.
pub fn footprint(records: &[Record]) -> usize {
    records.iter().map(|r| r.page).collect::<PageSet>().len()
}

/// One row of a replay matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Combo {
    /// The prefetcher.
    pub prefetcher: PrefetcherKind,
    /// The eviction policy.
    pub evict: EvictKind,
    /// What the policy sees (references are always oracle; FIFO is listed as fault).
    pub visibility: Visibility,
}

/// Every (prefetcher, policy, visibility) row: visibility-dependent policies (CLOCK, RackMem)
/// get one row per entry of `visibilities`, the others one row each.
pub fn combos(
    prefetchers: &[PrefetcherKind],
    evicts: &[EvictKind],
    visibilities: &[Visibility],
) -> Vec<Combo> {
    let mut out = Vec::new();
    for &prefetcher in prefetchers {
        for &evict in evicts {
            let vis: Vec<Visibility> = if evict.depends_on_visibility() {
                visibilities.to_vec()
            } else if evict.is_reference() {
                vec![Visibility::Oracle]
            } else {
                vec![Visibility::Fault]
            };
            for visibility in vis {
                out.push(Combo {
                    prefetcher,
                    evict,
                    visibility,
                });
            }
        }
    }
    out
}

/// Replays `records` once per combo, on up to `threads` threads, in combo order.
pub fn run_all(
    records: &[Record],
    cfg: &SimConfig,
    combos: &[Combo],
    threads: usize,
) -> Vec<SimResult> {
    let future = combos
        .iter()
        .any(|c| c.evict == EvictKind::Belady)
        .then(|| Arc::new(Future::new(records.iter().map(|r| r.page))));
    let run = |c: &Combo| {
        let mut p = c.prefetcher.build();
        let mut e = c
            .evict
            .build(cfg.capacity.max(1), c.visibility, future.as_ref())
            .expect("the future is built whenever belady is asked for");
        simulate(records, p.as_mut(), e.as_mut(), cfg)
    };
    let threads = threads.clamp(1, combos.len().max(1));
    if threads == 1 {
        return combos.iter().map(run).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut slots: Vec<Option<SimResult>> = vec![None; combos.len()];
    let done = std::sync::Mutex::new(&mut slots);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(c) = combos.get(k) else {
                    break;
                };
                let res = run(c);
                done.lock().expect("no panics while holding the lock")[k] = Some(res);
            });
        }
    });
    slots
        .into_iter()
        .map(|r| r.expect("every combo ran"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evict::Lru;
    use crate::prefetch::NoPrefetch;
    use crate::trace::Kind;

    fn refs(pages: &[u64]) -> Vec<Record> {
        pages
            .iter()
            .enumerate()
            .map(|(i, &page)| Record {
                time_ns: i as u64 * 1000,
                page,
                tid: 1,
                kind: Kind::Access,
            })
            .collect()
    }

    #[test]
    fn percentile_nearest_rank() {
        let mut v = vec![5, 1, 4, 2, 3];
        assert_eq!(percentile(&mut v, 0.5), Some(3));
        assert_eq!(percentile(&mut v, 0.95), Some(5));
        assert_eq!(percentile(&mut [], 0.5), None);
    }

    #[test]
    fn counts_add_up() {
        let t = refs(&[1, 2, 1, 3, 1, 2]);
        let r = simulate(&t, &mut NoPrefetch, &mut Lru::new(), &SimConfig::new(2));
        assert_eq!(r.hits + r.misses + r.prefetch_hits + r.minor_faults, 6);
        assert_eq!(r.cold_misses, 3);
        assert_eq!(r.prefetch_issued, 0);
        assert_eq!(r.accuracy, 0.0);
    }

    #[test]
    fn combos_rows() {
        let c = combos(
            &[PrefetcherKind::None],
            &EvictKind::all(),
            &[Visibility::Fault, Visibility::Oracle],
        );
        // fifo, clock ×2, refault, rackmem ×2, recency ×2, active ×2, frequency ×2, lru, belady
        assert_eq!(c.len(), 14);
        let t = refs(&[1, 2, 3, 1, 2, 3, 4, 1]);
        let serial = run_all(&t, &SimConfig::new(3), &c, 1);
        let parallel = run_all(&t, &SimConfig::new(3), &c, 4);
        assert_eq!(serial, parallel);
    }
}
