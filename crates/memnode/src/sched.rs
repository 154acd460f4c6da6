//! The shared link and who gets it: with `--bandwidth`, the memnode serves page data at most at
//! that rate (an emulated link, so that contention between tenants shows on loopback), and
//! requests waiting for it are served in start-time fair queuing order by tenant weight
//! (Canvas, section 4.5 of docs/ALGORITHMS.md): each request gets a start tag
//! `S = max(V, F_tenant)` and a finish tag `F = S + bytes / weight`, the waiting request with the
//! smallest start tag goes next, and the virtual time `V` is the start tag of the request last
//! sent. A tenant with three times the weight of another gets three times its bytes while both
//! wait; an idle tenant does not bank credit (its tags restart from `V`).
//!
//! Each connection thread calls [`Link::transfer`] with its reply's (reads) or request's
//! (writes) size before it sends or stores it: the call waits for the request's turn and for the
//! link to be free, then holds the link for `bytes / rate`. Without `--bandwidth` there is no
//! link and nothing waits.
//!
//! Not built yet (issue 13): priority classes within a session (demand reads before prefetch
//! reads before write-backs, which needs the class on the wire) and dropping prefetches that
//! would arrive too late.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::session::Tenant;

/// Queue-wait samples kept per tenant for the percentiles: a log2 histogram of microseconds.
const WAIT_BUCKETS: usize = 32;

/// What one tenant met at the link.
#[derive(Debug, Default)]
pub(crate) struct TenantQueue {
    requests: AtomicU64,
    bytes: AtomicU64,
    wait_ns: AtomicU64,
    /// Requests by queue wait: bucket `i` holds waits below `2^i` µs (the last, the rest).
    waits: [AtomicU64; WAIT_BUCKETS],
    /// The tenant's last finish tag (bytes / weight).
    finish: Mutex<f64>,
}

/// A tenant's queue at the link, for the stats.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct QueueStats {
    /// Requests that went through the link.
    pub requests: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Mean time they waited for their turn and a free link, µs.
    pub wait_mean_us: f64,
    /// Median wait, µs (upper bound of its power-of-two bucket).
    pub wait_p50_us: u64,
    /// 99th-percentile wait, µs (upper bound of its power-of-two bucket).
    pub wait_p99_us: u64,
}

impl TenantQueue {
    fn record(&self, bytes: u64, waited: Duration) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.wait_ns
            .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
        let us = waited.as_micros() as u64;
        let bucket = (u64::BITS - us.leading_zeros()) as usize;
        self.waits[bucket.min(WAIT_BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
    }

    /// The stats so far.
    pub(crate) fn stats(&self) -> QueueStats {
        let n = self.requests.load(Ordering::Relaxed);
        let counts: Vec<u64> = self
            .waits
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let quantile = |q: f64| -> u64 {
            let want = (q * n as f64).ceil() as u64;
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= want.max(1) {
                    return 1u64 << i;
                }
            }
            0
        };
        QueueStats {
            requests: n,
            bytes: self.bytes.load(Ordering::Relaxed),
            wait_mean_us: if n == 0 {
                0.0
            } else {
                self.wait_ns.load(Ordering::Relaxed) as f64 / n as f64 / 1000.0
            },
            wait_p50_us: if n == 0 { 0 } else { quantile(0.5) },
            wait_p99_us: if n == 0 { 0 } else { quantile(0.99) },
        }
    }
}

/// The emulated link and its queue.
pub(crate) struct Link {
    bytes_per_s: f64,
    state: Mutex<State>,
    turn: Condvar,
}

struct State {
    /// Virtual time: the start tag of the request last sent.
    vtime: f64,
    /// When the link finishes what it is sending.
    free_at: Instant,
    /// Waiting requests: (start tag, arrival number).
    waiting: Vec<(f64, u64)>,
    arrivals: u64,
}

impl Link {
    /// A link of `bytes_per_s`.
    pub(crate) fn new(bytes_per_s: u64) -> Link {
        Link {
            bytes_per_s: bytes_per_s.max(1) as f64,
            state: Mutex::new(State {
                vtime: 0.0,
                free_at: Instant::now(),
                waiting: Vec::new(),
                arrivals: 0,
            }),
            turn: Condvar::new(),
        }
    }

    /// Waits for this request's turn (start-time fair order among the waiting requests, by
    /// `tenant`'s weight) and a free link, then holds the link for `bytes` at its rate.
    pub(crate) fn transfer(&self, tenant: &Tenant, bytes: u64) {
        let arrived = Instant::now();
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let start = {
            let mut finish = tenant
                .queue
                .finish
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let start = st.vtime.max(*finish);
            *finish = start + bytes as f64 / f64::from(tenant.weight.max(1));
            start
        };
        st.arrivals += 1;
        let me = (start, st.arrivals);
        st.waiting.push(me);
        loop {
            let first = st
                .waiting
                .iter()
                .copied()
                .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let now = Instant::now();
            if first == Some(me) {
                if now >= st.free_at {
                    break;
                }
                let until = st.free_at - now;
                st = self
                    .turn
                    .wait_timeout(st, until)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            } else {
                st = self.turn.wait(st).unwrap_or_else(PoisonError::into_inner);
            }
        }
        st.waiting.retain(|w| *w != me);
        st.vtime = start;
        let now = Instant::now();
        let busy = Duration::from_secs_f64(bytes as f64 / self.bytes_per_s);
        st.free_at = now + busy;
        drop(st);
        // The next request may take the link once this one's bytes are through.
        self.turn.notify_all();
        tenant.queue.record(bytes, now - arrived);
        std::thread::sleep(busy);
    }
}
