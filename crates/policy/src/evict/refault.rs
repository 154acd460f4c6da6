//! Segmented FIFO with refault promotion: keeping a program's hot pages without accessed bits.
//!
//! FIFO evicts a page the program uses all the time as readily as one it touched once, and user
//! space cannot see the accesses that tell them apart (no accessed bits, see the module
//! documentation of [`super`]). What it does see is a page that *comes back soon after it left*:
//! a demand fault on a page evicted only a few evictions ago. Linux's working-set detection
//! (`mm/workingset.c`) uses the same signal, the *refault distance*, to activate pages; redis's
//! dictionary and object headers refault within milliseconds while its values come back after
//! about a revolution of the whole budget.
//!
//! Pages become resident on a **probation** FIFO, and victims come from its head. An evicted
//! page leaves a *ghost* (its eviction number). A demand fault on a page whose ghost is at most
//! [`Refault::promote_distance`] evictions old puts it on the **protected** FIFO instead, which
//! holds at most [`Refault::protected_max`] pages: beyond that its oldest page is demoted to
//! probation's tail (not evicted), so a page that stopped being used leaves after one more
//! probation pass, and one still in use refaults quickly and is protected again. Ghosts older
//! than the promotion distance are forgotten, so the bookkeeping stays proportional to the
//! budget. Prefetched pages start on probation. Every operation is O(1) amortised.
//!
//! Parameters ([`Refault::new`]): promotion distance a quarter of the capacity, protected at most
//! half of it; not tuned beyond a few trials on redis.

use std::collections::VecDeque;

use super::ghosts::Ghosts;
use super::{EvictPolicy, Insert, PageMap, Touch, Visibility};

/// Which FIFO a resident page is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Segment {
    Probation,
    Protected,
}

/// Segmented FIFO with refault promotion; see the module documentation.
#[derive(Debug, Clone)]
pub struct Refault {
    /// (page, sequence number) on probation; stale where `live` disagrees.
    probation: VecDeque<(u64, u64)>,
    /// (page, sequence number) on protected; stale where `live` disagrees.
    protected: VecDeque<(u64, u64)>,
    /// Resident pages: their sequence number and segment.
    live: PageMap<(u64, Segment)>,
    protected_len: usize,
    seq: u64,
    /// Recently evicted pages, for the refault distance.
    ghosts: Ghosts,
    protected_max: usize,
    promoted: u64,
    demoted: u64,
}

impl Refault {
    /// A policy for a cache of `capacity` pages with the default parameters: promotion within
    /// `capacity / 4` evictions, protected at most `capacity / 2` pages.
    pub fn new(capacity: usize) -> Self {
        Self::with_parameters(capacity / 4, capacity / 2)
    }

    /// A policy that promotes pages refaulting within `promote_distance` evictions and keeps at
    /// most `protected_max` of them protected (both at least 1).
    pub fn with_parameters(promote_distance: usize, protected_max: usize) -> Self {
        Refault {
            probation: VecDeque::new(),
            protected: VecDeque::new(),
            live: PageMap::default(),
            protected_len: 0,
            seq: 0,
            ghosts: Ghosts::new(promote_distance),
            protected_max: protected_max.max(1),
            promoted: 0,
            demoted: 0,
        }
    }

    /// The largest refault distance (in evictions) that earns protection.
    pub fn promote_distance(&self) -> u64 {
        self.ghosts.distance()
    }

    /// The most pages kept on the protected FIFO.
    pub fn protected_max(&self) -> usize {
        self.protected_max
    }

    /// Pages promoted to protected so far (refaults within the distance).
    pub fn promoted(&self) -> u64 {
        self.promoted
    }

    /// Pages demoted from protected back to probation so far.
    pub fn demoted(&self) -> u64 {
        self.demoted
    }

    fn push(&mut self, page: u64, segment: Segment) {
        self.seq += 1;
        let entry = (page, self.seq);
        match segment {
            Segment::Probation => self.probation.push_back(entry),
            Segment::Protected => {
                self.protected.push_back(entry);
                self.protected_len += 1;
            }
        }
        if let Some((_, old)) = self.live.insert(page, (self.seq, segment)) {
            // Inserted twice without leaving (the caller's contract says it cannot happen; a
            // stale queue entry is skipped either way): keep the count right.
            if old == Segment::Protected {
                self.protected_len -= 1;
            }
        }
    }

    /// Pops the oldest live entry of `segment`, forgetting it.
    fn pop_live(&mut self, segment: Segment) -> Option<u64> {
        loop {
            let (page, seq) = match segment {
                Segment::Probation => self.probation.pop_front()?,
                Segment::Protected => self.protected.pop_front()?,
            };
            if self.live.get(&page) == Some(&(seq, segment)) {
                self.live.remove(&page);
                if segment == Segment::Protected {
                    self.protected_len -= 1;
                }
                return Some(page);
            }
        }
    }

    fn compact(&mut self) {
        if self.probation.len() + self.protected.len() > 2 * self.live.len() + 64 {
            let live = &self.live;
            self.probation
                .retain(|(p, s)| live.get(p) == Some(&(*s, Segment::Probation)));
            self.protected
                .retain(|(p, s)| live.get(p) == Some(&(*s, Segment::Protected)));
        }
    }
}

impl EvictPolicy for Refault {
    fn name(&self) -> String {
        "refault".into()
    }

    fn visibility(&self) -> Visibility {
        Visibility::Fault
    }

    fn insert(&mut self, page: u64, how: Insert, _at: usize) {
        let recent = self.ghosts.take_recent(page);
        if how == Insert::Demand && recent {
            self.promoted += 1;
            self.push(page, Segment::Protected);
        } else {
            self.push(page, Segment::Probation);
        }
    }

    fn touch(&mut self, _page: u64, _how: Touch, _at: usize) {}

    fn victim(&mut self, _at: usize) -> Option<u64> {
        while self.protected_len > self.protected_max {
            let Some(page) = self.pop_live(Segment::Protected) else {
                break;
            };
            self.demoted += 1;
            self.push(page, Segment::Probation);
        }
        let page = self
            .pop_live(Segment::Probation)
            .or_else(|| self.pop_live(Segment::Protected))?;
        self.ghosts.left(page);
        Some(page)
    }

    /// Forgets the ghost [`EvictPolicy::victim`] left for `page`: a victim that stayed is no
    /// refault, and comes back as a page just arrived.
    fn reinsert(&mut self, page: u64, at: usize) {
        self.ghosts.forget(page);
        self.insert(page, Insert::Demand, at);
    }

    fn remove(&mut self, page: u64) {
        if let Some((_, segment)) = self.live.remove(&page) {
            if segment == Segment::Protected {
                self.protected_len -= 1;
            }
            self.compact();
        }
    }

    fn len(&self) -> usize {
        self.live.len()
    }

    /// The promotion distance and the protected segment's bound, as [`Refault::new`] sizes them.
    fn set_capacity(&mut self, capacity: usize) {
        self.ghosts.set_distance(capacity / 4);
        self.protected_max = (capacity / 2).max(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn victims(p: &mut Refault, n: usize) -> Vec<u64> {
        (0..n).filter_map(|_| p.victim(0)).collect()
    }

    #[test]
    fn a_grown_capacity_is_sized_as_new_would_size_it() {
        let mut r = Refault::new(400);
        assert_eq!((r.promote_distance(), r.protected_max()), (100, 200));
        r.set_capacity(40_000);
        let fresh = Refault::new(40_000);
        assert_eq!(
            (r.promote_distance(), r.protected_max()),
            (fresh.promote_distance(), fresh.protected_max())
        );
    }

    #[test]
    fn a_victim_that_stays_is_not_promoted() {
        let mut p = Refault::with_parameters(8, 4);
        for page in 1..=3 {
            p.insert(page, Insert::Demand, 0);
        }
        assert_eq!(p.victim(0), Some(1));
        p.reinsert(1, 0);
        assert_eq!(p.promoted(), 0);
        assert_eq!(victims(&mut p, 3), vec![2, 3, 1]);
    }

    #[test]
    fn without_refaults_it_is_fifo() {
        let mut p = Refault::with_parameters(2, 2);
        for page in [7, 3, 9] {
            p.insert(page, Insert::Demand, 0);
        }
        assert_eq!(victims(&mut p, 4), vec![7, 3, 9]);
        assert!(p.is_empty());
        assert_eq!(p.promoted(), 0);
    }

    #[test]
    fn a_quick_refault_is_protected_and_outlives_older_probation_pages() {
        let mut p = Refault::with_parameters(2, 4);
        for page in 1..=4 {
            p.insert(page, Insert::Demand, 0);
        }
        assert_eq!(p.victim(0), Some(1));
        // Page 1 comes back one eviction later: protected.
        p.insert(1, Insert::Demand, 0);
        assert_eq!(p.promoted(), 1);
        p.insert(5, Insert::Demand, 0);
        // Probation (2, 3, 4, 5) goes first, though 1 arrived before 5.
        assert_eq!(victims(&mut p, 4), vec![2, 3, 4, 5]);
        assert_eq!(p.victim(0), Some(1));
    }

    #[test]
    fn a_late_refault_or_a_prefetch_is_not_promoted() {
        let mut p = Refault::with_parameters(1, 4);
        for page in 1..=4 {
            p.insert(page, Insert::Demand, 0);
        }
        assert_eq!(victims(&mut p, 3), vec![1, 2, 3]);
        // Page 1 left three evictions ago (> 1): its ghost is gone.
        p.insert(1, Insert::Demand, 0);
        // Page 3 left one eviction ago, but comes back as a prefetch.
        p.insert(3, Insert::Prefetch, 0);
        assert_eq!(p.promoted(), 0);
        assert_eq!(victims(&mut p, 3), vec![4, 1, 3]);
    }

    #[test]
    fn protected_overflow_is_demoted_to_probation_not_evicted() {
        let mut p = Refault::with_parameters(8, 1);
        for page in [1, 2, 3] {
            p.insert(page, Insert::Demand, 0);
        }
        assert_eq!(victims(&mut p, 2), vec![1, 2]);
        p.insert(1, Insert::Demand, 0);
        p.insert(2, Insert::Demand, 0);
        assert_eq!(p.promoted(), 2);
        // Protected holds one page: 1 is demoted behind 3, and 2 stays protected.
        assert_eq!(victims(&mut p, 3), vec![3, 1, 2]);
        assert_eq!(p.demoted(), 1);
    }

    #[test]
    fn removed_pages_are_never_victims_and_ghosts_stay_bounded() {
        let mut p = Refault::with_parameters(4, 8);
        for page in 0..1000 {
            p.insert(page, Insert::Demand, 0);
        }
        p.remove(0);
        assert_eq!(p.victim(0), Some(1));
        assert_eq!(p.len(), 998);
        for _ in 0..900 {
            p.victim(0);
        }
        let (map, queue) = p.ghosts.held();
        assert!(map <= 5 && queue <= 5);
    }
}
