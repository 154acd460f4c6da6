//! Per-region counters and the remote-fault latency histogram, snapshotted as JSON.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Live counters, updated with relaxed atomics from handler and evictor threads.
#[derive(Default)]
pub(crate) struct Counters {
    pub zero_fills: AtomicU64,
    pub zero_filled_ahead: AtomicU64,
    pub remote_faults: AtomicU64,
    pub duplicate_faults: AtomicU64,
    pub wp_faults: AtomicU64,
    pub waited_on_eviction: AtomicU64,
    pub waited_on_budget: AtomicU64,
    pub evicted_clean: AtomicU64,
    pub evicted_dirty: AtomicU64,
    pub evict_batches: AtomicU64,
    /// Runs of consecutive pages in the batches (each costs the drop its own TLB flush).
    pub evict_runs: AtomicU64,
    pub evict_aborted: AtomicU64,
    /// Victims seen unwritten by the scan but written before the drop (asynchronous tracking).
    pub evict_raced: AtomicU64,
    /// Victims a fault waited for, handed back by their batch from what it captured.
    pub evict_handed_back: AtomicU64,
    /// Runs of victims scanned with `PAGEMAP_SCAN`.
    pub evict_scanned_runs: AtomicU64,
    /// Resident pages found dropped behind the pager's back (evicted or touched).
    pub dropped_behind_back: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub evict_protect_ns: AtomicU64,
    pub evict_read_ns: AtomicU64,
    pub evict_send_ns: AtomicU64,
    pub evict_drop_ns: AtomicU64,
    pub discarded: AtomicU64,
    /// Pages of freed blocks the allocator took back for new ones ([`crate::Region::reuse`]).
    pub reused: AtomicU64,
    /// Of those, pages held only far, discarded rather than fetched.
    pub reused_far: AtomicU64,
    pub surrendered: AtomicU64,
    pub prefetch_hit_faults: AtomicU64,
    /// Remote faults whose steps were timed, and the time each step took in all.
    pub timed_faults: AtomicU64,
    pub lookup_ns: AtomicU64,
    /// Handler wake-ups that found no message.
    pub handler_empty_wakeups: AtomicU64,
    pub fetch_ns: AtomicU64,
    pub install_ns: AtomicU64,
    /// Handler wake-ups with at least one message, and the messages they read.
    pub handler_wakeups: AtomicU64,
    pub handler_messages: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, v: u64) {
        counter.fetch_add(v, Ordering::Relaxed);
    }

    /// Adds one to `counter`; returns whether it was the first.
    pub(crate) fn add_first(counter: &AtomicU64) -> bool {
        counter.fetch_add(1, Ordering::Relaxed) == 0
    }

    /// Where remote faults' time went, from the counters.
    pub(crate) fn breakdown(&self) -> FaultBreakdown {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let n = get(&self.timed_faults);
        let mean_us = |ns: u64| {
            if n == 0 {
                0.0
            } else {
                ns as f64 / n as f64 / 1000.0
            }
        };
        let wakeups = get(&self.handler_wakeups);
        FaultBreakdown {
            timed_faults: n,
            lookup_mean_us: mean_us(get(&self.lookup_ns)),
            fetch_mean_us: mean_us(get(&self.fetch_ns)),
            install_mean_us: mean_us(get(&self.install_ns)),
            handler_wakeups: wakeups,
            handler_empty_wakeups: get(&self.handler_empty_wakeups),
            messages_per_wakeup: if wakeups == 0 {
                0.0
            } else {
                get(&self.handler_messages) as f64 / wakeups as f64
            },
        }
    }
}

/// Where a remote fault's time goes inside the handler, on average. The wait before it (from
/// the fault to the handler reading its message) is not visible from inside the process, since
/// the kernel does not timestamp fault messages: `gleaner bench micro` reports it as the fault
/// time the program saw minus this service time.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct FaultBreakdown {
    /// Remote faults timed.
    pub timed_faults: u64,
    /// Claiming the page, finding its data and charging the budget, µs.
    pub lookup_mean_us: f64,
    /// Getting the data: a copy's source in shared memory (nearly nothing), or the round trip
    /// to the memnode over a socket, µs.
    pub fetch_mean_us: f64,
    /// `UFFDIO_COPY`, waking the thread, publishing the page, µs.
    pub install_mean_us: f64,
    /// Handler wake-ups that found messages.
    pub handler_wakeups: u64,
    /// Handler wake-ups that found no message (another handler read it first). A lower bound:
    /// a handler woken after another took the message usually goes back to sleep inside
    /// `poll` without returning, which only a scheduler trace sees.
    pub handler_empty_wakeups: u64,
    /// Fault messages read per such wake-up.
    pub messages_per_wakeup: f64,
}

/// A latency histogram in nanoseconds (1 µs .. 60 s, 3 significant digits).
pub(crate) struct LatencyHistogram(Mutex<Histogram<u64>>);

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram(Mutex::new(
            Histogram::new_with_bounds(1_000, 60_000_000_000, 3).expect("valid bounds"),
        ))
    }
}

impl LatencyHistogram {
    pub(crate) fn record(&self, d: Duration) {
        let ns = (d.as_nanos() as u64).clamp(1_000, 60_000_000_000);
        self.0.lock().expect("histogram lock").saturating_record(ns);
    }

    pub(crate) fn summary(&self) -> LatencySummary {
        let h = self.0.lock().expect("histogram lock");
        LatencySummary::of(&h)
    }

    /// The `q` quantile in microseconds, or None without samples.
    pub(crate) fn quantile_us(&self, q: f64) -> Option<f64> {
        let h = self.0.lock().expect("histogram lock");
        (!h.is_empty()).then(|| h.value_at_quantile(q) as f64 / 1000.0)
    }

    pub(crate) fn reset(&self) {
        self.0.lock().expect("histogram lock").reset();
    }
}

/// Percentiles of a latency distribution, in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct LatencySummary {
    /// Number of samples.
    pub count: u64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest sample.
    pub max_us: f64,
    /// Mean.
    pub mean_us: f64,
}

impl LatencySummary {
    /// Summarises a nanosecond histogram.
    pub fn of(h: &Histogram<u64>) -> LatencySummary {
        if h.is_empty() {
            return LatencySummary::default();
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        LatencySummary {
            count: h.len(),
            p50_us: us(h.value_at_quantile(0.50)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
            mean_us: h.mean() / 1000.0,
        }
    }
}

/// Faults by kind.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct FaultStats {
    /// First touches served by zero-filling locally (no network).
    pub zero_fill: u64,
    /// Pages zero-filled ahead of a sequential fill, with the fault that triggered them (each
    /// saved a fault of its own).
    pub zero_filled_ahead: u64,
    /// Faults served by fetching the page from the memnode.
    pub remote: u64,
    /// Fault messages for a page another thread was already serving.
    pub concurrent_duplicate: u64,
    /// Write-protect faults that marked a clean page dirty.
    pub write_protect: u64,
    /// Faults that had to wait for an in-flight eviction of their page.
    pub waited_on_eviction: u64,
    /// Faults that had to wait for the evictor to free budget.
    pub waited_on_budget: u64,
    /// Faults served from the prefetch staging buffer (no network).
    pub prefetch_hit: u64,
}

/// Eviction counts and the time spent in each step of a batch.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct EvictionStats {
    /// Clean pages dropped without any network write.
    pub clean: u64,
    /// Dirty pages written back, then dropped.
    pub dirty: u64,
    /// Batches run.
    pub batches: u64,
    /// Runs of consecutive victims over all batches (a TLB flush each in the lazy-free drop).
    pub runs: u64,
    /// Batches undone because the memnode refused the write (pages kept resident).
    pub aborted: u64,
    /// Victims the scan saw unwritten but that the program wrote before the drop (asynchronous
    /// tracking): found by comparing with the far copy, and written back.
    pub raced_writes: u64,
    /// Victims a fault waited for that their batch handed back (installed again at once from
    /// the contents it had captured, instead of the fault waiting for the write-back to be
    /// acknowledged and then fetching the page back): they stay resident, dirty, and are not
    /// counted as evicted.
    pub handed_back: u64,
    /// Runs scanned with `PAGEMAP_SCAN` (which victims are mapped, which were written): only
    /// runs holding a victim whose far copy the store can compare, except in direct reclaim.
    pub scanned_runs: u64,
    /// Resident pages the program had dropped behind the pager's back (a raw `madvise` system
    /// call), found when a batch took them into its pipe or the program touched them: they read
    /// as zeros (and are written back as such).
    pub dropped_behind_back: u64,
    /// Of those, pages zero-filled by the watchdog for a batch stuck taking them into its pipe
    /// while no fault handler was free to serve its fault.
    pub dropped_served_by_watchdog: u64,
    /// Batches the watchdog looked at because they had been taking pages into their pipe for
    /// 50 ms (stuck, or preempted on a busy CPU).
    pub watchdog_looks: u64,
    /// Nanoseconds spent preparing a batch: reserving room in the store and scanning the
    /// victims (`PAGEMAP_SCAN`: which are mapped, which were written).
    pub protect_ns: u64,
    /// Nanoseconds spent copying pages out (kept at 0 since the pipe took over; see drop_ns).
    pub read_ns: u64,
    /// Nanoseconds spent writing back: comparing with far copies, copying into the store, and
    /// (a socket) sending and waiting for the memnode's acknowledgement.
    pub send_ns: u64,
    /// Nanoseconds spent taking the pages into the pipe, dropping them (one vectored
    /// `MADV_DONTNEED`) and reading them back out.
    pub drop_ns: u64,
    /// Whether drops go through one vectored `process_madvise` per batch (false: one `madvise`
    /// per contiguous run, because the kernel refused the vectored call).
    pub vectored_drop: bool,
    /// Pages the next batch takes: the size set, or, by default, what the store commits in about
    /// 1 ms at the recent batches' commit time per page (16 up to the size chosen from the
    /// budget), so that a fault on a page being evicted over a slow link does not wait for a
    /// long write-back.
    pub batch_pages_next: usize,
    /// Moving average of a batch's commit time (write-back and acknowledgement) per page written
    /// back, in microseconds (batches that wrote nothing are not counted).
    pub batch_us_per_page: f64,
    /// Each batch's time from claiming its victims to publishing them: the longest a fault on
    /// one of its pages waits unless the batch hands the page back sooner (such faults are
    /// counted in `faults.waited_on_eviction`, and not timed among the remote faults).
    pub batch_time: LatencySummary,
}

/// What the runtime prefetch hints did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HintStats {
    /// Pages the program asked for ahead of use.
    pub pages_hinted: u64,
    /// Pages the hints fetched (held far, with room in the budget).
    pub pages_fetched: u64,
}

/// A snapshot of one region's statistics (the JSON that `stats_json` and the exit dump print).
#[derive(Debug, Clone, Serialize)]
pub struct RegionStats {
    /// Region size in bytes.
    pub size_bytes: u64,
    /// Local budget in pages.
    pub budget_pages: u64,
    /// Pages resident now (including installs in flight).
    pub resident_pages: u64,
    /// Pages whose only copy is on the memnode now.
    pub remote_pages: u64,
    /// Faults by kind.
    pub faults: FaultStats,
    /// Where remote faults' time goes inside the handler.
    pub fault_breakdown: FaultBreakdown,
    /// Prefetching: issued, used, late, wasted; accuracy and coverage.
    pub prefetch: crate::prefetch::PrefetchStats,
    /// Runtime prefetch hints (`Region::prefetch_hint`, `gleaner_prefetch`).
    pub hints: HintStats,
    /// Write prediction: read fetches installed writable, or (off) its shadow precision.
    pub write_prediction: crate::predict::WritePredictionStats,
    /// Reclaim: the scheduler's watermarks and feedback, the pool, direct reclaims.
    pub reclaim: crate::reclaim::ReclaimStats,
    /// Evictions.
    pub evictions: EvictionStats,
    /// Pages the program discarded (`munmap`, `MADV_DONTNEED`, a freed big block the
    /// allocator does not keep for reuse).
    pub discarded_pages: u64,
    /// Pages of freed big blocks that the allocator gave to new blocks without a discard and a
    /// zero-fill (`--heap-retain`).
    pub reused_pages: u64,
    /// Of those, pages held only far, discarded rather than fetched (their contents were free).
    pub reused_far_pages: u64,
    /// Pages the program mapped a file or shared memory over with `MAP_FIXED` (the JVM's
    /// class-data archive): given up by the pager until the program unmapped them.
    pub surrendered_pages: u64,
    /// Bytes received from the memnode.
    pub bytes_in: u64,
    /// Bytes sent to the memnode.
    pub bytes_out: u64,
    /// Service time of remote faults, from reading the fault message to waking the thread.
    pub remote_fault_latency: LatencySummary,
    /// Eviction order: `fifo`, `clock` or `rackmem`.
    pub policy: String,
    /// The memnode this region uses.
    pub memnode: String,
    /// How writes are tracked: `async` (the kernel lets first writes through; eviction scans)
    /// or `sync` (a write-protect fault per first write).
    pub dirty_tracking: &'static str,
    /// The store: the data path (`shm` or `socket`) and what it holds.
    pub store: crate::store::StoreStats,
    /// Whether kernel-mode faults are served (`full`) or fail with EFAULT (`user-only`).
    pub uffd_mode: &'static str,
}
