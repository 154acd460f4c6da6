//! A region's statistics as reported (the stats JSON), gathered from the live counters
//! (`observe/counters.rs`) and from each part of the pager.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::observe::counters::{FaultBreakdown, LatencySummary};

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
    /// Under `--compress auto` over a link: what a page written back with LZ4 costs, its
    /// encoding and twice its commit, µs (moving average; 0: not measured, or shared memory).
    pub lz4_us_per_page: f64,
    /// The same with zstd: the cheaper of the two compresses most batches.
    pub zstd_us_per_page: f64,
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
    pub prefetch: crate::fault::prefetch::PrefetchStats,
    /// Runtime prefetch hints (`Region::prefetch_hint`, `gleaner_prefetch`).
    pub hints: HintStats,
    /// Write prediction: read fetches installed writable, or (off) its shadow precision.
    pub write_prediction: crate::fault::predict::WritePredictionStats,
    /// Reclaim: the scheduler's watermarks and feedback, the pool, direct reclaims.
    pub reclaim: crate::evict::reclaim::ReclaimStats,
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
    /// Service time of remote faults, from the handler reading the fault message to the page
    /// mapped (the thread then woken), over one remote fault in 8: those whose install is
    /// timed (`fault_breakdown.timed_installs`).
    pub remote_fault_latency: LatencySummary,
    /// Eviction order: `fifo`, `clock` or `rackmem`.
    pub policy: String,
    /// The access scan: which signals feed the eviction order, and what they cost.
    pub access: AccessStats,
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

/// The access scan's stats.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AccessStats {
    /// The signals in use (`written-bits`), empty when none is.
    pub signals: Vec<&'static str>,
    /// Signals not in use, each with why.
    pub unavailable: BTreeMap<String, String>,
    /// Scans done.
    pub scans: u64,
    /// Pages reported written (references handed to the eviction policy), over all scans.
    pub pages_referenced: u64,
    /// The scans' CPU time, in ms, over all scans.
    pub cpu_ms: f64,
    /// The scans' CPU time per second of the region's life, in ms (the share of a CPU, x1000).
    pub cpu_ms_per_s: f64,
    /// The period chosen after the last scan, in ms.
    pub period_ms: f64,
}
