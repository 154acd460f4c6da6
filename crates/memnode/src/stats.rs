//! Server counters and the JSON stats document (`StatsRequest` → `Stats`).
//!
//! Counters are relaxed atomics bumped on the request path; the document is assembled on demand.
//! The types below are public so tools can deserialize what `gleaner memnode stats` prints.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::session::SessionView;
use crate::store::Capacity;

/// Most sessions listed individually in one stats document; the rest are only counted (in
/// `sessions_omitted`). Keeps the document under the protocol's text bound.
pub const MAX_SESSIONS_LISTED: usize = 256;

/// Server-wide counters.
#[derive(Debug, Default)]
pub(crate) struct ServerCounters {
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub req_read: AtomicU64,
    pub req_write: AtomicU64,
    pub req_free: AtomicU64,
    pub req_forget: AtomicU64,
    pub req_ping: AtomicU64,
    pub req_stats: AtomicU64,
    pub req_goodbye: AtomicU64,
    pub req_grant: AtomicU64,
    pub slabs_granted: AtomicU64,
    pub slab_pages_granted: AtomicU64,
    pub pages_read: AtomicU64,
    pub pages_written: AtomicU64,
    pub stale_writes: AtomicU64,
    pub pages_freed: AtomicU64,
    pub copies_forgotten: AtomicU64,
    pub errors_not_found: AtomicU64,
    pub errors_full: AtomicU64,
    pub connections_accepted: AtomicU64,
    pub connections_refused: AtomicU64,
    pub auth_failures: AtomicU64,
    pub session_attach_failures: AtomicU64,
    pub malformed_frames: AtomicU64,
    pub handshake_timeouts: AtomicU64,
    pub sessions_created: AtomicU64,
    pub sessions_attached: AtomicU64,
    pub sessions_ended_by_goodbye: AtomicU64,
    pub sessions_released_by_lease: AtomicU64,
}

/// Adds `n` to a counter.
pub(crate) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// The whole stats document.
///
/// Capacity is counted in bytes: a stored page occupies the length of its blob (the client may
/// send it compressed and/or encrypted, or raw), a shared-memory slab its pages × `page_size`.
/// With no request in flight, `used_bytes == stored_bytes + slab_bytes`; the figures are sampled
/// one after another, so while requests run they may disagree slightly.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatsSnapshot {
    /// What the document covers: `memnode` (the whole memnode, for the main token) or
    /// `tenant NAME` (for a tenant's token: its sessions only, its quota as the capacity; the
    /// `totals` and `link_departures` stay the memnode's, counters that name no session).
    #[serde(default = "memnode_scope")]
    pub scope: String,
    /// Total capacity in bytes (a tenant's quota when `scope` is a tenant).
    pub capacity_bytes: u64,
    /// Bytes of capacity in use by all sessions together: stored blobs plus granted slabs.
    pub used_bytes: u64,
    /// `capacity_bytes - used_bytes`.
    pub free_bytes: u64,
    /// Bytes per page (the unit of page ids and of slabs).
    pub page_size: u64,
    /// Pages stored by all sessions (one blob each; pages in slabs are not included).
    pub pages_held: u64,
    /// `pages_held × page_size`: what the stored pages would take uncompressed.
    pub page_bytes_held: u64,
    /// Sum of the stored blobs' lengths: what the stored pages take of the capacity.
    pub stored_bytes: u64,
    /// Shared memory granted as slabs, in bytes (their pages × `page_size`), which the capacity
    /// counts whether or not it is written.
    pub slab_bytes: u64,
    /// Memory the far pages really occupy on this host: the stored blobs (`stored_bytes`) plus
    /// the written parts of shared-memory slabs (slabs are allocated as their client writes
    /// them).
    pub host_bytes: u64,
    /// Seconds since the server started.
    pub uptime_s: f64,
    /// How long a session outlives its last connection, in milliseconds.
    pub lease_ms: u64,
    /// Connections open now (including ones still authenticating).
    pub live_connections: u64,
    /// Counters since start.
    pub totals: Totals,
    /// Sessions alive now.
    pub sessions_total: u64,
    /// Sessions alive now but not listed in `sessions` (beyond [`MAX_SESSIONS_LISTED`]).
    pub sessions_omitted: u64,
    /// Per-session details, largest (`stored_bytes + slab_bytes`) first.
    pub sessions: Vec<SessionStats>,
    /// Each tenant: the main token's (`default`, the whole capacity) and those of `--tenant`.
    #[serde(default)]
    pub tenants: Vec<TenantStats>,
    /// How the emulated link's replies left (with `--bandwidth` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_departures: Option<crate::DepartureStats>,
}

/// One tenant in the stats.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TenantStats {
    /// Its name.
    pub name: String,
    /// The most bytes its sessions may hold together.
    pub quota_bytes: u64,
    /// Bytes they hold now.
    pub used_bytes: u64,
    /// Its weight.
    pub weight: u32,
    /// Its sessions alive now.
    pub sessions: u64,
    /// What its requests met at the link (with `--bandwidth` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<crate::sched::TenantQueueStats>,
}

/// Server-wide counters since start.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Totals {
    /// Frame bytes received (headers included).
    pub bytes_in: u64,
    /// Frame bytes sent (headers included).
    pub bytes_out: u64,
    /// Requests served, by kind.
    pub requests: RequestCounts,
    /// Pages returned by reads.
    pub pages_read: u64,
    /// Pages stored by writes (overwrites included).
    pub pages_written: u64,
    /// Written pages not stored because a newer version was held (a batch delivered late by a
    /// connection its client had already replaced).
    pub stale_writes: u64,
    /// Pages removed by `Free` requests.
    pub pages_freed: u64,
    /// Copies dropped by `Forget` requests (pages the client fetched and no longer needed).
    #[serde(default)]
    pub copies_forgotten: u64,
    /// Reads refused because a page was not stored.
    pub errors_not_found: u64,
    /// Writes refused because they did not fit.
    pub errors_full: u64,
    /// Connections accepted.
    pub connections_accepted: u64,
    /// Connections refused because of the connection limit.
    pub connections_refused: u64,
    /// Handshakes refused: wrong token, or an unknown session / wrong session key.
    pub auth_failures: u64,
    /// The part of `auth_failures` due to an unknown session or a wrong session key.
    pub session_attach_failures: u64,
    /// Connections dropped for malformed input.
    pub malformed_frames: u64,
    /// Connections dropped because they did not authenticate in time.
    pub handshake_timeouts: u64,
    /// Sessions created.
    pub sessions_created: u64,
    /// Connections attached to an existing session: a client's further connections (one per
    /// thread) and its reconnections after a connection broke.
    #[serde(default)]
    pub sessions_attached: u64,
    /// Sessions ended by `Goodbye`.
    pub sessions_ended_by_goodbye: u64,
    /// Sessions released because their lease ran out with no connection attached.
    pub sessions_released_by_lease: u64,
    /// Shared-memory slabs granted.
    pub slabs_granted: u64,
    /// Pages of the slabs granted.
    pub slab_pages_granted: u64,
}

/// Requests served, by kind.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RequestCounts {
    /// `Read`.
    pub read: u64,
    /// `Write`.
    pub write: u64,
    /// `Free`.
    pub free: u64,
    /// `Forget`.
    #[serde(default)]
    pub forget: u64,
    /// `Ping`.
    pub ping: u64,
    /// `StatsRequest`.
    pub stats: u64,
    /// `Goodbye`.
    pub goodbye: u64,
    /// `GrantRequest`.
    pub grant: u64,
}

/// One session.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionStats {
    /// Session id.
    pub id: u64,
    /// The client name given by the connection that created it.
    pub client: String,
    /// The tenant whose token opened it (`default` for the main token).
    #[serde(default)]
    pub tenant: String,
    /// Pages stored (requests over the socket), one blob each.
    pub pages_held: u64,
    /// `pages_held × page_size`: what they would take uncompressed.
    pub page_bytes_held: u64,
    /// Sum of their blobs' lengths: what they take of the capacity.
    pub stored_bytes: u64,
    /// Bytes of capacity held by the session's slabs (`shm_pages × page_size`).
    pub slab_bytes: u64,
    /// Shared-memory slabs held.
    pub shm_slabs: u64,
    /// Pages of those slabs.
    pub shm_pages: u64,
    /// Memory those slabs really occupy.
    pub shm_resident_bytes: u64,
    /// Frame bytes received on its connections after their handshakes.
    pub bytes_in: u64,
    /// Frame bytes sent on its connections after their handshakes.
    pub bytes_out: u64,
    /// Requests served.
    pub requests: u64,
    /// Connections attached now.
    pub live_connections: u32,
    /// Seconds since it was created.
    pub age_s: f64,
    /// Seconds since its last connection closed, if none is attached (its lease is running).
    pub idle_s: Option<f64>,
}

impl ServerCounters {
    fn totals(&self) -> Totals {
        Totals {
            bytes_in: get(&self.bytes_in),
            bytes_out: get(&self.bytes_out),
            requests: RequestCounts {
                read: get(&self.req_read),
                write: get(&self.req_write),
                free: get(&self.req_free),
                forget: get(&self.req_forget),
                ping: get(&self.req_ping),
                stats: get(&self.req_stats),
                goodbye: get(&self.req_goodbye),
                grant: get(&self.req_grant),
            },
            pages_read: get(&self.pages_read),
            pages_written: get(&self.pages_written),
            stale_writes: get(&self.stale_writes),
            pages_freed: get(&self.pages_freed),
            copies_forgotten: get(&self.copies_forgotten),
            errors_not_found: get(&self.errors_not_found),
            errors_full: get(&self.errors_full),
            connections_accepted: get(&self.connections_accepted),
            connections_refused: get(&self.connections_refused),
            auth_failures: get(&self.auth_failures),
            session_attach_failures: get(&self.session_attach_failures),
            malformed_frames: get(&self.malformed_frames),
            handshake_timeouts: get(&self.handshake_timeouts),
            sessions_created: get(&self.sessions_created),
            sessions_attached: get(&self.sessions_attached),
            sessions_ended_by_goodbye: get(&self.sessions_ended_by_goodbye),
            sessions_released_by_lease: get(&self.sessions_released_by_lease),
            slabs_granted: get(&self.slabs_granted),
            slab_pages_granted: get(&self.slab_pages_granted),
        }
    }

    /// Total requests of every kind.
    pub(crate) fn requests(&self) -> u64 {
        let r = self.totals().requests;
        r.read + r.write + r.free + r.ping + r.stats + r.goodbye + r.grant
    }
}

/// What the stats document is built from.
pub(crate) struct Inputs<'a> {
    pub counters: &'a ServerCounters,
    pub capacity: &'a Capacity,
    pub tenants: &'a [std::sync::Arc<crate::session::Tenant>],
    /// How the link's replies left, if the memnode has a link (`--bandwidth`): tenants then
    /// report their queue too.
    pub departures: Option<crate::DepartureStats>,
    pub sessions: Vec<SessionView>,
    pub uptime: Duration,
    pub lease: Duration,
    pub live_connections: u64,
}

/// The `scope` of a document covering the whole memnode.
fn memnode_scope() -> String {
    "memnode".to_string()
}

/// Builds the stats document.
pub(crate) fn snapshot(inputs: Inputs<'_>) -> StatsSnapshot {
    let mut sessions: Vec<SessionStats> = inputs
        .sessions
        .iter()
        .map(|v| {
            let shm = v.session.slab_usage();
            let (pages_held, stored_bytes) = {
                let store = v.session.store();
                (store.len() as u64, store.stored_bytes())
            };
            SessionStats {
                id: v.session.id(),
                client: v.session.client().to_string(),
                tenant: v.session.tenant().name.clone(),
                pages_held,
                page_bytes_held: pages_held * gleaner_proto::PAGE_SIZE as u64,
                stored_bytes,
                slab_bytes: shm.bytes,
                shm_slabs: shm.slabs,
                shm_pages: shm.pages,
                shm_resident_bytes: shm.resident_bytes,
                bytes_in: get(&v.session.bytes_in),
                bytes_out: get(&v.session.bytes_out),
                requests: get(&v.session.requests),
                live_connections: v.live,
                age_s: v.session.age().as_secs_f64(),
                idle_s: v.idle_for.map(|d| d.as_secs_f64()),
            }
        })
        .collect();
    // Totals over every session, listed or not.
    let sum = |f: fn(&SessionStats) -> u64| sessions.iter().map(f).sum::<u64>();
    let pages_held = sum(|s| s.pages_held);
    let stored_bytes = sum(|s| s.stored_bytes);
    let slab_bytes = sum(|s| s.slab_bytes);
    let host_bytes = stored_bytes + sum(|s| s.shm_resident_bytes);
    let total = sessions.len();
    let tenants = inputs
        .tenants
        .iter()
        .map(|t| TenantStats {
            name: t.name.clone(),
            quota_bytes: t.capacity.total(),
            used_bytes: t.capacity.used(),
            weight: t.weight,
            sessions: sessions.iter().filter(|s| s.tenant == t.name).count() as u64,
            queue: inputs.departures.is_some().then(|| t.queue.stats()),
        })
        .collect();
    sessions.sort_unstable_by(|a, b| {
        (b.stored_bytes + b.slab_bytes)
            .cmp(&(a.stored_bytes + a.slab_bytes))
            .then(a.id.cmp(&b.id))
    });
    sessions.truncate(MAX_SESSIONS_LISTED);
    let capacity = inputs.capacity.total();
    let used = inputs.capacity.used();
    StatsSnapshot {
        scope: memnode_scope(),
        capacity_bytes: capacity,
        used_bytes: used,
        free_bytes: capacity.saturating_sub(used),
        page_size: gleaner_proto::PAGE_SIZE as u64,
        pages_held,
        page_bytes_held: pages_held * gleaner_proto::PAGE_SIZE as u64,
        stored_bytes,
        slab_bytes,
        host_bytes,
        uptime_s: inputs.uptime.as_secs_f64(),
        lease_ms: inputs.lease.as_millis().try_into().unwrap_or(u64::MAX),
        live_connections: inputs.live_connections,
        totals: inputs.counters.totals(),
        sessions_total: total as u64,
        sessions_omitted: (total - sessions.len()) as u64,
        sessions,
        tenants,
        link_departures: inputs.departures,
    }
}

/// Serializes `snap` as compact JSON no longer than the protocol's text bound, dropping listed
/// sessions (counted in `sessions_omitted`) until it fits.
pub(crate) fn to_bounded_json(mut snap: StatsSnapshot) -> String {
    loop {
        let json = serde_json::to_string(&snap).unwrap_or_else(|e| {
            // Serializing plain numbers and strings cannot fail; keep the reply well-formed anyway.
            serde_json::json!({ "error": format!("cannot serialize stats: {e}") }).to_string()
        });
        if json.len() <= gleaner_proto::MAX_TEXT_LEN || snap.sessions.is_empty() {
            return json;
        }
        let keep = snap.sessions.len() / 2;
        snap.sessions_omitted += (snap.sessions.len() - keep) as u64;
        snap.sessions.truncate(keep);
    }
}
