//! gleaner's paging engine.
//!
//! A [`Region`] is a range of virtual memory of any size whose pages live partly in local RAM
//! (at most the *local budget*) and partly on a memory node. Pages are brought in on fault through
//! userfaultfd, by handler threads that never touch the region's memory themselves, and pushed out
//! by reclaim threads as the budget fills. `docs/architecture.md` describes the design; the
//! page-state machine in [`fault::state`] holds the concurrency rules.
//!
//! # A fault's way
//! [`fault::handler::run`] (a handler thread reads fault messages) ->
//! [`Handler::serve`](fault::resolve::Handler::serve) (the state machine) -> `on_missing` ->
//! `fetch_remote` (the prefetcher's pages join the request: [`fault::prefetch`]) -> the store
//! ([`StoreHandle::request`](store::StoreHandle::request), then `receive`: the codec layer
//! [`store::coded`] over a blob store's [`BlobHandle`](store::BlobHandle)) ->
//! [`CodecCtx::decode`](codec::CodecCtx::decode) -> [`fault::fetch::install_fetched`]
//! (`UFFDIO_COPY`, writable where [`fault::predict`] says so).
//!
//! # The eviction's way
//! A page installed is charged to the budget ([`evict::reclaimer::charge`]); over the budget, the
//! reclaim scheduler ([`evict::reclaim`], Hermit's feedback loop) wakes reclaim threads
//! ([`evict::reclaimer::run_pool_thread`]), which pick victims in the eviction order
//! ([`evict::order`], fed by the access scan [`evict::access`]) and evict them as one batch:
//! [`Evictor::evict_batch`](evict::batch::Evictor::evict_batch) (move out, encode with
//! [`codec`] in [`store::coded`], write the blobs to the store, one `MADV_DONTNEED` for the
//! batch). [`evict::watchdog`] ends a
//! batch that is stuck.
//!
//! # Where the rest lives
//! [`codec`] (compress and seal a far page), [`store`] (where far pages live: the codec layer
//! over the blob stores, socket, shared memory, a pool of memnodes; the embedded memnode), [`observe`] (counters, stats, status,
//! traces, the stuck-pager watcher), [`region`] (the public handle, fork), [`memory`] (the mapping and its userfaultfd),
//! [`config`] (every knob and its default), [`engine`] (what a region's threads share).
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
// The crate docs map its private modules for whoever reads them (`cargo doc --document-private-items`).
#![allow(rustdoc::private_intra_doc_links)]

// The pager's parts, grouped by what happens (the module docs say which way each belongs to).
pub mod codec;
mod config;
mod cpus;
mod engine;
mod evict;
mod fatal;
mod fault;
mod memory;
mod observe;
mod region;
mod runs;
mod scratch;
mod store;
mod thread;

pub use codec::decode_budget;
pub use evict::order as policy;
pub use observe::stuck;

pub use config::{
    default_max_reclaim_threads, AccessScanSetting, Compression, DataPath, DecodeBudget,
    DirtyTracking, ElasticBudget, Encryption, EvictKind, FarCopies, ForkMode, MemnodeTarget,
    PrefetchInstall, PrefetcherKind, ReclaimCpus, ReclaimMode, RegionConfig, WritePrediction,
    DEFAULT_EVICT, DEFAULT_EVICT_BATCH, DEFAULT_PREFETCH, FORK_CHILD_BUDGET_DIVISOR,
    MAX_AUTO_HANDLERS, MIN_AUTO_EVICT_BATCH, MIN_BUDGET_BATCHES,
};
pub use evict::reclaim::ReclaimStats;
pub use fatal::{exit_now, on_fatal, FATAL_EXIT_CODE};
pub use fault::predict::{WritePredictionStats, PREDICTED_RESIDENCIES};
pub use fault::prefetch::PrefetchStats;
pub use observe::counters::{FaultBreakdown, LatencySummary};
pub use observe::sampler::STATS_TRACE_INTERVAL;
pub use observe::stats::{AccessStats, EvictionStats, FaultStats, HintStats, RegionStats};
pub use observe::status::{status_dir, status_dirs, STATUS_INTERVAL};
pub use region::Region;
pub use scratch::{scratch_dir, system_dir};
pub use store::embedded::{capacity_for_region, EmbeddedMemnode};
pub use store::pool::MAX_REPLICAS;
pub use store::StoreStats;

/// The page size gleaner manages (the base page size of x86-64 and most arm64 kernels).
pub const PAGE_SIZE: usize = gleaner_proto::PAGE_SIZE;

/// A page of pseudo-random bytes (incompressible), different for every `seed` (tests).
#[cfg(test)]
pub(crate) fn noise_page(seed: u64) -> Vec<u8> {
    let mut rng = gleaner_sys::rng::XorShift64::new(seed);
    (0..PAGE_SIZE).map(|_| rng.next_u64() as u8).collect()
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
