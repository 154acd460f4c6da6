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

    /// Whether `tenant` is the main token's (the whole memnode's operator).
    pub(crate) fn is_main_tenant(&self, tenant: &Arc<Tenant>) -> bool {
        self.tenants
            .first()
            .is_some_and(|main| Arc::ptr_eq(main, tenant))
    }

    /// The stats document as seen by a client of `tenant`: the whole memnode for the main
    /// token's tenant; for any other, only its own sessions, its own quota as the capacity and
    /// itself in the tenant list (tenants never see each other's sessions).
    pub(crate) fn stats_for(&self, tenant: &Arc<Tenant>) -> StatsSnapshot {
        if self.is_main_tenant(tenant) {
            return self.stats();
        }
        let sessions: Vec<_> = self
            .sessions
            .snapshot()
            .into_iter()
            .filter(|v| Arc::ptr_eq(v.session.tenant(), tenant))
            .collect();
        let live_connections = sessions.iter().map(|v| u64::from(v.live)).sum();
        let mut snap = stats::snapshot(stats::Inputs {
            counters: &self.counters,
            capacity: &tenant.capacity,
            tenants: std::slice::from_ref(tenant),
            departures: self.link.as_ref().map(|l| l.departures()),
            sessions,
            uptime: self.started.elapsed(),
            lease: self.config.lease,
            live_connections,
        });
        snap.scope = format!("tenant {}", tenant.name);
        snap
    }

    /// The stats document for a client of `tenant` ([`Shared::stats_for`]) as JSON that fits
    /// one `Stats` frame.
    pub(crate) fn stats_json_for(&self, tenant: &Arc<Tenant>) -> String {
        stats::to_bounded_json(self.stats_for(tenant))
    }
}
