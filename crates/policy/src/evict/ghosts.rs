//! Ghosts of evicted pages: when each left, counted in evictions, so that a page that faults
//! back soon after leaving is recognised (its *refault distance*, as Linux's
//! `mm/workingset.c` measures it), with a number the order keeps for it (how often
//! [`super::Frequency`] had seen it used). Shared by the orders that act on refaults
//! ([`super::Refault`], [`super::ActiveInactive`], [`super::Frequency`]).

use std::collections::VecDeque;

use super::PageMap;

/// Recently evicted pages and the eviction number each left at, kept for at most
/// [`Ghosts::distance`] evictions, so the bookkeeping stays proportional to the distance.
#[derive(Debug, Clone)]
pub(crate) struct Ghosts {
    /// Evictions so far: the clock refault distances are measured in.
    evictions: u64,
    /// Evicted pages, the eviction number they left at and the number kept for them (recent
    /// ones only).
    at: PageMap<(u64, u32)>,
    /// Ghosts in eviction order, to forget those older than the distance.
    queue: VecDeque<(u64, u64)>,
    distance: u64,
}

impl Ghosts {
    /// Ghosts kept for `distance` evictions (at least 1).
    pub(crate) fn new(distance: usize) -> Ghosts {
        Ghosts {
            evictions: 0,
            at: PageMap::default(),
            queue: VecDeque::new(),
            distance: distance.max(1) as u64,
        }
    }

    /// The largest refault distance, in evictions, that counts as recent.
    pub(crate) fn distance(&self) -> u64 {
        self.distance
    }

    /// Sets the distance (at least 1); ghosts older than it are forgotten at the next eviction.
    pub(crate) fn set_distance(&mut self, distance: usize) {
        self.distance = distance.max(1) as u64;
    }

    /// `page` is evicted now.
    pub(crate) fn left(&mut self, page: u64) {
        self.left_with(page, 0);
    }

    /// `page` is evicted now; `kept` comes back with it from [`Ghosts::take_recent_kept`].
    pub(crate) fn left_with(&mut self, page: u64, kept: u32) {
        self.evictions += 1;
        self.at.insert(page, (self.evictions, kept));
        self.queue.push_back((page, self.evictions));
        while let Some(&(p, at)) = self.queue.front() {
            if at + self.distance >= self.evictions {
                break;
            }
            self.queue.pop_front();
            if self.at.get(&p).is_some_and(|&(left, _)| left == at) {
                self.at.remove(&p);
            }
        }
    }

    /// Whether `page`, coming back now, left within the distance; its ghost is forgotten
    /// either way.
    pub(crate) fn take_recent(&mut self, page: u64) -> bool {
        self.take_recent_kept(page).is_some()
    }

    /// The number `page` left with, if it left within the distance; its ghost is forgotten
    /// either way.
    pub(crate) fn take_recent_kept(&mut self, page: u64) -> Option<u32> {
        self.at
            .remove(&page)
            .filter(|&(at, _)| self.evictions - at <= self.distance)
            .map(|(_, kept)| kept)
    }

    /// Forgets `page`'s ghost: it did not leave after all (a victim that stayed resident).
    pub(crate) fn forget(&mut self, page: u64) {
        self.at.remove(&page);
    }

    /// Ghosts held (map entries, queue entries): both bounded by the distance plus one.
    #[cfg(test)]
    pub(crate) fn held(&self) -> (usize, usize) {
        (self.at.len(), self.queue.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_is_recent_within_the_distance_and_forgotten_after_it() {
        let mut g = Ghosts::new(2);
        for page in 1..=3 {
            g.left(page);
        }
        // 3 left last, 2 one eviction before, 1 two before: all within 2.
        assert!(g.take_recent(1));
        assert!(!g.take_recent(1), "taken once");
        g.left(4);
        g.left(5);
        // 2 left three evictions ago now (more than 2): gone.
        assert!(!g.take_recent(2));
        assert!(g.take_recent(3));
        assert!(!g.take_recent(99), "never evicted");
        let (map, queue) = g.held();
        assert!(map <= 3 && queue <= 3, "{map} {queue}");
    }

    #[test]
    fn a_recent_ghost_gives_back_the_number_it_left_with() {
        let mut g = Ghosts::new(2);
        g.left_with(7, 5);
        g.left_with(8, 2);
        assert_eq!(g.take_recent_kept(7), Some(5));
        assert_eq!(g.take_recent_kept(7), None, "taken once");
        g.left(9);
        g.left(10);
        g.left(11);
        // 8 left three evictions ago: gone, whatever it was kept with.
        assert_eq!(g.take_recent_kept(8), None);
        assert_eq!(g.take_recent_kept(10), Some(0));
    }
}
