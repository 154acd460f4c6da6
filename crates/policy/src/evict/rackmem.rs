//! RackMem's per-region residency policy (RackMem, PACT 2020; its per-region lists, fault handler and proactive reclaim).
//!
//! # Structures (§3.3)
//!
//! * An **active list** of mapped pages in insertion order only (never re-sorted).
//! * A **free list** of unmapped pages that keep their data: pages moved there by proactive
//!   reclaim (INACTIVE) and prefetched pages waiting for their first use (PREFETCH). A fault on a
//!   free-list page needs no I/O and moves it to the active-list tail: the free list is a cheap
//!   second chance.
//! * An **8-bit access score** per page, aged as `score = (score >> 1) | (accessed << 7)`.
//!
//! # Eviction
//!
//! * **Victims** come from the free-list head (its data is dropped now); if the free list is
//!   empty, **reactive reclaim** takes the active-list head, O(1) (§3.4 step 4).
//! * **Proactive reclaim** (§3.5) runs when fewer than `min_free` slots are free, counting empty
//!   capacity and free-list pages: with `mu`, `sd` the mean and standard deviation of the scores
//!   of all active pages, each of the first `k × min_free` active pages from the head with
//!   `z = (score − mu) / sd ≤ t` (`z = 0` when `sd = 0`) is unmapped onto the free-list tail,
//!   keeping its data. Defaults `min_free = 512`, `k = 4`, `t = 0`. The paper's reclaim thread is
//!   asynchronous; the simulator runs it inline after the insertion that crossed the threshold. A
//!   scan that frees nothing is not repeated before the next aging pass.
//!
//! # The access approximation (user space has no accessed bits)
//!
//! Under [`Visibility::Fault`] a page's "accessed bit" for an aging period is: *the page was paged
//! in during the period* — a demand miss, the first use of a prefetched page, or a re-fault on a
//! free-list page (the gleaner note of §3.5: "treat a re-fault as the reference bit"). A mapped
//! page's accesses are invisible, so its score decays to 0 in eight periods; proactive reclaim
//! then moves it to the free list, where a further access is seen as a re-fault that rescues it.
//! Under [`Visibility::Oracle`] every access sets the bit, as the hardware bit would.
//!
//! # gleaner choices (not published)
//!
//! * The aging period (the paper's scan period is unpublished) is `age_period` page-ins
//!   (demand, prefetch and re-faults), by default `min_free`.
//! * Aging is lazy, so that it costs O(1) instead of a pass over every resident page: each page
//!   keeps its score and accessed bit as of the aging period it was last settled in, and its
//!   score now is that one aged once with the bit and then shifted right once per period since
//!   (`Meta::epoch`). The mean and deviation proactive reclaim needs come from a histogram of
//!   the active pages' scores (accessed this period or not), which an aging pass shifts in 256
//!   steps. Decisions are unchanged (a test replays a long trace against the eager pass's
//!   fingerprint). The eager pass ran in the fault handler under the policy lock and grew with
//!   the budget: a victim and a page-in cost several times more at a quarter-million resident
//!   pages than lazily (release build, a warm cache: `bench/results/rackmem-aging-ab/README.md`),
//!   and in memcached at 50% perf showed the pass on every fault.
//! * On small caches `min_free` is capped at `capacity / 8` (at least 1), so the published 512
//!   does not turn most of a tiny cache into free list.
//! * New pages start with score 0 and the accessed bit set (the fault that brought them in).
//! * [`MinFree`] / `rackmem:N` / `rackmem:N%` set `min_free` explicitly. The second-chance window
//!   is about `k × min_free` pages, so with the published 512 it shrinks relative to a large
//!   cache and RackMem drifts towards FIFO under fault visibility (measured on Zipf 0.99: its
//!   misses over LRU's grow with the cache, and a `min_free` set as a share of the cache brings
//!   them back down). `tests/rackmem.rs` checks the 60,000-page case.
//! * `rotate_survivors` (off by default, as the paper never re-sorts) moves scanned pages that
//!   survive to the active-list tail, so the next scan sees new candidates instead of the same
//!   hot pages; it only matters with oracle scores, where survivors exist.

use std::collections::VecDeque;

use serde::Serialize;

use super::{EvictPolicy, Insert, PageMap, Touch, Visibility};

/// RackMem's tunables; [`Default`] gives the published values (RackMem, PACT 2020).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RackMemConfig {
    /// Proactive reclaim starts below this many free slots (512).
    pub min_free: usize,
    /// Scan depth multiplier: `k × min_free` candidates per proactive run (4).
    pub k: usize,
    /// z-score threshold: pages with `z ≤ t` are reclaimed (0).
    pub t: f64,
    /// Page-ins between aging passes; 0 means `min_free` (after capping).
    pub age_period: usize,
    /// `min_free` is capped at `capacity / small_cache_divisor` (8); 0 disables the cap.
    pub small_cache_divisor: usize,
    /// Scanned pages that survive proactive reclaim move to the active-list tail (a gleaner
    /// option) instead of staying at the head in insertion order (the paper; false).
    pub rotate_survivors: bool,
}

impl Default for RackMemConfig {
    fn default() -> Self {
        RackMemConfig {
            min_free: 512,
            k: 4,
            t: 0.0,
            age_period: 0,
            small_cache_divisor: 8,
            rotate_survivors: false,
        }
    }
}

/// How `min_free` is chosen (the command line's `rackmem`, `rackmem:N`, `rackmem:N%`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MinFree {
    /// The published 512 pages, capped at `capacity / 8` on small caches.
    #[default]
    Published,
    /// A fixed number of pages (no cap).
    Pages(usize),
    /// A percentage of the capacity (no cap).
    Percent(u8),
}

impl RackMemConfig {
    /// The published configuration with `min_free` chosen by `min_free` for a cache of
    /// `capacity` pages.
    pub fn with_min_free(capacity: usize, min_free: MinFree) -> Self {
        let d = RackMemConfig::default();
        match min_free {
            MinFree::Published => d,
            MinFree::Pages(n) => RackMemConfig {
                min_free: n.max(1),
                small_cache_divisor: 0,
                ..d
            },
            MinFree::Percent(p) => RackMemConfig {
                min_free: (capacity.saturating_mul(usize::from(p)) / 100).max(1),
                small_cache_divisor: 0,
                ..d
            },
        }
    }
}

/// Counters of what RackMem did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RackMemStats {
    /// Proactive reclaim runs.
    pub proactive_runs: u64,
    /// Pages moved to the free list by proactive reclaim.
    pub proactive_unmapped: u64,
    /// Victims taken from the free list.
    pub free_list_evictions: u64,
    /// Victims taken from the active-list head (reactive reclaim).
    pub reactive_evictions: u64,
    /// Free-list pages brought back to the active list by a fault (second chances used).
    pub rescued: u64,
    /// Aging passes.
    pub agings: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum List {
    Active,
    Free,
}

#[derive(Debug, Clone, Copy)]
struct Meta {
    /// The score and accessed bit as of aging period `epoch` (see [`current`]).
    score: u8,
    accessed: bool,
    list: List,
    /// Matches the live queue entry; other entries for this page are stale.
    seq: u64,
    /// The aging period `score` and `accessed` are of.
    epoch: u64,
}

/// RackMem; see the module documentation.
#[derive(Debug, Clone)]
pub struct RackMem {
    cfg: RackMemConfig,
    capacity: usize,
    visibility: Visibility,
    min_free: usize,
    age_period: usize,
    meta: PageMap<Meta>,
    active: VecDeque<(u64, u64)>,
    free: VecDeque<(u64, u64)>,
    n_active: usize,
    n_free: usize,
    /// Aging periods so far.
    epoch: u64,
    /// Active pages by current score: `hist[0]` not accessed this period, `hist[1]` accessed.
    hist: Box<[[u64; 256]; 2]>,
    since_age: usize,
    seq: u64,
    stuck: bool,
    scratch: Vec<(u64, u64)>,
    stats: RackMemStats,
}

impl RackMem {
    /// `min_free` and the aging period for a cache of `capacity` pages under `cfg`.
    fn sized(capacity: usize, cfg: &RackMemConfig) -> (usize, usize) {
        let mut min_free = cfg.min_free.max(1);
        if let Some(cap) = capacity.checked_div(cfg.small_cache_divisor) {
            min_free = min_free.min(cap.max(1));
        }
        let age_period = if cfg.age_period == 0 {
            min_free
        } else {
            cfg.age_period
        };
        (min_free, age_period)
    }

    /// RackMem for a cache of `capacity` pages.
    pub fn new(capacity: usize, visibility: Visibility, cfg: RackMemConfig) -> Self {
        let (min_free, age_period) = Self::sized(capacity, &cfg);
        RackMem {
            cfg,
            capacity,
            visibility,
            min_free,
            age_period,
            meta: PageMap::default(),
            active: VecDeque::new(),
            free: VecDeque::new(),
            n_active: 0,
            n_free: 0,
            epoch: 0,
            hist: Box::new([[0; 256]; 2]),
            since_age: 0,
            seq: 0,
            stuck: false,
            scratch: Vec::new(),
            stats: RackMemStats::default(),
        }
    }

    /// The effective `min_free` (after the small-cache cap).
    pub fn min_free(&self) -> usize {
        self.min_free
    }

    /// Pages on the free list (unmapped, data kept).
    pub fn free_list_len(&self) -> usize {
        self.n_free
    }

    /// What the policy did so far.
    pub fn stats(&self) -> RackMemStats {
        self.stats
    }

    /// The score of a resident page.
    pub fn score(&self, page: u64) -> Option<u8> {
        self.meta.get(&page).map(|m| current(m, self.epoch).0)
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Counts an active page with `(score, accessed)` in the histogram.
    fn hist_add(&mut self, (score, accessed): (u8, bool)) {
        self.hist[usize::from(accessed)][usize::from(score)] += 1;
    }

    /// Stops counting an active page with `(score, accessed)`.
    fn hist_sub(&mut self, (score, accessed): (u8, bool)) {
        self.hist[usize::from(accessed)][usize::from(score)] -= 1;
    }

    /// The page's meta, brought to the current aging period.
    fn settled(&mut self, page: u64) -> &mut Meta {
        let epoch = self.epoch;
        let m = self.meta.get_mut(&page).expect("page is resident");
        settle(m, epoch);
        m
    }

    fn push_active(&mut self, page: u64) {
        let seq = self.next_seq();
        let m = self.settled(page);
        m.list = List::Active;
        m.seq = seq;
        let now = (m.score, m.accessed);
        self.active.push_back((page, seq));
        self.n_active += 1;
        self.hist_add(now);
    }

    fn push_free(&mut self, page: u64) {
        let seq = self.next_seq();
        let m = self.settled(page);
        m.list = List::Free;
        m.seq = seq;
        self.free.push_back((page, seq));
        self.n_free += 1;
    }

    fn is_live(&self, page: u64, seq: u64, list: List) -> bool {
        self.meta
            .get(&page)
            .is_some_and(|m| m.seq == seq && m.list == list)
    }

    /// One page-in: counts towards the aging period, then checks the free threshold.
    fn paged_in(&mut self) {
        self.since_age += 1;
        if self.since_age >= self.age_period {
            self.since_age = 0;
            self.age();
        }
        let free_slots = self.capacity.saturating_sub(self.meta.len()) + self.n_free;
        if free_slots < self.min_free && !self.stuck {
            self.proactive();
        }
    }

    /// One aging pass: every score becomes `(score >> 1) | (accessed << 7)` and every accessed
    /// bit is cleared, lazily (pages settle when next looked at), the histogram at once.
    fn age(&mut self) {
        self.stats.agings += 1;
        self.epoch += 1;
        let [idle, accessed] = &*self.hist;
        let mut aged = [0u64; 256];
        for s in 0..256 {
            aged[s >> 1] += idle[s];
            aged[(s >> 1) | 0x80] += accessed[s];
        }
        *self.hist = [aged, [0; 256]];
        self.stuck = false;
        self.compact();
    }

    /// The active pages' score sum and sum of squares, from the histogram.
    fn score_sums(&self) -> (u64, u64) {
        let (mut sum, mut sumsq) = (0u64, 0u64);
        for (s, (&a, &b)) in self.hist[0].iter().zip(self.hist[1].iter()).enumerate() {
            let (s, n) = (s as u64, a + b);
            sum += s * n;
            sumsq += s * s * n;
        }
        (sum, sumsq)
    }

    fn proactive(&mut self) {
        self.stats.proactive_runs += 1;
        if self.n_active == 0 {
            self.stuck = true;
            return;
        }
        let n = self.n_active as f64;
        let (sum, sumsq) = self.score_sums();
        let mu = sum as f64 / n;
        let var = (sumsq as f64 / n - mu * mu).max(0.0);
        let sd = var.sqrt();
        let budget = self.cfg.k.max(1) * self.min_free;
        let mut scanned = std::mem::take(&mut self.scratch);
        scanned.clear();
        while scanned.len() < budget {
            let Some((p, s)) = self.active.pop_front() else {
                break;
            };
            if self.is_live(p, s, List::Active) {
                scanned.push((p, s));
            }
        }
        let mut freed = 0u64;
        let mut kept = 0usize;
        for i in 0..scanned.len() {
            let (p, s) = scanned[i];
            let now = current(&self.meta[&p], self.epoch);
            let z = if sd == 0.0 {
                0.0
            } else {
                (f64::from(now.0) - mu) / sd
            };
            if z <= self.cfg.t {
                self.n_active -= 1;
                self.hist_sub(now);
                self.push_free(p);
                freed += 1;
            } else {
                scanned[kept] = (p, s);
                kept += 1;
            }
        }
        if self.cfg.rotate_survivors {
            for &(p, s) in &scanned[..kept] {
                self.active.push_back((p, s));
            }
        } else {
            // Survivors go back to the head in their original (insertion) order.
            for &(p, s) in scanned[..kept].iter().rev() {
                self.active.push_front((p, s));
            }
        }
        self.scratch = scanned;
        self.stats.proactive_unmapped += freed;
        if freed == 0 {
            self.stuck = true;
        }
    }

    fn compact(&mut self) {
        let live = self.meta.len();
        if self.active.len() > 2 * live + 64 {
            let meta = &self.meta;
            self.active
                .retain(|&(p, s)| meta.get(&p).is_some_and(|m| m.seq == s));
        }
        if self.free.len() > 2 * live + 64 {
            let meta = &self.meta;
            self.free
                .retain(|&(p, s)| meta.get(&p).is_some_and(|m| m.seq == s));
        }
    }

    fn forget(&mut self, page: u64) -> bool {
        match self.meta.remove(&page) {
            Some(m) => {
                match m.list {
                    List::Active => {
                        self.n_active -= 1;
                        self.hist_sub(current(&m, self.epoch));
                    }
                    List::Free => self.n_free -= 1,
                }
                true
            }
            None => false,
        }
    }
}

/// `m`'s score and accessed bit in aging period `epoch` (at or after `m.epoch`): the first
/// pass since `m.epoch` folds the accessed bit in, each later one only shifts.
fn current(m: &Meta, epoch: u64) -> (u8, bool) {
    match epoch - m.epoch {
        0 => (m.score, m.accessed),
        passes => {
            let first = (m.score >> 1) | (u8::from(m.accessed) << 7);
            (
                first.checked_shr((passes - 1).min(8) as u32).unwrap_or(0),
                false,
            )
        }
    }
}

/// Brings `m` to aging period `epoch`.
fn settle(m: &mut Meta, epoch: u64) {
    (m.score, m.accessed) = current(m, epoch);
    m.epoch = epoch;
}

impl EvictPolicy for RackMem {
    /// `rackmem` with the published configuration, else `rackmem:N` with N the effective
    /// `min_free` in pages.
    fn name(&self) -> String {
        if self.cfg == RackMemConfig::default() {
            "rackmem".into()
        } else {
            format!("rackmem:{}", self.min_free)
        }
    }

    fn visibility(&self) -> Visibility {
        self.visibility
    }

    fn insert(&mut self, page: u64, how: Insert, _at: usize) {
        self.forget(page);
        self.meta.insert(
            page,
            Meta {
                score: 0,
                accessed: how == Insert::Demand,
                list: List::Free,
                seq: 0,
                epoch: self.epoch,
            },
        );
        match how {
            Insert::Demand => self.push_active(page),
            Insert::Prefetch => self.push_free(page),
        }
        self.paged_in();
    }

    fn touch(&mut self, page: u64, how: Touch, _at: usize) {
        let epoch = self.epoch;
        let Some(m) = self.meta.get_mut(&page) else {
            return;
        };
        settle(m, epoch);
        let before = (m.score, m.accessed);
        m.accessed = true;
        if m.list == List::Active {
            self.hist_sub(before);
            self.hist_add((before.0, true));
        } else {
            // A fault on an unmapped page: back to the active-list tail, no I/O.
            self.n_free -= 1;
            if how == Touch::Refault {
                self.stats.rescued += 1;
            }
            self.push_active(page);
            self.paged_in();
        }
    }

    fn is_mapped(&self, page: u64) -> bool {
        !self.meta.get(&page).is_some_and(|m| m.list != List::Active)
    }

    fn victim(&mut self, _at: usize) -> Option<u64> {
        while let Some((p, s)) = self.free.pop_front() {
            if self.is_live(p, s, List::Free) {
                self.forget(p);
                self.stats.free_list_evictions += 1;
                return Some(p);
            }
        }
        while let Some((p, s)) = self.active.pop_front() {
            if self.is_live(p, s, List::Active) {
                self.forget(p);
                self.stats.reactive_evictions += 1;
                return Some(p);
            }
        }
        None
    }

    fn remove(&mut self, page: u64) {
        if self.forget(page) {
            self.compact();
        }
    }

    fn len(&self) -> usize {
        self.meta.len()
    }

    /// The capacity, and with it the small-cache cap on `min_free` and the aging period that
    /// follows it; what the pages scored so far stays.
    fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity;
        (self.min_free, self.age_period) = Self::sized(capacity, &self.cfg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> RackMemConfig {
        RackMemConfig {
            min_free: 2,
            k: 2,
            t: 0.0,
            age_period: 4,
            small_cache_divisor: 0,
            rotate_survivors: false,
        }
    }

    #[test]
    fn reactive_then_proactive_then_second_chance() {
        let mut r = RackMem::new(8, Visibility::Fault, small());
        for p in 0..6u64 {
            r.insert(p, Insert::Demand, p as usize);
        }
        // 2 free slots: no proactive reclaim yet; the first aging gave pages 0..4 the MSB.
        assert_eq!(r.free_list_len(), 0);
        assert_eq!(r.score(0), Some(0x80));
        r.insert(6, Insert::Demand, 6);
        // 1 free slot < min_free: scores are 128 (pages 0..4) and 0 (pages 4..7), mean 73. The
        // k·min_free = 4 pages scanned from the head (0..4) all score above the mean: nothing is
        // freed, and the scan is not repeated before the next aging.
        assert_eq!(r.stats().proactive_runs, 1);
        assert_eq!(r.free_list_len(), 0);
        r.insert(7, Insert::Demand, 7);
        // Aging at the 8th page-in: 0..4 -> 64, 4..8 -> 128. Free slots 0: proactive frees the
        // head pages whose score is below the mean (96): 0, 1, 2, 3.
        assert_eq!(r.stats().agings, 2);
        assert_eq!(r.free_list_len(), 4);
        assert!(!r.is_mapped(0) && r.is_mapped(7));
        // A re-fault on 1 rescues it; victims then come from the free-list head: 0, 2, 3.
        r.touch(1, Touch::Refault, 8);
        assert!(r.is_mapped(1));
        assert_eq!(r.stats().rescued, 1);
        assert_eq!(r.victim(9), Some(0));
        assert_eq!(r.victim(9), Some(2));
        assert_eq!(r.victim(9), Some(3));
        // Free list empty: reactive reclaim takes the active-list head (4, inserted first).
        assert_eq!(r.victim(9), Some(4));
        assert_eq!(r.stats().reactive_evictions, 1);
    }

    #[test]
    fn equal_scores_give_z_zero_which_is_reclaimed() {
        let mut r = RackMem::new(
            4,
            Visibility::Fault,
            RackMemConfig {
                age_period: 100,
                ..small()
            },
        );
        for p in 0..3u64 {
            r.insert(p, Insert::Demand, p as usize);
        }
        // One free slot < min_free 2; every score is 0, so sd = 0, z = 0 <= t = 0: the whole
        // scanned head (all three pages) goes to the free list.
        assert_eq!(r.stats().proactive_runs, 1);
        assert_eq!(r.free_list_len(), 3);
        assert!((0..3).all(|p| !r.is_mapped(p)));
    }

    #[test]
    fn survivors_stay_at_the_head_unless_rotated() {
        for rotate in [false, true] {
            let mut r = RackMem::new(
                8,
                Visibility::Oracle,
                RackMemConfig {
                    rotate_survivors: rotate,
                    ..small()
                },
            );
            for p in 0..4u64 {
                r.insert(p, Insert::Demand, p as usize);
            }
            // Aged: 0..4 score 128. Pages 4, 5 arrive with score 0.
            r.insert(4, Insert::Demand, 4);
            r.insert(5, Insert::Demand, 5);
            r.insert(6, Insert::Demand, 6);
            // The scan of 0..4 kept them all (above the mean); the free list is empty, so the
            // reactive victim is the active-list head: page 0 in place, page 4 after rotation.
            assert_eq!(r.free_list_len(), 0);
            let expect = if rotate { 4 } else { 0 };
            assert_eq!(r.victim(7), Some(expect), "rotate {rotate}");
        }
    }

    #[test]
    fn a_grown_capacity_lifts_the_small_cache_cap_and_keeps_the_pages() {
        let mut r = RackMem::new(800, Visibility::Fault, RackMemConfig::default());
        assert_eq!(r.min_free(), 100, "512 capped at 800 / 8");
        for p in 0..700 {
            r.insert(p, Insert::Demand, p as usize);
        }
        r.set_capacity(80_000);
        assert_eq!(r.min_free(), 512, "the published value, uncapped");
        assert_eq!(r.len(), 700, "what was resident is still tracked");
        let mut seen = std::collections::HashSet::new();
        while let Some(v) = r.victim(1_000) {
            assert!(v < 700 && seen.insert(v), "victim {v}");
        }
        assert_eq!(seen.len(), 700);
    }

    #[test]
    fn min_free_choices() {
        let c = RackMemConfig::with_min_free(10_000, MinFree::Percent(6));
        assert_eq!(RackMem::new(10_000, Visibility::Fault, c).min_free(), 600);
        let c = RackMemConfig::with_min_free(100, MinFree::Pages(64));
        let r = RackMem::new(100, Visibility::Fault, c);
        assert_eq!(r.min_free(), 64, "no small-cache cap when explicit");
        assert_eq!(r.name(), "rackmem:64");
        let d = RackMem::new(100, Visibility::Fault, RackMemConfig::default());
        assert_eq!(d.name(), "rackmem");
    }

    #[test]
    fn prefetched_pages_wait_on_the_free_list() {
        let mut r = RackMem::new(100, Visibility::Fault, RackMemConfig::default());
        assert_eq!(r.min_free(), 12, "512 capped at capacity / 8");
        r.insert(1, Insert::Demand, 0);
        r.insert(2, Insert::Prefetch, 0);
        assert!(!r.is_mapped(2));
        assert_eq!(r.victim(1), Some(2), "unused prefetched pages leave first");
    }

    /// A fingerprint of what RackMem decides on a long pseudo-random trace (page-ins of demand
    /// and prefetched pages, touches, re-faults, removals and victims): every victim, every
    /// answer of `is_mapped` and `score`, and the stats, hashed.
    fn fingerprint() -> u64 {
        let mut r = RackMem::new(
            4096,
            Visibility::Fault,
            RackMemConfig {
                min_free: 64,
                age_period: 0,
                ..RackMemConfig::default()
            },
        );
        let mut rng = gleaner_sys::rng::XorShift64::from_state(0x9e37_79b9_7f4a_7c15);
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        let mix = |h: &mut u64, v: u64| {
            *h ^= v;
            *h = h.wrapping_mul(0x100_0000_01b3);
        };
        for i in 0..200_000usize {
            let x = rng.next_u64();
            // Zipf-like: small page numbers far more often.
            let page = (x % 8192) * (x >> 60) / 16 + (x >> 20) % 64;
            match x % 20 {
                0..=9 => r.insert(page, Insert::Demand, i),
                10 => r.insert(page, Insert::Prefetch, i),
                11..=13 => r.touch(page, Touch::Hit, i),
                14 => r.touch(page, Touch::PrefetchHit, i),
                15 | 16 => r.touch(page, Touch::Refault, i),
                17 => r.remove(page),
                _ => {}
            }
            while r.len() > 4096 {
                let v = r.victim(i).expect("a victim while over capacity");
                mix(&mut h, v);
            }
            mix(&mut h, u64::from(r.is_mapped(page)));
            mix(&mut h, r.score(page).map_or(999, u64::from));
        }
        let s = r.stats();
        assert!(
            s.agings > 1000 && s.proactive_unmapped > 10_000 && s.rescued > 100,
            "{s:?}"
        );
        for v in [
            s.proactive_runs,
            s.proactive_unmapped,
            s.free_list_evictions,
            s.reactive_evictions,
            s.rescued,
            s.agings,
        ] {
            mix(&mut h, v);
        }
        h
    }

    /// Aging became lazy on 2026-11-26 (see the module documentation); the value is what the
    /// eager implementation it replaced gave, so the two decide alike on this trace: the same
    /// victims, second chances, scores and stats.
    #[test]
    fn decisions_on_a_long_trace_are_those_of_the_eager_aging_pass() {
        assert_eq!(fingerprint(), 0x015f_056c_9878_2613);
    }

    impl RackMem {
        /// Checks the histogram against the active pages' current scores, counted one by one.
        fn check_histogram(&self) {
            let mut hist = [[0u64; 256]; 2];
            for m in self.meta.values().filter(|m| m.list == List::Active) {
                let (s, a) = current(m, self.epoch);
                hist[usize::from(a)][usize::from(s)] += 1;
            }
            assert!(hist == *self.hist, "histogram out of step with the pages");
            assert_eq!(hist.iter().flatten().sum::<u64>(), self.n_active as u64);
        }
    }

    /// Lazy aging gives every page the score an eager pass over all pages would, and keeps the
    /// histogram of active scores exact, through inserts, touches, re-faults, removals and
    /// evictions under both visibilities.
    #[test]
    fn lazy_aging_matches_an_eager_pass_over_every_page() {
        for visibility in [Visibility::Fault, Visibility::Oracle] {
            let mut r = RackMem::new(
                300,
                visibility,
                RackMemConfig {
                    min_free: 16,
                    ..RackMemConfig::default()
                },
            );
            // The eager model: page -> (score, accessed).
            let mut model: std::collections::HashMap<u64, (u8, bool)> = Default::default();
            let mut rng = gleaner_sys::rng::XorShift64::from_state(77);
            for i in 0..50_000usize {
                let x = rng.next_u64();
                let page = (x >> 8) % 500;
                let agings = r.stats().agings;
                match x % 8 {
                    0..=2 => {
                        r.insert(page, Insert::Demand, i);
                        model.insert(page, (0, true));
                    }
                    3 => {
                        r.insert(page, Insert::Prefetch, i);
                        model.insert(page, (0, false));
                    }
                    4 | 5 => {
                        let how = [Touch::Hit, Touch::PrefetchHit, Touch::Refault][i % 3];
                        r.touch(page, how, i);
                        if let Some(e) = model.get_mut(&page) {
                            e.1 = true;
                        }
                    }
                    6 => {
                        r.remove(page);
                        model.remove(&page);
                    }
                    _ => {
                        while r.len() > 298 {
                            let v = r.victim(i).expect("a victim");
                            model.remove(&v).expect("the victim was resident");
                        }
                    }
                }
                for _ in agings..r.stats().agings {
                    for e in model.values_mut() {
                        *e = ((e.0 >> 1) | (u8::from(e.1) << 7), false);
                    }
                }
                assert_eq!(r.len(), model.len());
                for (&p, &(score, _)) in &model {
                    assert_eq!(r.score(p), Some(score), "page {p} at step {i}");
                }
                r.check_histogram();
            }
            assert!(
                r.stats().agings > 1000 && r.stats().proactive_unmapped > 0,
                "{:?}",
                r.stats()
            );
        }
    }
}
