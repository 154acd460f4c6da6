//! gleaner's policies, free of any system call so they can be unit-tested against scripted input
//! and replayed offline: prefetchers (Leap, readahead, next-N, stride), eviction orders (FIFO,
//! CLOCK, RackMem, and exact LRU / Belady as references), Hermit's reclaim scheduler, the fault
//! trace format and the simulator behind `gleaner trace replay`.
#![deny(missing_docs)]

pub mod cli;
pub mod evict;
pub mod hermes;
pub mod prefetch;
pub mod reclaim;
pub mod sim;
pub mod trace;
