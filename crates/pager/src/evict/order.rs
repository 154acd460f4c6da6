//! Eviction order, behind a small trait: the engine's own FIFO, and the `gleaner_policy`
//! policies (CLOCK, RackMem) through [`SimPolicy`].
//!
//! A policy only orders candidates. Whether a candidate can really be evicted is decided by the
//! evictor with a compare-and-swap on the page state, so a policy may hand out stale candidates.
//!
//! What the engine can tell a policy about accesses (user space sees faults, not accesses): a
//! page installed for a demand fault or by a prefetch, the first use of a staged prefetched page,
//! and a write to a clean page (its write-protect fault). Reads of mapped pages are invisible.

use std::collections::VecDeque;

use gleaner_policy::evict::{EvictKind, EvictPolicy, Insert, Touch, Visibility};

/// Chooses which resident pages to evict.
pub trait EvictionPolicy: Send {
    /// A page became resident (`prefetched`: installed ahead of demand).
    fn on_install(&mut self, page: usize, prefetched: bool);
    /// The program was seen using resident `page` (a write-protect fault, or the first use of a
    /// prefetched page). Default: ignored.
    fn on_access(&mut self, page: usize) {
        let _ = page;
    }
    /// The access scan saw `pages` written since its last scan (`evict/access.rs`). Default: each is
    /// an access.
    fn on_referenced(&mut self, pages: &[usize]) {
        for &p in pages {
            self.on_access(p);
        }
    }
    /// `page` left for another reason than eviction (discarded). Default: ignored (a stale
    /// candidate is harmless).
    fn on_discard(&mut self, page: usize) {
        let _ = page;
    }
    /// Appends up to `n` candidates to `out`, removing them from the policy's bookkeeping.
    fn pick(&mut self, n: usize, out: &mut Vec<usize>);
    /// A picked candidate could not be evicted now and stays resident.
    fn on_reject(&mut self, page: usize);
    /// A short name for stats.
    fn name(&self) -> String;
    /// The budget grew to `capacity` pages. Default: ignored.
    fn set_capacity(&mut self, capacity: usize) {
        let _ = capacity;
    }
}

/// Builds the policy for `kind` over a budget of `budget` pages. LRU and Belady need every
/// access (or the future) and exist only in the simulator.
pub fn build(kind: EvictKind, budget: usize) -> Result<Box<dyn EvictionPolicy>, String> {
    match kind {
        EvictKind::Fifo => Ok(Box::new(Fifo::default())),
        EvictKind::Clock
        | EvictKind::Refault
        | EvictKind::RackMem(_)
        | EvictKind::Recency(_)
        | EvictKind::Active
        | EvictKind::Frequency => Ok(Box::new(SimPolicy {
            inner: kind
                .build(budget, Visibility::Fault, None)
                .map_err(|e| e.to_string())?,
            clock: 0,
        })),
        EvictKind::Lru | EvictKind::Belady => Err(format!(
            "eviction policy `{kind}` needs every access (or the future) and exists only in \
             the simulator (`gleaner trace replay`); the engine offers fifo, clock, refault, rackmem, recency, active and frequency"
        )),
    }
}

/// A `gleaner_policy` eviction policy driven by what the engine sees.
pub struct SimPolicy {
    inner: Box<dyn EvictPolicy>,
    /// A counter standing in for the simulator's reference index.
    clock: usize,
}

impl SimPolicy {
    fn tick(&mut self) -> usize {
        self.clock += 1;
        self.clock
    }
}

impl EvictionPolicy for SimPolicy {
    fn set_capacity(&mut self, capacity: usize) {
        self.inner.set_capacity(capacity);
    }

    fn on_install(&mut self, page: usize, prefetched: bool) {
        let at = self.tick();
        let how = if prefetched {
            Insert::Prefetch
        } else {
            Insert::Demand
        };
        self.inner.insert(page as u64, how, at);
    }

    fn on_access(&mut self, page: usize) {
        let at = self.tick();
        // A fault on a resident page is what the simulator calls a re-fault under fault
        // visibility: the one access signal user space gets.
        self.inner.touch(page as u64, Touch::Refault, at);
    }

    fn on_referenced(&mut self, pages: &[usize]) {
        let at = self.tick();
        for &p in pages {
            self.inner.touch(p as u64, Touch::Scanned, at);
        }
    }

    fn on_discard(&mut self, page: usize) {
        self.inner.remove(page as u64);
    }

    fn pick(&mut self, n: usize, out: &mut Vec<usize>) {
        let at = self.tick();
        for _ in 0..n {
            match self.inner.victim(at) {
                Some(p) => out.push(p as usize),
                None => break,
            }
        }
    }

    fn on_reject(&mut self, page: usize) {
        let at = self.tick();
        self.inner.reinsert(page as u64, at);
    }

    fn name(&self) -> String {
        self.inner.name()
    }
}

/// First in, first out: pages leave in the order they arrived.
#[derive(Debug, Default)]
pub struct Fifo {
    queue: VecDeque<usize>,
}

impl EvictionPolicy for Fifo {
    fn on_install(&mut self, page: usize, _prefetched: bool) {
        self.queue.push_back(page);
    }

    fn pick(&mut self, n: usize, out: &mut Vec<usize>) {
        let take = n.min(self.queue.len());
        out.extend(self.queue.drain(..take));
    }

    fn on_reject(&mut self, page: usize) {
        self.queue.push_back(page);
    }

    fn name(&self) -> String {
        "fifo".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_order_and_reject_requeues_at_the_back() {
        let mut f = Fifo::default();
        for p in [5, 1, 9] {
            f.on_install(p, false);
        }
        let mut out = Vec::new();
        f.pick(2, &mut out);
        assert_eq!(out, vec![5, 1]);
        f.on_reject(5);
        out.clear();
        f.pick(10, &mut out);
        assert_eq!(out, vec![9, 5]);
    }
}
