//! Active and inactive lists, as Linux orders anonymous memory: reference bits, look twice,
//! and refault activation.
//!
//! Linux keeps two lists of anonymous pages (`mm/vmscan.c`, `mm/workingset.c`): a page enters
//! the *inactive* list; reclaim looks at the inactive list's oldest page and evicts it if its
//! accessed bit is clear, keeps it for one more pass if the bit was set at this first look ("all
//! mapped folios start out with page table references from the instantiating fault, so we need
//! to look twice"), and moves it to the *active* list if the bit is set again at the second
//! look. The active list is
//! bounded (for anonymous memory under 1 GiB, as large as the inactive one): its oldest pages go
//! back to the inactive list, where they must be used again to stay. A page that comes back from
//! swap soon after it left (its *refault distance*, in evictions, within the working set) is
//! activated at once.
//!
//! Two lists give frequency, not only recency: a page used in two separate periods is protected
//! from a stream of pages used once. Under a skewed key popularity (memcached's Zipf GETs) that
//! is the difference that matters: plain recency over the access scan's bits (`recency`) lets
//! every freshly faulted item push out a page that is used less often but more than once.
//!
//! # What this order sees
//!
//! Built for [`Visibility::Fault`] with the engine's access scan: a [`Touch::Scanned`] report is
//! the accessed bit (for the pages the program writes; reads of resident pages stay invisible,
//! as for every order here), remembered per page until its next look. Several reports before one
//! look count as one: a page filled ahead of its first write is reported by the scan after its
//! install and again after the write, and a page written in two periods before the first look
//! may still be a page used once (counting them as two activated most of a written-once stream
//! on a real region). What this cannot tell apart: a page filled ahead whose first look falls
//! between its install's report and its write's is activated though used once. A fault on a
//! resident page ([`Touch::Refault`]: the engine's write-protect fault under synchronous dirty
//! tracking, where no scan runs) is a reference too. Under [`Visibility::Oracle`] every hit
//! counts as well. A refault is recognised from a *ghost*: the eviction number an evicted page
//! left at, kept for [`ActiveInactive::promote_distance`] evictions.
//!
//! # Work per victim
//!
//! A victim is found by looking at the inactive list's oldest pages; a referenced one moves
//! (kept or activated, its bit cleared) and the next is looked at. References arrive only
//! between calls, so one call moves each page at most once before it finds one with none: at
//! most the resident pages, and amortised one move per reference reported (a report is paid
//! for once, by the move that clears it). A call that has moved as many pages as are resident
//! (which the argument says cannot happen) takes the oldest inactive page anyway, counted in
//! [`ActiveInactiveStats::forced`], so a logic error costs a worse victim, never a hang.
//!
//! An earlier bound of a few hundred moves per call evicted a *referenced* page whenever a
//! scan had reported most of the inactive list (a stream of pages written once, each
//! reported once), and so pushed out the hot pages it was meant to keep.

use std::collections::VecDeque;

use super::ghosts::Ghosts;
use super::{EvictPolicy, Insert, PageMap, Touch, Visibility};

/// Which list a resident page is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum List {
    Inactive,
    Active,
}

/// A resident page's place and what was seen of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Meta {
    /// The sequence number of its live queue entry.
    seq: u64,
    list: List,
    /// Seen used since it last moved.
    referenced: bool,
    /// Kept once on the inactive list for a single reference (Linux's `PG_referenced`): a
    /// reference seen at its next inspection activates it.
    kept: bool,
}

/// Counts of what the order did, for stats and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ActiveInactiveStats {
    /// Pages activated because they came back within the refault distance.
    pub activated_on_refault: u64,
    /// Pages activated because they were seen used twice on the inactive list.
    pub activated_on_reference: u64,
    /// Inactive pages kept for one more pass (seen used once).
    pub kept: u64,
    /// Active pages moved back to the inactive list (the active list was over its bound).
    pub deactivated: u64,
    /// Victims taken regardless of their references (a call moved every resident page: never,
    /// unless the order has a bug).
    pub forced: u64,
}

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct ActiveInactive {
    visibility: Visibility,
    /// (page, seq), oldest first; stale where `live` disagrees.
    inactive: VecDeque<(u64, u64)>,
    /// (page, seq), oldest first; stale where `live` disagrees.
    active: VecDeque<(u64, u64)>,
    live: PageMap<Meta>,
    active_len: usize,
    active_max: usize,
    seq: u64,
    /// Recently evicted pages, for the refault distance.
    ghosts: Ghosts,
    stats: ActiveInactiveStats,
}

impl ActiveInactive {
    /// An order for `capacity` resident pages, sized as Linux sizes anonymous lists under 1 GiB:
    /// the active list at most half of the pages, and a refault activated when the page left
    /// within the last half-capacity evictions (the active list's size, Linux's working-set
    /// test).
    pub fn new(capacity: usize, visibility: Visibility) -> Self {
        Self::with_parameters(visibility, capacity / 2, capacity / 2)
    }

    /// An order whose active list holds at most `active_max` pages and whose refaults within
    /// `promote_distance` evictions are activated (both at least 1).
    pub fn with_parameters(
        visibility: Visibility,
        active_max: usize,
        promote_distance: usize,
    ) -> Self {
        ActiveInactive {
            visibility,
            inactive: VecDeque::new(),
            active: VecDeque::new(),
            live: PageMap::default(),
            active_len: 0,
            active_max: active_max.max(1),
            seq: 0,
            ghosts: Ghosts::new(promote_distance),
            stats: ActiveInactiveStats::default(),
        }
    }

    /// The most pages on the active list.
    pub fn active_max(&self) -> usize {
        self.active_max
    }

    /// The largest refault distance, in evictions, that activates a page.
    pub fn promote_distance(&self) -> u64 {
        self.ghosts.distance()
    }

    /// Pages on the active list now.
    pub fn active_len(&self) -> usize {
        self.active_len
    }

    /// What the order did so far.
    pub fn stats(&self) -> ActiveInactiveStats {
        self.stats
    }

    /// Appends `page` to the young end of `list`, with no references seen.
    fn push(&mut self, page: u64, list: List, kept: bool) {
        self.seq += 1;
        let entry = (page, self.seq);
        match list {
            List::Inactive => self.inactive.push_back(entry),
            List::Active => {
                self.active.push_back(entry);
                self.active_len += 1;
            }
        }
        let meta = Meta {
            seq: self.seq,
            list,
            referenced: false,
            kept,
        };
        if let Some(old) = self.live.insert(page, meta) {
            // Inserted twice without leaving (the caller's contract says it cannot happen; the
            // stale queue entry is skipped either way): keep the count right.
            if old.list == List::Active {
                self.active_len -= 1;
            }
        }
    }

    /// Takes the oldest live entry of `list` off its queue (and out of `live`).
    fn pop_oldest(&mut self, list: List) -> Option<(u64, Meta)> {
        loop {
            let (page, seq) = match list {
                List::Inactive => self.inactive.pop_front()?,
                List::Active => self.active.pop_front()?,
            };
            match self.live.get(&page) {
                Some(m) if m.seq == seq && m.list == list => {
                    let meta = *m;
                    self.live.remove(&page);
                    if list == List::Active {
                        self.active_len -= 1;
                    }
                    return Some((page, meta));
                }
                _ => {}
            }
        }
    }

    /// Moves the active list's oldest pages to the inactive list until it is within its bound.
    fn balance(&mut self) {
        while self.active_len > self.active_max {
            let Some((page, _)) = self.pop_oldest(List::Active) else {
                break;
            };
            self.stats.deactivated += 1;
            self.push(page, List::Inactive, false);
        }
    }

    fn compact(&mut self) {
        if self.inactive.len() + self.active.len() > 2 * self.live.len() + 64 {
            let live = &self.live;
            let fresh = |list: List| {
                move |&(p, s): &(u64, u64)| {
                    live.get(&p).is_some_and(|m| m.seq == s && m.list == list)
                }
            };
            self.inactive.retain(fresh(List::Inactive));
            self.active.retain(fresh(List::Active));
        }
    }
}

impl EvictPolicy for ActiveInactive {
    fn name(&self) -> String {
        "active".into()
    }

    fn visibility(&self) -> Visibility {
        self.visibility
    }

    fn insert(&mut self, page: u64, how: Insert, _at: usize) {
        if how == Insert::Demand && self.ghosts.take_recent(page) {
            self.stats.activated_on_refault += 1;
            self.push(page, List::Active, false);
            self.balance();
        } else {
            self.push(page, List::Inactive, false);
        }
    }

    fn touch(&mut self, page: u64, how: Touch, _at: usize) {
        let counts = match how {
            // A scan's report; a fault on a resident page (the engine delivers a write to a
            // clean page under synchronous dirty tracking, where no scan runs, this way).
            Touch::Scanned | Touch::Refault => true,
            Touch::Hit => self.visibility == Visibility::Oracle,
            // The first use of a prefetched page is its instantiating access, as a demand
            // fault's is: not counted.
            Touch::PrefetchHit => false,
        };
        if counts {
            if let Some(m) = self.live.get_mut(&page) {
                m.referenced = true;
            }
        }
    }

    fn victim(&mut self, _at: usize) -> Option<u64> {
        self.balance();
        let mut moves = 0;
        let bound = self.live.len();
        loop {
            let Some((page, meta)) = self.pop_oldest(List::Inactive) else {
                // Nothing inactive: the oldest active page leaves.
                let (page, _) = self.pop_oldest(List::Active)?;
                self.ghosts.left(page);
                return Some(page);
            };
            if !meta.referenced || moves >= bound {
                if meta.referenced {
                    self.stats.forced += 1;
                }
                self.ghosts.left(page);
                return Some(page);
            }
            moves += 1;
            if meta.kept {
                self.stats.activated_on_reference += 1;
                self.push(page, List::Active, false);
                self.balance();
            } else {
                self.stats.kept += 1;
                self.push(page, List::Inactive, true);
            }
        }
    }

    /// Forgets the ghost [`EvictPolicy::victim`] left for `page`: a victim that stayed is no
    /// refault, and comes back as a page just arrived.
    fn reinsert(&mut self, page: u64, at: usize) {
        self.ghosts.forget(page);
        self.insert(page, Insert::Demand, at);
    }

    fn remove(&mut self, page: u64) {
        if let Some(m) = self.live.remove(&page) {
            if m.list == List::Active {
                self.active_len -= 1;
            }
            self.compact();
        }
    }

    fn len(&self) -> usize {
        self.live.len()
    }

    /// The active list's bound and the refault distance, as [`ActiveInactive::new`] sizes them.
    fn set_capacity(&mut self, capacity: usize) {
        self.active_max = (capacity / 2).max(1);
        self.ghosts.set_distance(capacity / 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(active_max: usize, distance: usize) -> ActiveInactive {
        ActiveInactive::with_parameters(Visibility::Fault, active_max, distance)
    }

    fn victims(p: &mut ActiveInactive, n: usize) -> Vec<u64> {
        (0..n).filter_map(|_| p.victim(0)).collect()
    }

    fn scanned(p: &mut ActiveInactive, pages: &[u64]) {
        for &page in pages {
            p.touch(page, Touch::Scanned, 0);
        }
    }

    #[test]
    fn without_references_or_refaults_it_is_fifo() {
        let mut p = order(2, 2);
        for page in [7, 3, 9] {
            p.insert(page, Insert::Demand, 0);
        }
        assert_eq!(victims(&mut p, 4), vec![7, 3, 9]);
        assert!(p.is_empty());
        assert_eq!(p.stats(), ActiveInactiveStats::default());
    }

    #[test]
    fn a_page_seen_once_is_kept_one_pass_and_then_leaves_if_unused() {
        let mut p = order(4, 1);
        for page in 1..=3 {
            p.insert(page, Insert::Demand, 0);
        }
        // Page 1 reported written once (its instantiating write, say): look twice.
        scanned(&mut p, &[1]);
        assert_eq!(p.victim(0), Some(2));
        assert_eq!(p.stats().kept, 1);
        // Not seen again: it goes after 3, as the oldest inactive page once more.
        assert_eq!(victims(&mut p, 2), vec![3, 1]);
        assert_eq!(p.stats().activated_on_reference, 0);
    }

    #[test]
    fn a_page_seen_in_two_passes_is_activated_and_outlives_newer_pages() {
        let mut p = order(4, 1);
        for page in 1..=3 {
            p.insert(page, Insert::Demand, 0);
        }
        scanned(&mut p, &[1]);
        assert_eq!(p.victim(0), Some(2)); // 1 kept
        scanned(&mut p, &[1]);
        p.insert(4, Insert::Demand, 0);
        p.insert(5, Insert::Demand, 0);
        // 3 leaves; 1 is looked at again, seen used: activated; then 4 and 5 leave before it.
        assert_eq!(victims(&mut p, 3), vec![3, 4, 5]);
        assert_eq!(p.stats().activated_on_reference, 1);
        assert_eq!(p.active_len(), 1);
        assert_eq!(p.victim(0), Some(1));
    }

    #[test]
    fn reports_before_the_first_look_earn_one_more_pass_not_activation() {
        // A page installed and written, then written again in the next scan period (a page
        // filled ahead of its first write is reported written by the scan after its install):
        // both reports precede its first look, which only keeps it. Linux activates on the
        // second look too, whatever the bit held at the first.
        let mut p = order(4, 1);
        p.insert(1, Insert::Demand, 0);
        p.insert(2, Insert::Demand, 0);
        scanned(&mut p, &[1]);
        scanned(&mut p, &[1]);
        assert_eq!(p.victim(0), Some(2));
        assert_eq!(p.stats().kept, 1);
        assert_eq!(p.stats().activated_on_reference, 0);
        assert_eq!(p.victim(0), Some(1));
    }

    #[test]
    fn a_quick_refault_is_activated_and_a_late_one_or_a_prefetch_is_not() {
        let mut p = order(4, 1);
        for page in 1..=4 {
            p.insert(page, Insert::Demand, 0);
        }
        assert_eq!(victims(&mut p, 3), vec![1, 2, 3]);
        // 3 left as the last eviction: activated. 1 left two evictions before (> 1): its ghost is
        // gone. 2 is within the distance but comes back as a prefetch: inactive.
        p.insert(3, Insert::Demand, 0);
        p.insert(1, Insert::Demand, 0);
        p.insert(2, Insert::Prefetch, 0);
        assert_eq!(p.stats().activated_on_refault, 1);
        assert_eq!(victims(&mut p, 4), vec![4, 1, 2, 3]);
    }

    #[test]
    fn the_active_list_stays_within_its_bound_and_its_oldest_must_be_used_again() {
        let mut p = order(1, 8);
        for page in [1, 2, 3] {
            p.insert(page, Insert::Demand, 0);
        }
        assert_eq!(victims(&mut p, 2), vec![1, 2]);
        p.insert(1, Insert::Demand, 0);
        p.insert(2, Insert::Demand, 0);
        assert_eq!(p.stats().activated_on_refault, 2);
        // Active holds one page: 1 went back to the inactive list behind 3, unreferenced.
        assert_eq!(p.active_len(), 1);
        assert_eq!(p.stats().deactivated, 1);
        assert_eq!(victims(&mut p, 3), vec![3, 1, 2]);
    }

    #[test]
    fn a_list_referenced_throughout_is_walked_not_evicted_at_random() {
        // Every inactive page reported once (a stream written once) except one hot page
        // activated earlier: the walk keeps each once and then evicts the oldest, unreferenced
        // now; no referenced page is taken for a victim.
        let n = 2000u64;
        let mut p = order(n as usize, 1);
        for page in 0..n {
            p.insert(page, Insert::Demand, 0);
        }
        let all: Vec<u64> = (0..n).collect();
        scanned(&mut p, &all);
        assert_eq!(p.victim(0), Some(0));
        assert_eq!(p.stats().kept, n);
        assert_eq!(p.stats().forced, 0);
        assert_eq!(p.len() as u64, n - 1);
    }

    #[test]
    fn a_fault_on_a_resident_page_is_a_reference_and_a_prefetch_hit_is_not() {
        let mut p = order(4, 1);
        for page in 1..=3 {
            p.insert(page, Insert::Demand, 0);
        }
        p.touch(1, Touch::Refault, 0);
        p.touch(2, Touch::PrefetchHit, 0);
        // 1 is kept a pass; 2 was not seen used.
        assert_eq!(p.victim(0), Some(2));
        assert_eq!(p.stats().kept, 1);
    }

    #[test]
    fn oracle_hits_count_only_under_oracle_visibility() {
        for (vis, first) in [(Visibility::Fault, 1), (Visibility::Oracle, 2)] {
            let mut p = ActiveInactive::with_parameters(vis, 4, 1);
            p.insert(1, Insert::Demand, 0);
            p.insert(2, Insert::Demand, 0);
            p.touch(1, Touch::Hit, 0);
            assert_eq!(p.victim(0), Some(first), "{vis}");
        }
    }

    #[test]
    fn removed_pages_are_never_victims_and_ghosts_stay_bounded() {
        let mut p = order(500, 4);
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

    #[test]
    fn a_victim_that_stays_is_no_refault() {
        let mut p = order(4, 8);
        for page in 1..=3 {
            p.insert(page, Insert::Demand, 0);
        }
        // The evictor finds 1 busy and hands it back: inactive again, behind 3, not activated.
        assert_eq!(p.victim(0), Some(1));
        p.reinsert(1, 0);
        assert_eq!(p.stats().activated_on_refault, 0);
        assert_eq!(victims(&mut p, 3), vec![2, 3, 1]);
        // A real refault still counts: 2 left and comes back.
        p.insert(2, Insert::Demand, 0);
        assert_eq!(p.stats().activated_on_refault, 1);
    }

    #[test]
    fn a_grown_capacity_is_sized_as_new_would_size_it() {
        let mut p = ActiveInactive::new(400, Visibility::Fault);
        assert_eq!((p.active_max(), p.promote_distance()), (200, 200));
        p.set_capacity(40_000);
        assert_eq!((p.active_max(), p.promote_distance()), (20_000, 20_000));
    }

    #[test]
    fn hot_pages_reported_every_pass_stay_while_a_stream_reported_once_passes() {
        // A cache of 1024 pages; each round 128 hot pages are used and 900 new pages arrive;
        // a scan after the hot pages' use reports them and the previous round's new pages
        // (each written once, at its arrival). Look twice: the stream is kept one pass and
        // leaves, the hot pages are activated and never fault again.
        let capacity = 1024;
        let mut p = ActiveInactive::new(capacity, Visibility::Fault);
        let mut resident = std::collections::HashSet::new();
        let make_room = |p: &mut ActiveInactive, resident: &mut std::collections::HashSet<u64>| {
            while resident.len() >= capacity {
                let v = p.victim(0).expect("a full cache has a victim");
                assert!(resident.remove(&v), "victim {v} was not resident");
            }
        };
        let (mut next, mut hot_faults, mut last_stream) = (1_000u64, 0, Vec::new());
        for round in 0..60 {
            for h in 0..128u64 {
                if !resident.contains(&h) {
                    hot_faults += u64::from(round >= 3);
                    make_room(&mut p, &mut resident);
                    p.insert(h, Insert::Demand, 0);
                    resident.insert(h);
                }
            }
            scanned(&mut p, &(0..128).collect::<Vec<u64>>());
            scanned(&mut p, &last_stream);
            last_stream.clear();
            for _ in 0..900 {
                make_room(&mut p, &mut resident);
                p.insert(next, Insert::Demand, 0);
                resident.insert(next);
                last_stream.push(next);
                next += 1;
            }
        }
        assert_eq!(hot_faults, 0, "{:?}", p.stats());
        assert_eq!(p.stats().activated_on_reference, 128);
        assert_eq!(p.active_len(), 128);
        assert_eq!(p.stats().forced, 0);
    }
}
