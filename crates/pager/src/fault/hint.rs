//! Runtime prefetch hints (Canvas's application tier): a program, or a runtime inside it (a JVM
//! agent, an allocator), says which range it is about to use, and a hint thread (started by the
//! region's first hint, with its own store handle) fetches the range's far pages ahead of the
//! faults, at prefetch priority: through the prefetch path (`fetch::prefetch`), which claims
//! only pages held far, never waits for room and never evicts for them, so a hint can never
//! slow a demand fault down or push the budget.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Hinted page ranges waiting for the hint thread, and what came of them.
#[derive(Default)]
pub(crate) struct Hints {
    queue: Mutex<VecDeque<(usize, usize)>>,
    ready: Condvar,
    /// Pages hinted (whatever their state).
    pub(crate) pages_hinted: AtomicU64,
    /// Pages the hints fetched (they were held far, and the budget had room).
    pub(crate) pages_fetched: AtomicU64,
}

/// The most pages one hint queues (longer ranges are cut): a hint is about what comes next,
/// and the budget bounds what can be fetched anyway.
const MAX_HINT_PAGES: usize = 1 << 18;

impl Hints {
    /// Queues `count` pages from `first` for the hint thread.
    pub(crate) fn push(&self, first: usize, count: usize) {
        let count = count.min(MAX_HINT_PAGES);
        if count == 0 {
            return;
        }
        self.pages_hinted.fetch_add(count as u64, Ordering::Relaxed);
        self.queue
            .lock()
            .expect("hints lock")
            .push_back((first, count));
        self.ready.notify_one();
    }

    /// Wakes the hint thread (to see the region stopping).
    pub(crate) fn wake(&self) {
        let _guard = self.queue.lock().expect("hints lock");
        self.ready.notify_all();
    }

    /// The next hinted range, waiting for one; None once the region stops.
    pub(crate) fn next(&self, stopping: impl Fn() -> bool) -> Option<(usize, usize)> {
        let mut q = self.queue.lock().expect("hints lock");
        loop {
            if stopping() {
                return None;
            }
            if let Some(r) = q.pop_front() {
                return Some(r);
            }
            q = self
                .ready
                .wait_timeout(q, Duration::from_secs(1))
                .expect("hints lock")
                .0;
        }
    }
}
