//! What the memnode's threads share: the accept loop, the connection threads (`conn.rs`) and
//! the lease reaper (`server.rs` starts them all).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use gleaner_proto::Stream;

use crate::config::ServerConfig;
use crate::listener::Waker;
use crate::session::{SessionTable, Tenant};
use crate::stats::{self, ServerCounters, StatsSnapshot};
use crate::store::Capacity;

/// State shared by the accept loop, the connection threads and the reaper.
pub(crate) struct Shared {
    pub(crate) config: ServerConfig,
    pub(crate) capacity: Arc<Capacity>,
    /// The main token's tenant (the whole capacity) first, then the configured ones.
    pub(crate) tenants: Vec<Arc<Tenant>>,
    pub(crate) sessions: SessionTable,
    pub(crate) counters: ServerCounters,
    /// The emulated link (`--bandwidth`), whose requests are served in fair order by tenant.
    pub(crate) link: Option<crate::sched::Link>,
    pub(crate) started: Instant,
    pub(crate) stopping: AtomicBool,
    /// Set by `Drain`: clients are told to leave, and the server stops once no session is left.
    pub(crate) draining: AtomicBool,
    /// Wakes the accept loop (to stop once drained).
    pub(crate) waker: Waker,
    /// A second handle on every open connection, to shut them all down at exit.
    pub(crate) conns: Mutex<HashMap<u64, Stream>>,
}

impl Shared {
    /// Whether shutdown has begun.
    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Whether the server is draining.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Starts draining; returns whether it had already started.
    pub(crate) fn start_draining(&self) -> bool {
        self.draining.swap(true, Ordering::AcqRel)
    }

    /// The open connections, by id.
    pub(crate) fn conns(&self) -> MutexGuard<'_, HashMap<u64, Stream>> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The stats document.
    pub(crate) fn stats(&self) -> StatsSnapshot {
        stats::snapshot(stats::Inputs {
            counters: &self.counters,
            capacity: &self.capacity,
            tenants: &self.tenants,
            departures: self.link.as_ref().map(|l| l.departures()),
            sessions: self.sessions.snapshot(),
            uptime: self.started.elapsed(),
            lease: self.config.lease,
            live_connections: self.conns().len() as u64,
        })
    }

    /// The stats document as JSON that fits one `Stats` frame.
    pub(crate) fn stats_json(&self) -> String {
        stats::to_bounded_json(self.stats())
    }
}
