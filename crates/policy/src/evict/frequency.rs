//! Queues by how often a page is used (Multi-Queue: Zhou, Philbin and Li, "The Multi-Queue
//! Replacement Algorithm for Second Level Buffer Caches", USENIX ATC 2001), over the access
//! scan's reference bits, with the uses of evicted pages remembered.
//!
//! A resident page has a count of the periods it was seen used and sits on one of
//! [`LEVELS`] queues by that count's logarithm (1 use: level 0; 2-3: 1; 4-7: 2; 8 or more: 3).
//! A use is counted when it is reported, and the page moves to the young end of the level its
//! count earns (as MQ moves a block on every access). The victim is the oldest page of the
//! lowest non-empty level. A page that goes unused for a *lifetime* ([`Frequency::lifetime`]
//! evictions: by default one turnover of the budget) drops one level, so a page used often long
//! ago does not hold its place for ever. An evicted page leaves a ghost holding its count; a page
//! that faults back while its ghost lasts ([`Frequency::ghost_distance`] evictions) comes back
//! with its count plus the fault's use, on the level it had earned. That is MQ's history buffer
//! (`Qout`), and what a pair of lists lacks: under a skewed key popularity (memcached's Zipf
//! GETs) a page faulted back for the fifth time is not the equal of one faulted in for the
//! first. A prefetched page not used yet is the first victim, as under recency (oldest first;
//! keeping it among the pages used once made the batch programs bring in up to 1.7x the
//! pages); its first use counts as a fault's would (with the count its ghost held, if any).
//!
//! # What this order sees
//!
//! Built for [`Visibility::Fault`] with the engine's access scan, as
//! [`super::ActiveInactive`] is: a [`Touch::Scanned`] report (or a write-protect fault on a
//! resident page, [`Touch::Refault`]) is a period in which the page was used. Reports before
//! the page's first look count as one, and that one as the fault's own use (the scan reports
//! the write that faulted it in): at its first look such a page is kept one more pass, its
//! count unchanged, as Linux's "look twice". Under [`Visibility::Oracle`] every hit counts.
//!
//! # Work per victim
//!
//! A report moves its page once (a new queue entry; the old one is skipped when met). A victim
//! is found by looking at the oldest pages of the lowest level; only a page reported before its
//! first look is kept, once, so one call moves each page at most once. Ageing looks only at
//! each level's oldest pages whose lifetime is over. A call that has moved as many pages as are
//! resident takes the oldest page anyway, counted in [`FrequencyStats::forced`].

use std::collections::VecDeque;

use super::ghosts::Ghosts;
use super::{EvictPolicy, Insert, PageMap, Touch, Visibility};

/// Queues, by the logarithm of a page's uses.
pub const LEVELS: usize = 4;

/// The level a page used `uses` times belongs to.
fn level_of(uses: u32) -> usize {
    ((u32::BITS - 1 - uses.max(1).leading_zeros()) as usize).min(LEVELS - 1)
}

/// A resident page's place and what was seen of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Meta {
    /// The sequence number of its live queue entry.
    seq: u64,
    level: usize,
    /// Periods it was seen used (its fault counts as one; 0 for a prefetched page not used yet).
    uses: u32,
    /// Reported before its first look (perhaps only the fault's own write).
    referenced: bool,
    /// Looked at since its fault (a report before that is the fault's own write).
    looked: bool,
    /// The eviction count past which, unused, it drops a level.
    expires: u64,
}

/// Counts of what the order did, for stats and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrequencyStats {
    /// Uses counted (reports after a page's first look).
    pub counted: u64,
    /// Pages kept at their first look after their fault (the fault's own report).
    pub kept_first_look: u64,
    /// Pages that dropped a level, unused for a lifetime.
    pub aged: u64,
    /// Pages that faulted back while their ghost lasted, with their count restored.
    pub restored: u64,
    /// Victims taken regardless of their references (never, unless the order has a bug).
    pub forced: u64,
}

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct Frequency {
    visibility: Visibility,
    /// Per level, (page, seq) oldest first; stale where `live` disagrees.
    queues: [VecDeque<(u64, u64)>; LEVELS],
    /// Prefetched pages not used yet, (page, seq) oldest first: the first victims.
    unused: VecDeque<(u64, u64)>,
    live: PageMap<Meta>,
    seq: u64,
    /// Evictions so far: the clock lifetimes run on.
    now: u64,
    lifetime: u64,
    /// Recently evicted pages and their counts.
    ghosts: Ghosts,
    stats: FrequencyStats,
}

impl Frequency {
    /// An order for `capacity` resident pages: a page keeps its level for one turnover of the
    /// budget (`capacity` evictions) without a use, and a ghost lasts as long.
    pub fn new(capacity: usize, visibility: Visibility) -> Self {
        Self::with_parameters(visibility, capacity, capacity)
    }

    /// An order whose pages drop a level after `lifetime` evictions unused and whose ghosts
    /// last `ghost_distance` evictions (both at least 1).
    pub fn with_parameters(visibility: Visibility, lifetime: usize, ghost_distance: usize) -> Self {
        Frequency {
            visibility,
            queues: Default::default(),
            unused: VecDeque::new(),
            live: PageMap::default(),
            seq: 0,
            now: 0,
            lifetime: lifetime.max(1) as u64,
            ghosts: Ghosts::new(ghost_distance),
            stats: FrequencyStats::default(),
        }
    }

    /// Evictions a page keeps its level for without a use.
    pub fn lifetime(&self) -> u64 {
        self.lifetime
    }

    /// Evictions an evicted page's count is remembered for.
    pub fn ghost_distance(&self) -> u64 {
        self.ghosts.distance()
    }

    /// Resident pages on each level now.
    pub fn level_lens(&self) -> [usize; LEVELS] {
        let mut lens = [0; LEVELS];
        for m in self.live.values() {
            lens[m.level] += 1;
        }
        lens
    }

    /// What the order did so far.
    pub fn stats(&self) -> FrequencyStats {
        self.stats
    }

    /// Appends `page` to the young end of `level`, with no reference seen and a fresh lifetime.
    fn push(&mut self, page: u64, level: usize, uses: u32, looked: bool) {
        self.seq += 1;
        self.queues[level].push_back((page, self.seq));
        self.live.insert(
            page,
            Meta {
                seq: self.seq,
                level,
                uses,
                referenced: false,
                looked,
                expires: self.now + self.lifetime,
            },
        );
    }

    /// The oldest live entry of `level`, left in place (stale entries before it are dropped).
    fn oldest(&mut self, level: usize) -> Option<(u64, Meta)> {
        while let Some(&(page, seq)) = self.queues[level].front() {
            match self.live.get(&page) {
                Some(m) if m.seq == seq => return Some((page, *m)),
                _ => {
                    self.queues[level].pop_front();
                }
            }
        }
        None
    }

    /// Looks at `page` (the oldest of its level, taken off its queue) for the first time since
    /// its fault: a report before it was the fault's own write, so the page is kept one more
    /// pass, uncounted. Returns false (and leaves it off the queues) if there was none or it
    /// had been looked at before.
    fn first_look(&mut self, page: u64, meta: Meta) -> bool {
        if meta.looked || !meta.referenced {
            return false;
        }
        self.stats.kept_first_look += 1;
        self.push(page, meta.level, meta.uses, true);
        true
    }

    /// Moves the upper levels' pages whose lifetime is over (unused since they last moved) a
    /// level down.
    fn age(&mut self) {
        for level in 1..LEVELS {
            while let Some((page, meta)) = self.oldest(level) {
                if meta.expires > self.now {
                    break;
                }
                self.queues[level].pop_front();
                self.stats.aged += 1;
                self.push(page, level - 1, meta.uses, meta.looked);
                if let Some(m) = self.live.get_mut(&page) {
                    m.referenced = meta.referenced;
                }
            }
        }
    }

    fn compact(&mut self) {
        let queued = self.queues.iter().map(VecDeque::len).sum::<usize>() + self.unused.len();
        if queued > 2 * self.live.len() + 64 {
            let live = &self.live;
            for q in self
                .queues
                .iter_mut()
                .chain(std::iter::once(&mut self.unused))
            {
                q.retain(|&(p, s)| live.get(&p).is_some_and(|m| m.seq == s));
            }
        }
    }
}

impl EvictPolicy for Frequency {
    fn name(&self) -> String {
        "frequency".into()
    }

    fn visibility(&self) -> Visibility {
        self.visibility
    }

    fn insert(&mut self, page: u64, how: Insert, _at: usize) {
        let before = self.ghosts.take_recent_kept(page);
        if before.is_some() {
            self.stats.restored += 1;
        }
        match how {
            // A demand fault is a use: the count it left with, plus this one.
            Insert::Demand => {
                let uses = before.map_or(1, |b| b.saturating_add(1));
                self.push(page, level_of(uses), uses, false);
            }
            // A prefetched page is not used yet: it waits on the unused queue (the first
            // victims) with the count it left with (0 if none), and earns its level at its
            // first use.
            Insert::Prefetch => {
                self.push(page, 0, before.unwrap_or(0), false);
                // Its entry on the lowest level is replaced by one on the unused queue.
                self.queues[0].pop_back();
                self.unused.push_back((page, self.seq));
            }
        }
    }

    fn touch(&mut self, page: u64, how: Touch, _at: usize) {
        if how == Touch::PrefetchHit {
            // The first use of a prefetched page is its instantiating access, as a demand
            // fault's is: one use, on the level the count then earns.
            if let Some(m) = self.live.get(&page) {
                let (uses, looked) = (m.uses.saturating_add(1), m.looked);
                self.push(page, level_of(uses), uses, looked);
            }
            return;
        }
        let counts = match how {
            Touch::Scanned | Touch::Refault => true,
            Touch::Hit => self.visibility == Visibility::Oracle,
            Touch::PrefetchHit => false,
        };
        if !counts {
            return;
        }
        let Some(m) = self.live.get_mut(&page) else {
            return;
        };
        if !m.looked {
            // Before its first look a report may be the fault's own write: the look decides.
            m.referenced = true;
            return;
        }
        // A period it was used in: counted now, and it moves to the young end of the level
        // its count earns (MQ moves a block on every access).
        self.stats.counted += 1;
        let (level, uses) = (m.level, m.uses.saturating_add(1));
        self.push(page, level_of(uses).max(level), uses, true);
    }

    fn victim(&mut self, _at: usize) -> Option<u64> {
        // A prefetched page not used yet leaves first, as under recency.
        while let Some((page, seq)) = self.unused.pop_front() {
            if let Some(meta) = self.live.get(&page).copied().filter(|m| m.seq == seq) {
                self.live.remove(&page);
                self.now += 1;
                self.ghosts.left_with(page, meta.uses);
                return Some(page);
            }
        }
        self.age();
        let bound = self.live.len();
        let mut moves = 0;
        loop {
            let level = (0..LEVELS).find(|&l| self.oldest(l).is_some())?;
            let (page, meta) = self.oldest(level).expect("found just now");
            self.queues[level].pop_front();
            if moves < bound && self.first_look(page, meta) {
                moves += 1;
                continue;
            }
            if meta.referenced {
                self.stats.forced += 1;
            }
            self.live.remove(&page);
            self.now += 1;
            self.ghosts.left_with(page, meta.uses);
            return Some(page);
        }
    }

    /// A victim that stayed resident comes back with the count it left with, not as a refault.
    fn reinsert(&mut self, page: u64, _at: usize) {
        let uses = self.ghosts.take_recent_kept(page).unwrap_or(1).max(1);
        self.push(page, level_of(uses), uses, true);
    }

    fn remove(&mut self, page: u64) {
        if self.live.remove(&page).is_some() {
            self.compact();
        }
    }

    fn len(&self) -> usize {
        self.live.len()
    }

    /// The lifetime and the ghosts' distance, as [`Frequency::new`] sizes them.
    fn set_capacity(&mut self, capacity: usize) {
        self.lifetime = capacity.max(1) as u64;
        self.ghosts.set_distance(capacity);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(lifetime: usize, distance: usize) -> Frequency {
        Frequency::with_parameters(Visibility::Fault, lifetime, distance)
    }

    fn victims(p: &mut Frequency, n: usize) -> Vec<u64> {
        (0..n).filter_map(|_| p.victim(0)).collect()
    }

    #[test]
    fn levels_follow_the_logarithm_of_the_uses() {
        let levels: Vec<usize> = [0, 1, 2, 3, 4, 7, 8, 1000].map(level_of).to_vec();
        assert_eq!(levels, vec![0, 0, 1, 1, 2, 2, 3, 3]);
    }

    #[test]
    fn pages_never_seen_used_leave_in_fault_order() {
        let mut p = order(100, 100);
        for page in 1..=4 {
            p.insert(page, Insert::Demand, 0);
        }
        assert_eq!(victims(&mut p, 5), vec![1, 2, 3, 4]);
        assert!(p.is_empty());
    }

    #[test]
    fn the_first_report_after_a_fault_is_the_faults_own_use() {
        let mut p = order(100, 100);
        p.insert(1, Insert::Demand, 0);
        p.insert(2, Insert::Demand, 0);
        p.touch(1, Touch::Scanned, 0);
        // 1 is kept one pass, uncounted: 2 leaves first, then 1 (not seen again).
        assert_eq!(victims(&mut p, 2), vec![2, 1]);
        assert_eq!(p.stats().kept_first_look, 1);
        assert_eq!(p.stats().counted, 0);
    }

    /// Page 1 is seen used in `rounds` periods, each followed by a look at it (it is the
    /// oldest page; a page used once, 100, 101, ..., leaves at each look).
    fn used_in_periods(p: &mut Frequency, rounds: u64) {
        for round in 0..rounds {
            p.insert(100 + round, Insert::Demand, 0);
            p.touch(1, Touch::Scanned, 0);
            assert_eq!(p.victim(0), Some(100 + round), "round {round}");
        }
    }

    #[test]
    fn a_page_used_in_several_periods_outlives_pages_used_once() {
        let mut p = order(1000, 1000);
        p.insert(1, Insert::Demand, 0);
        used_in_periods(&mut p, 3);
        // Kept at its first look, counted at the next two: 3 uses, level 1.
        assert_eq!(p.live[&1].uses, 3);
        assert_eq!(p.level_lens(), [0, 1, 0, 0]);
        assert_eq!(p.stats().kept_first_look, 1);
        assert_eq!(p.stats().counted, 2);
        // A stream of pages used once (several resident at a time): 1 outlives all of them.
        for page in 200..260 {
            p.insert(page, Insert::Demand, 0);
            p.insert(page + 1000, Insert::Demand, 0);
            assert_ne!(p.victim(0), Some(1));
            assert_ne!(p.victim(0), Some(1));
        }
        assert!(p.live.contains_key(&1));
    }

    #[test]
    fn a_page_that_faults_back_gets_its_count_back() {
        let mut p = order(1000, 1000);
        p.insert(1, Insert::Demand, 0);
        used_in_periods(&mut p, 4);
        let uses = p.live[&1].uses;
        assert_eq!(uses, 4);
        assert_eq!(p.victim(0), Some(1));
        p.insert(1, Insert::Demand, 0);
        assert_eq!(p.live[&1].uses, uses + 1);
        assert_eq!(p.live[&1].level, level_of(uses + 1));
        assert_eq!(p.stats().restored, 1);
        // A page that left longer ago than the ghosts last comes back with one use.
        let mut q = order(1000, 1);
        q.insert(1, Insert::Demand, 0);
        used_in_periods(&mut q, 4);
        assert_eq!(q.victim(0), Some(1));
        q.insert(7, Insert::Demand, 0);
        assert_eq!(q.victim(0), Some(7));
        q.insert(8, Insert::Demand, 0);
        assert_eq!(q.victim(0), Some(8));
        q.insert(1, Insert::Demand, 0);
        assert_eq!(q.live[&1].uses, 1);
        assert_eq!(q.stats().restored, 0);
    }

    #[test]
    fn a_page_unused_for_a_lifetime_drops_a_level() {
        let mut p = order(3, 1000);
        p.insert(1, Insert::Demand, 0);
        used_in_periods(&mut p, 3);
        assert_eq!(p.live[&1].level, 1, "{:?}", p.live[&1]);
        // Unused for more than three evictions: down to level 0, and then the victim.
        let mut out = Vec::new();
        for page in 10..16 {
            p.insert(page, Insert::Demand, 0);
            out.push(p.victim(0).unwrap());
        }
        assert!(p.stats().aged >= 1);
        assert!(out.contains(&1), "{out:?}");
        // With a long lifetime it would have stayed.
        let mut q = order(1000, 1000);
        q.insert(1, Insert::Demand, 0);
        used_in_periods(&mut q, 3);
        for page in 10..16 {
            q.insert(page, Insert::Demand, 0);
            assert_ne!(q.victim(0), Some(1));
        }
        assert_eq!(q.stats().aged, 0);
    }

    #[test]
    fn a_handed_back_victim_keeps_its_count_and_is_no_refault() {
        let mut p = order(1000, 1000);
        p.insert(1, Insert::Demand, 0);
        used_in_periods(&mut p, 3);
        let uses = p.live[&1].uses;
        assert_eq!(p.victim(0), Some(1));
        p.reinsert(1, 0);
        assert_eq!(p.live[&1].uses, uses);
        assert_eq!(p.stats().restored, 0);
        // Evicted again and faulted back: a refault of that eviction.
        assert_eq!(p.victim(0), Some(1));
        p.insert(1, Insert::Demand, 0);
        assert_eq!(p.live[&1].uses, uses + 1);
        assert_eq!(p.stats().restored, 1);
    }

    #[test]
    fn a_prefetched_page_earns_its_level_at_its_first_use() {
        let mut p = order(1000, 1000);
        p.insert(1, Insert::Demand, 0);
        used_in_periods(&mut p, 4);
        let uses = p.live[&1].uses;
        assert_eq!(p.victim(0), Some(1));
        // Prefetched back: on the lowest level, with its count, until used.
        p.insert(1, Insert::Prefetch, 0);
        assert_eq!((p.live[&1].level, p.live[&1].uses), (0, uses));
        p.touch(1, Touch::PrefetchHit, 0);
        assert_eq!(p.live[&1].uses, uses + 1);
        assert_eq!(p.live[&1].level, level_of(uses + 1));
        // A page prefetched for the first time has no use until its first.
        p.insert(2, Insert::Prefetch, 0);
        assert_eq!(p.live[&2].uses, 0);
        p.touch(2, Touch::PrefetchHit, 0);
        assert_eq!((p.live[&2].level, p.live[&2].uses), (0, 1));
    }

    #[test]
    fn prefetched_pages_not_used_yet_leave_first() {
        let mut p = order(1000, 1000);
        p.insert(1, Insert::Demand, 0);
        p.insert(2, Insert::Prefetch, 0);
        p.insert(3, Insert::Prefetch, 0);
        p.insert(4, Insert::Demand, 0);
        p.touch(3, Touch::PrefetchHit, 0);
        // 2 is unused: first. 3 was used (after 4's fault), so it is a page used once among the
        // others, in the order of their uses.
        assert_eq!(victims(&mut p, 4), vec![2, 1, 4, 3]);
    }

    #[test]
    fn removed_pages_are_never_victims_and_queues_stay_bounded() {
        let mut p = order(50, 50);
        for round in 0..200u64 {
            for page in 0..20 {
                p.insert(round * 100 + page, Insert::Demand, 0);
                p.touch(round * 100 + page, Touch::Scanned, 0);
            }
            for page in 0..10 {
                p.remove(round * 100 + page);
            }
            for _ in 0..10 {
                let v = p.victim(0).unwrap();
                assert!(v % 100 >= 10, "removed page {v} chosen");
            }
        }
        let queued: usize = p.queues.iter().map(VecDeque::len).sum();
        assert!(queued <= 2 * p.len() + 64, "{queued} {}", p.len());
        assert_eq!(p.stats().forced, 0);
    }

    #[test]
    fn oracle_hits_count_and_fault_visibility_ignores_them() {
        for (vis, kept) in [(Visibility::Oracle, true), (Visibility::Fault, false)] {
            let mut p = Frequency::with_parameters(vis, 100, 100);
            p.insert(1, Insert::Demand, 0);
            p.insert(2, Insert::Demand, 0);
            p.touch(1, Touch::Hit, 0);
            assert_eq!(p.victim(0), Some(if kept { 2 } else { 1 }), "{vis}");
        }
    }
}
