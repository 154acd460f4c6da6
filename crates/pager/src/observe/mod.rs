//! What a region tells the world: the live [`counters`] the paths bump, the [`stats`] JSON built
//! from them, the live [`status`] file for `gleaner status`, the periodic stats trace
//! ([`sampler`]), the fault [`trace`], and [`stuck`], which finds a pager waiting for itself.

pub(crate) mod counters;
pub(crate) mod procfs;
pub(crate) mod sampler;
pub(crate) mod stats;
pub(crate) mod status;
pub mod stuck;
pub(crate) mod trace;
