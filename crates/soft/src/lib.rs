//! gleaner's soft-memory runtime (Midas, NSDI 2024): memory for state a program can rebuild
//! (caches, memo tables, decoded blocks) that the machine can take back at any moment.
//!
//! * [`Pool`]: a pool of soft memory with a reconstructor; a log-structured allocator over
//!   2 MiB segments of a memfd, per-object hotness, an evacuator (compaction by live ratio,
//!   coldest first; cold-first release), counters (hits, misses, victim hits, rebuild cost);
//!   optionally registered with the node daemon (`gleaner node`), which grants it memory and
//!   can punch its segments without its help.
//! * [`SoftBox`] and [`SoftShared`]: soft unique and shared pointers whose reads return copies
//!   and never torn or foreign bytes: memory taken mid-read makes the read a miss.
//! * [`SoftHashMap`], [`SoftArray`], [`SoftQueue`]: soft collections.
//!
//! ```
//! use std::sync::Arc;
//! use gleaner_soft::{Pool, PoolConfig, SoftHashMap};
//! let pool = Pool::new(PoolConfig::default(), Arc::new(|key: &[u8]| Some(key.repeat(2)))).unwrap();
//! let map = SoftHashMap::new(&pool);
//! assert_eq!(map.get(b"ab").unwrap(), b"abab"); // a miss: reconstructed
//! assert_eq!(map.get(b"ab").unwrap(), b"abab"); // a hit: a copy out of soft memory
//! assert_eq!((pool.stats().misses, pool.stats().hits), (1, 1));
//! ```
#![deny(missing_docs)]

mod collections;
mod hits;
mod link;
mod open;
pub mod plan;
mod pool;
mod ptr;
mod words;

pub use collections::{SoftArray, SoftHashMap, SoftQueue};
pub use pool::{Pool, PoolConfig, Reconstructor, Stats, HEADER, PIECE_MAX};
pub use ptr::{SoftBox, SoftShared};
