//! Stride prefetcher (Leap's "Stride" baseline, Linux's swap readahead): a stride is the delta the
//! last two faults of a thread agree on; its depth follows the prefetcher's past accuracy.
//!
//! Per thread: the last fault page and delta. When the current delta is nonzero and equals the
//! previous one, the stride is confirmed and the pages `P + i·stride` up to `depth` strides ahead
//! are candidates; those already issued along the same stride (tracked as the furthest page
//! issued) are not repeated, so the prefetcher keeps `depth` strides ahead without re-counting.
//!
//! Depth is `ceil(max_depth × accuracy)`, at least 1, where accuracy is the ratio of prefetch hits
//! to pages issued, both decayed (halved every 64 issued pages) and starting at 1/2. The
//! prefetcher cannot see which of its candidates the caller dropped as already resident, so it
//! counts every candidate it emitted as issued.

use std::collections::HashMap;

use super::{delta, walk, Fault, Prefetcher};

#[derive(Debug, Clone, Default)]
struct ThreadState {
    last: Option<u64>,
    last_delta: Option<i64>,
    /// Furthest page issued along `stride`.
    ahead: Option<(u64, i64)>,
}

/// Stride prefetcher; see the module documentation.
#[derive(Debug, Clone)]
pub struct Stride {
    max_depth: usize,
    threads: HashMap<u32, ThreadState>,
    issued: f64,
    hits: f64,
}

/// The most thread states kept; beyond it the table is cleared (threads re-learn in two faults).
const MAX_THREADS: usize = 1024;

impl Stride {
    /// A stride prefetcher going at most `max_depth` strides ahead (at least 1).
    pub fn new(max_depth: usize) -> Self {
        Stride {
            max_depth: max_depth.max(1),
            threads: HashMap::new(),
            issued: 2.0,
            hits: 1.0,
        }
    }

    /// The current depth: `ceil(max_depth × accuracy)`, at least 1.
    pub fn depth(&self) -> usize {
        let acc = (self.hits / self.issued).clamp(0.0, 1.0);
        ((self.max_depth as f64 * acc).ceil() as usize).clamp(1, self.max_depth)
    }

    fn count_hit(&mut self) {
        self.hits += 1.0;
    }
}

impl Prefetcher for Stride {
    fn name(&self) -> String {
        "stride".into()
    }

    fn on_fault(&mut self, fault: Fault, out: &mut Vec<u64>) {
        if fault.prefetch_hit {
            self.count_hit();
        }
        let depth = self.depth() as u64;
        if self.threads.len() >= MAX_THREADS && !self.threads.contains_key(&fault.tid) {
            self.threads.clear();
        }
        let t = self.threads.entry(fault.tid).or_default();
        let d = t.last.map(|p| delta(p, fault.page));
        t.last = Some(fault.page);
        let confirmed = match (d, t.last_delta) {
            (Some(d), Some(prev)) if d == prev && d != 0 => Some(d),
            _ => None,
        };
        t.last_delta = d;
        let Some(step) = confirmed else {
            t.ahead = None;
            return;
        };
        let mut first = 1u64;
        if let Some((a, a_step)) = t.ahead {
            let diff = i128::from(a) - i128::from(fault.page);
            if a_step == step && diff % i128::from(step) == 0 {
                let k = diff / i128::from(step);
                if k >= 1 {
                    // Already issued up to k strides ahead: continue after it (or wait).
                    first = u64::try_from(k).unwrap_or(u64::MAX).saturating_add(1);
                }
            }
        }
        if first > depth {
            return;
        }
        let before = out.len();
        walk(fault.page, step, first, depth, out);
        if out.len() > before {
            t.ahead = Some((out[out.len() - 1], step));
        }
        self.issued += (out.len() - before) as f64;
        if self.issued > 64.0 {
            self.issued /= 2.0;
            self.hits /= 2.0;
        }
    }

    fn on_prefetch_hit(&mut self, _page: u64, _tid: u32) {
        self.count_hit();
    }
}
