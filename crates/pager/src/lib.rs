//! gleaner's paging engine.
//!
//! A [`Region`] is a range of virtual memory of any size whose pages live partly in local RAM
//! (at most the *local budget*) and partly on a memory node. Pages are brought in on fault through
//! userfaultfd, by handler threads that never touch the region's memory themselves, and pushed out
//! by reclaim threads (Hermit's feedback-directed pool, see `reclaim.rs`) as the budget fills. See `docs/architecture.md` for the design and the
//! page state machine in `state.rs` for the concurrency rules.
//!
//! ```no_run
//! use gleaner_pager::{Region, RegionConfig};
//! let region = Region::new(RegionConfig::new(1 << 30, 64 << 20)).unwrap();
//! let p = region.as_ptr();
//! // SAFETY: the region is 1 GiB of readable, writable memory for as long as `region` lives.
//! unsafe { p.add(12345).write(7) };
//! println!("{}", region.stats_json());
//! ```
#![deny(missing_docs)]

mod access;
mod access_walk;
mod batch_size;
mod budget;
pub mod codec;
mod compressor_choice;
mod config;
mod counters;
mod cpus;
pub mod decode_budget;
mod doorbell;
mod embedded;
mod engine;
mod evict;
mod evictors;
mod fatal;
mod fault;
mod fetch;
mod handler;
mod hint;
mod hint_thread;
mod inherit;
mod mapping;
mod mem;
mod pinned;
pub mod policy;
mod predict;
mod prefetch;
mod reclaim;
mod reclaimer;
mod region;
mod runs;
mod sampler;
mod scratch;
mod state;
mod stats;
mod status;
mod store;
pub mod stuck;
mod thread;
mod trace;
mod watchdog;

pub use config::{
    default_max_reclaim_threads, AccessScanSetting, Compression, DataPath, DecodeBudget,
    DirtyTracking, Encryption, EvictKind, FarCopies, ForkMode, MemnodeTarget, PrefetchInstall,
    PrefetcherKind, ReclaimCpus, ReclaimMode, RegionConfig, WritePrediction, DEFAULT_EVICT,
    DEFAULT_EVICT_BATCH, DEFAULT_PREFETCH, FORK_CHILD_BUDGET_DIVISOR, MAX_AUTO_HANDLERS,
    MIN_AUTO_EVICT_BATCH, MIN_BUDGET_BATCHES,
};
pub use counters::{FaultBreakdown, LatencySummary};
pub use embedded::{capacity_for_region, EmbeddedMemnode};
pub use fatal::{exit_now, on_fatal, FATAL_EXIT_CODE};
pub use predict::{WritePredictionStats, PREDICTED_RESIDENCIES};
pub use prefetch::PrefetchStats;
pub use reclaim::ReclaimStats;
pub use region::Region;
pub use sampler::STATS_TRACE_INTERVAL;
pub use scratch::{scratch_dir, system_dir};
pub use stats::{AccessStats, EvictionStats, FaultStats, HintStats, RegionStats};
pub use status::{status_dir, status_dirs, STATUS_INTERVAL};
pub use store::pool::MAX_REPLICAS;
pub use store::StoreStats;

/// The page size gleaner manages (the base page size of x86-64 and most arm64 kernels).
pub const PAGE_SIZE: usize = gleaner_proto::PAGE_SIZE;

/// A page of pseudo-random bytes (incompressible), different for every `seed` (tests).
#[cfg(test)]
pub(crate) fn noise_page(seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..PAGE_SIZE)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Why a region could not be created.
#[derive(Debug, thiserror::Error)]
pub enum PagerError {
    /// The configuration cannot work (for example a budget too small to make progress).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// userfaultfd is unavailable or not permitted.
    #[error(transparent)]
    Uffd(#[from] gleaner_uffd::UffdError),
    /// The memnode could not be reached or refused us.
    #[error(transparent)]
    Memnode(#[from] gleaner_proto::ClientError),
    /// The embedded memnode could not be started.
    #[error("cannot start the embedded memnode: {0}")]
    Embedded(String),
    /// A system call failed.
    #[error("{op} failed: {source}")]
    Os {
        /// What was attempted.
        op: &'static str,
        /// The operating system's reason.
        source: std::io::Error,
    },
}
