//! Eviction order, behind a small trait so later policies (CLOCK, RackMem, Hermit's) slot in.
//!
//! A policy only orders candidates. Whether a candidate can really be evicted is decided by the
//! evictor with a compare-and-swap on the page state, so a policy may hand out stale candidates.

use std::collections::VecDeque;

/// Chooses which resident pages to evict.
pub trait EvictionPolicy: Send {
    /// A page became resident.
    fn on_install(&mut self, page: usize);
    /// Appends up to `n` candidates to `out`, removing them from the policy's bookkeeping.
    fn pick(&mut self, n: usize, out: &mut Vec<usize>);
    /// A picked candidate could not be evicted now and stays resident.
    fn on_reject(&mut self, page: usize);
    /// A short name for stats.
    fn name(&self) -> &'static str;
}

/// First in, first out: pages leave in the order they arrived.
#[derive(Debug, Default)]
pub struct Fifo {
    queue: VecDeque<usize>,
}

impl EvictionPolicy for Fifo {
    fn on_install(&mut self, page: usize) {
        self.queue.push_back(page);
    }

    fn pick(&mut self, n: usize, out: &mut Vec<usize>) {
        let take = n.min(self.queue.len());
        out.extend(self.queue.drain(..take));
    }

    fn on_reject(&mut self, page: usize) {
        self.queue.push_back(page);
    }

    fn name(&self) -> &'static str {
        "fifo"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_order_and_reject_requeues_at_the_back() {
        let mut f = Fifo::default();
        for p in [5, 1, 9] {
            f.on_install(p);
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
