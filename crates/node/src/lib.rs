//! gleaner's node coordinator (Midas, NSDI 2024): one daemon per machine that hands idle memory
//! to soft-memory pools by marginal utility and takes it back under pressure, cooperatively
//! first and directly (punching a pool's memfd) when the pool's runtime is slow or pressure is
//! severe.
//!
//! * [`shared`]: the pool memfd and control-area layout both sides use (the contract);
//! * [`proto`]: the registration protocol on the daemon's Unix socket;
//! * [`client`]: finding, connecting to and starting a daemon;
//! * [`policy`], [`probes`], [`pressure`], [`evict`], [`elastic`]: pure decisions (allocation,
//!   which pools probe in which direction, pressure level and budget, which segments to punch,
//!   local memory between far programs with elastic budgets and the soft pools), unit-tested
//!   apart from the mechanisms;
//! * [`daemon`]: the daemon itself (`gleaner node`);
//! * [`metrics`]: its state as Prometheus metrics (`gleaner node --metrics ADDR`).
#![deny(missing_docs)]

pub mod batch;
pub mod client;
pub mod daemon;
pub mod elastic;
pub mod evict;
mod map;
pub mod metrics;
pub mod policy;
pub mod pressure;
mod priority;
pub mod probes;
pub mod proto;
pub mod shared;

pub use map::Mapping;
