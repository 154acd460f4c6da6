//! The gleaner memory node: holds pages for far-memory clients (pagers) over TCP or a Unix socket.
//!
//! A memnode serves the protocol of [`gleaner_proto`] (documented in `docs/protocol.md`):
//!
//! * every connection authenticates with a challenge–response over a shared token, then belongs to
//!   one **session**; several connections may attach to the same session (the pager opens one per
//!   fault-handler thread plus one for write-back);
//! * each session is its own **namespace** of page ids: a session can never read or overwrite
//!   another's pages;
//! * all sessions share one **capacity** in bytes, accounted exactly (a page is stored as the
//!   opaque blob the client sent, and occupies the blob's length); a write that does not fit
//!   stores nothing;
//! * a session ends with `Goodbye`, or a **lease** after its last connection closed, and its pages
//!   return to the pool;
//! * a client on the same host (Unix socket) can instead be granted **shared-memory slabs**
//!   (memfds passed over the socket) and keep its pages in them itself, with no request on the
//!   data path; slabs count against the same capacity.
//!
//! The crate is a library ([`Server`], usable in-process by tests and benchmarks) plus the
//! `gleaner memnode` subcommand ([`cli`]). Modules, one job each:
//!
//! | module | job |
//! |---|---|
//! | [`config`] | [`ServerConfig`]: what a server needs to run |
//! | [`server`] | binding, the accept loop, the lease reaper, clean shutdown |
//! | `listener` | TCP/Unix listening sockets, stale socket files, interruptible accept |
//! | `conn` | one connection: handshake, then the request loop |
//! | `session` | the session table: create, attach, detach, lease expiry |
//! | `store` | one session's pages and the shared capacity pool |
//! | `slabs` | one session's shared-memory slabs (memfds granted to a client on this host) |
//! | `sched` | the emulated link (`--bandwidth`): its two lanes and who gets them, in fair order |
//! | `departure` | when a reply held for the emulated link leaves |
//! | [`stats`] | counters and the JSON stats document |
//! | [`metrics`] | the stats as Prometheus metrics (`--metrics ADDR`) |
//! | [`cli`] | the command line |
#![deny(missing_docs)]

pub mod cli;
pub mod config;
mod conn;
mod departure;
mod error;
mod listener;
pub mod metrics;
mod sched;
pub mod server;
mod session;
mod shared;
mod slabs;
pub mod stats;
mod store;

pub use config::{Schedule, ServerConfig, TenantConfig};
pub use departure::DepartureStats;
pub use error::ServerError;
pub use sched::{QueueStats, TenantQueueStats};
pub use server::{RunSummary, Server, ShutdownHandle};
pub use stats::{StatsSnapshot, TenantStats};
