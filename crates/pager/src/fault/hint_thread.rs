//! The hint thread: fetches the ranges a program hinted (`fault/hint.rs` queues them) through the
//! prefetch path, a batch at a time.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::engine::Engine;
use crate::fault::fetch::{self, PrefetchBufs};
use crate::store::StoreHandle;

/// The hint thread: fetches hinted ranges, a batch at a time, until the region stops.
pub(crate) fn run(engine: Arc<Engine>, mut store: Box<dyn StoreHandle>) {
    let mut bufs = PrefetchBufs::default();
    let pages = engine.mem.pages();
    while let Some((first, count)) = engine.hints.next(|| engine.stopping()) {
        let end = first.saturating_add(count).min(pages);
        let mut next = first;
        while next < end && !engine.stopping() {
            let stop = (next + gleaner_proto::MAX_BATCH_PAGES).min(end);
            bufs.candidates.clear();
            bufs.candidates.extend((next..stop).map(|p| p as u64));
            let fetched = {
                let _inside = engine.gate.enter();
                fetch::prefetch(&engine, &mut *store, &mut bufs)
            };
            // Charges only note the reclaim threads they want (a fault handler wakes them once
            // its fault is served); no fault waits on this thread, so wake them now.
            engine.reclaim.wake_deferred();
            engine
                .hints
                .pages_fetched
                .fetch_add(fetched as u64, Ordering::Relaxed);
            next = stop;
        }
    }
}
