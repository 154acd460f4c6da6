//! The eviction's way: the [`budget`] fills, [`reclaim`] (Hermit's feedback-directed scheduler)
//! decides how many threads reclaim, each thread's loop ([`reclaimer`]) picks victims in the
//! eviction [`order`] (informed by the [`access`] scan, walked by [`access_walk`]), and evicts
//! them as one batch ([`batch`], sized by [`batch_size`]); [`evictors`] and the [`watchdog`] keep
//! track of batches in flight and end one that is stuck; the watchdog also hands an orphaned fork
//! child its parent's budget ([`inherit`]). An [`elastic`] budget follows the node daemon's
//! grants, growing at once and shrinking by evicting in the background.

pub(crate) mod access;
pub(crate) mod access_walk;
pub(crate) mod batch;
pub(crate) mod batch_size;
pub(crate) mod budget;
pub(crate) mod elastic;
pub(crate) mod evictors;
pub(crate) mod inherit;
pub mod order;
pub(crate) mod reclaim;
pub(crate) mod reclaimer;
pub(crate) mod watchdog;
