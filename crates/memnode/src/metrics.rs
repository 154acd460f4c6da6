//! The memnode's stats as Prometheus metrics (`gleaner memnode --metrics ADDR` serves them at
//! `/metrics`). Every figure comes from the same [`StatsSnapshot`] that `gleaner memnode stats`
//! prints, taken on the metrics thread: the request path only bumps its counters.
//!
//! Names follow Prometheus conventions: `gleaner_memnode_` then what is measured, with the
//! unit (`_bytes`, `_seconds`) and `_total` for counters; what differs by kind is a label
//! (`kind`, `tenant`, `class`).

use gleaner_metrics::{Exposition, MetricType::Counter, MetricType::Gauge};

use crate::StatsSnapshot;

/// The metrics document for `s`.
pub fn render(s: &StatsSnapshot) -> String {
    let mut e = Exposition::new();
    let t = &s.totals;
    e.single(
        "gleaner_memnode_capacity_bytes",
        Gauge,
        "Memory the memnode may hold for its clients.",
        s.capacity_bytes as f64,
    );
    e.single(
        "gleaner_memnode_used_bytes",
        Gauge,
        "Capacity in use: stored blobs plus granted shared-memory slabs.",
        s.used_bytes as f64,
    );
    e.single(
        "gleaner_memnode_stored_bytes",
        Gauge,
        "Bytes of the blobs stored through requests (compressed pages count their compressed size).",
        s.stored_bytes as f64,
    );
    e.single(
        "gleaner_memnode_slab_bytes",
        Gauge,
        "Bytes of shared-memory slabs granted to clients on this host.",
        s.slab_bytes as f64,
    );
    e.single(
        "gleaner_memnode_host_bytes",
        Gauge,
        "Memory the far pages really occupy on this host (stored blobs plus written slab pages).",
        s.host_bytes as f64,
    );
    e.single(
        "gleaner_memnode_pages",
        Gauge,
        "Pages stored through requests (one blob each).",
        s.pages_held as f64,
    );
    e.single(
        "gleaner_memnode_sessions",
        Gauge,
        "Client sessions alive now.",
        s.sessions_total as f64,
    );
    e.single(
        "gleaner_memnode_connections",
        Gauge,
        "Connections open now.",
        s.live_connections as f64,
    );
    e.single(
        "gleaner_memnode_uptime_seconds",
        Gauge,
        "Seconds since the memnode started.",
        s.uptime_s,
    );
    e.single(
        "gleaner_memnode_lease_seconds",
        Gauge,
        "How long a session outlives its last connection.",
        s.lease_ms as f64 / 1000.0,
    );

    e.family(
        "gleaner_memnode_tenant_quota_bytes",
        Gauge,
        "The most bytes a tenant's sessions may hold together.",
    );
    for ten in &s.tenants {
        e.sample(&[("tenant", &ten.name)], ten.quota_bytes as f64);
    }
    e.family(
        "gleaner_memnode_tenant_used_bytes",
        Gauge,
        "Bytes a tenant's sessions hold now.",
    );
    for ten in &s.tenants {
        e.sample(&[("tenant", &ten.name)], ten.used_bytes as f64);
    }
    e.family(
        "gleaner_memnode_tenant_sessions",
        Gauge,
        "A tenant's sessions alive now.",
    );
    for ten in &s.tenants {
        e.sample(&[("tenant", &ten.name)], ten.sessions as f64);
    }
    let queued: Vec<_> = s
        .tenants
        .iter()
        .filter_map(|ten| ten.queue.as_ref().map(|q| (&ten.name, q)))
        .collect();
    if !queued.is_empty() {
        e.family(
            "gleaner_memnode_tenant_queue_wait_seconds_total",
            Counter,
            "Time a tenant's requests waited for the emulated link (--bandwidth), by class.",
        );
        for (name, q) in &queued {
            for (class, c) in &q.classes {
                let secs = c.wait_mean_us * c.requests as f64 / 1e6;
                e.sample(&[("tenant", name), ("class", class)], secs);
            }
        }
        e.family(
            "gleaner_memnode_tenant_queue_requests_total",
            Counter,
            "A tenant's requests that went through the emulated link, by class.",
        );
        for (name, q) in &queued {
            for (class, c) in &q.classes {
                e.sample(&[("tenant", name), ("class", class)], c.requests as f64);
            }
        }
        e.family(
            "gleaner_memnode_tenant_queue_bytes_total",
            Counter,
            "Bytes of a tenant's requests through the emulated link, by class.",
        );
        for (name, q) in &queued {
            for (class, c) in &q.classes {
                e.sample(&[("tenant", name), ("class", class)], c.bytes as f64);
            }
        }
        e.family(
            "gleaner_memnode_tenant_prefetches_dropped_total",
            Counter,
            "A tenant's prefetches dropped for waiting past their deadline.",
        );
        for (name, q) in &queued {
            e.sample(&[("tenant", name)], q.prefetches_dropped as f64);
        }
    }

    e.single(
        "gleaner_memnode_received_bytes_total",
        Counter,
        "Frame bytes received from clients (headers included).",
        t.bytes_in as f64,
    );
    e.single(
        "gleaner_memnode_sent_bytes_total",
        Counter,
        "Frame bytes sent to clients (headers included).",
        t.bytes_out as f64,
    );
    let r = &t.requests;
    e.family(
        "gleaner_memnode_requests_total",
        Counter,
        "Requests served, by kind.",
    );
    for (kind, n) in [
        ("read", r.read),
        ("write", r.write),
        ("free", r.free),
        ("forget", r.forget),
        ("ping", r.ping),
        ("stats", r.stats),
        ("goodbye", r.goodbye),
        ("grant", r.grant),
    ] {
        e.sample(&[("kind", kind)], n as f64);
    }
    e.single(
        "gleaner_memnode_pages_read_total",
        Counter,
        "Pages returned by reads.",
        t.pages_read as f64,
    );
    e.single(
        "gleaner_memnode_pages_written_total",
        Counter,
        "Pages stored by writes (overwrites included).",
        t.pages_written as f64,
    );
    e.single(
        "gleaner_memnode_stale_writes_total",
        Counter,
        "Written pages not stored because a newer version was held.",
        t.stale_writes as f64,
    );
    e.single(
        "gleaner_memnode_pages_freed_total",
        Counter,
        "Pages removed by Free requests.",
        t.pages_freed as f64,
    );
    e.family(
        "gleaner_memnode_errors_total",
        Counter,
        "Requests and connections refused or dropped, by kind.",
    );
    for (kind, n) in [
        ("not_found", t.errors_not_found),
        ("full", t.errors_full),
        (
            "auth_wrong_token",
            t.auth_failures.saturating_sub(t.session_attach_failures),
        ),
        ("auth_unknown_session", t.session_attach_failures),
        ("malformed_frame", t.malformed_frames),
        ("handshake_timeout", t.handshake_timeouts),
        ("connection_limit", t.connections_refused),
    ] {
        e.sample(&[("kind", kind)], n as f64);
    }
    e.single(
        "gleaner_memnode_connections_accepted_total",
        Counter,
        "Connections accepted.",
        t.connections_accepted as f64,
    );
    e.single(
        "gleaner_memnode_sessions_created_total",
        Counter,
        "Sessions created.",
        t.sessions_created as f64,
    );
    e.single(
        "gleaner_memnode_session_attaches_total",
        Counter,
        "Connections attached to an existing session: a client's further connections and its \
         reconnections after a connection broke.",
        t.sessions_attached as f64,
    );
    e.family(
        "gleaner_memnode_sessions_ended_total",
        Counter,
        "Sessions ended, by how: goodbye (the client left) or lease (no connection for the lease).",
    );
    e.sample(&[("how", "goodbye")], t.sessions_ended_by_goodbye as f64);
    e.sample(&[("how", "lease")], t.sessions_released_by_lease as f64);
    e.single(
        "gleaner_memnode_slabs_granted_total",
        Counter,
        "Shared-memory slabs granted.",
        t.slabs_granted as f64,
    );
    e.finish()
}
