//! The shared link and who gets it: with `--bandwidth`, the memnode serves page data at most at
//! that rate in each direction (an emulated full-duplex link, as every Ethernet or InfiniBand
//! link is, so that contention between tenants shows on loopback): reads (`Read`, `Prefetch`)
//! go out on one lane, write-backs come in on the other, and the two never wait for each other.
//! On each lane, requests waiting for it are served in start-time fair queuing order by tenant
//! weight (Canvas, Canvas, NSDI 2023, two-dimensional scheduling): each request gets a start tag
//! `S = max(V, F_tenant)` and a finish tag `F = S + bytes / weight`, the waiting request with the
//! smallest start tag goes next, and the lane's virtual time `V` is the start tag of the request
//! last sent. A tenant with three times the weight of another gets three times its bytes while
//! both wait; an idle tenant does not bank credit (its tags restart from `V`).
//!
//! Within a session, reads go in priority order: when the fair order picks a session, its
//! waiting demand reads go before its prefetches (`Prefetch` requests). Write-backs get the fair
//! order only (as Canvas schedules swap-outs: fair, with no priority among them). A prefetch that
//! has waited past its deadline when its turn comes (the client sends how long a prefetched page
//! usually has before its first use) is dropped: it would arrive after the demand it was meant
//! to hide, and take the link from others meanwhile.
//!
//! Each connection thread calls [`Link::transfer`] with its reply's (reads) or request's
//! (writes) size before it sends or stores it: the call waits for the request's turn and for its
//! lane to be free, then holds the lane for `bytes / rate`. Without `--bandwidth` there is no
//! link and nothing waits. `--schedule fifo` serves each lane first come first served instead,
//! dropping nothing: the baseline `bench/corun.py` measures the fair order against.
//!
//! Until 2026-11-26 (f7eddd5) the link was one lane shared by both directions, so a demand
//! read waited for any write-back being sent (a 128-page batch holds a 32 MB/s lane for 16 ms);
//! no real link works that way, and Canvas sets swap-in and swap-out bandwidth apart.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::Schedule;
use crate::departure::{DepartureStats, Departures};

/// Queue-wait samples kept per tenant for the percentiles: a log2 histogram of microseconds.
const WAIT_BUCKETS: usize = 32;

/// A request's priority class within its session, highest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Class {
    /// A read a fault waits for.
    Demand = 0,
    /// A read ahead of demand.
    Prefetch = 1,
    /// A write-back.
    WriteBack = 2,
}

impl Class {
    /// The lane its bytes take: reads go out on lane 0, write-backs come in on lane 1.
    fn lane(self) -> usize {
        match self {
            Class::Demand | Class::Prefetch => 0,
            Class::WriteBack => 1,
        }
    }
}

/// The class names, in [`Class`] order, for the stats.
const CLASS_NAMES: [&str; 3] = ["demand", "prefetch", "writeback"];

/// What one tenant met at the link, per class.
#[derive(Debug, Default)]
pub(crate) struct TenantQueue {
    classes: [ClassQueue; 3],
    /// Prefetches dropped for waiting past their deadline.
    dropped: AtomicU64,
    /// The tenant's last finish tag (bytes / weight) on each lane.
    finish: [Mutex<f64>; 2],
}

/// One class's counters.
#[derive(Debug, Default)]
struct ClassQueue {
    requests: AtomicU64,
    bytes: AtomicU64,
    wait_ns: AtomicU64,
    /// Requests by queue wait: bucket `i` holds waits below `2^i` µs (the last, the rest).
    waits: [AtomicU64; WAIT_BUCKETS],
}

/// A tenant's queue at the link, for the stats.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TenantQueueStats {
    /// All classes together.
    pub total: QueueStats,
    /// Per class: `demand`, `prefetch`, `writeback`.
    pub classes: std::collections::BTreeMap<String, QueueStats>,
    /// Prefetches dropped for waiting past their deadline (nothing read; the client fetches
    /// the pages on demand).
    pub prefetches_dropped: u64,
}

/// Requests of one class (or all) at the link, for the stats.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
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
    fn record(&self, class: Class, bytes: u64, waited: Duration) {
        let c = &self.classes[class as usize];
        c.requests.fetch_add(1, Ordering::Relaxed);
        c.bytes.fetch_add(bytes, Ordering::Relaxed);
        c.wait_ns
            .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
        let us = waited.as_micros() as u64;
        let bucket = (u64::BITS - us.leading_zeros()) as usize;
        c.waits[bucket.min(WAIT_BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
    }

    /// The stats so far.
    pub(crate) fn stats(&self) -> TenantQueueStats {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut all = ClassCounts::default();
        let mut classes = std::collections::BTreeMap::new();
        for (name, c) in CLASS_NAMES.iter().zip(&self.classes) {
            let counts = ClassCounts {
                requests: load(&c.requests),
                bytes: load(&c.bytes),
                wait_ns: load(&c.wait_ns),
                waits: c.waits.iter().map(load).collect(),
            };
            all.add(&counts);
            classes.insert(name.to_string(), counts.stats());
        }
        TenantQueueStats {
            total: all.stats(),
            classes,
            prefetches_dropped: load(&self.dropped),
        }
    }
}

/// A class's counters as read at one time.
#[derive(Default)]
struct ClassCounts {
    requests: u64,
    bytes: u64,
    wait_ns: u64,
    waits: Vec<u64>,
}

impl ClassCounts {
    fn add(&mut self, o: &ClassCounts) {
        self.requests += o.requests;
        self.bytes += o.bytes;
        self.wait_ns += o.wait_ns;
        self.waits.resize(WAIT_BUCKETS, 0);
        for (a, b) in self.waits.iter_mut().zip(&o.waits) {
            *a += b;
        }
    }

    fn stats(&self) -> QueueStats {
        let (n, counts) = (self.requests, &self.waits);
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
            bytes: self.bytes,
            wait_mean_us: if n == 0 {
                0.0
            } else {
                self.wait_ns as f64 / n as f64 / 1000.0
            },
            wait_p50_us: if n == 0 { 0 } else { quantile(0.5) },
            wait_p99_us: if n == 0 { 0 } else { quantile(0.99) },
        }
    }
}

/// A request waiting for the link.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Waiting {
    start: f64,
    arrival: u64,
    session: u64,
    class: Class,
}

/// Why a request did not get the link.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Late {
    /// How long it waited, µs.
    pub(crate) waited_us: u64,
}

/// The emulated full-duplex link: a lane for reads and one for write-backs, each of the rate.
pub(crate) struct Link {
    lanes: [Lane; 2],
    /// When held replies leave.
    departures: Departures,
}

/// One direction of the link and its queue.
struct Lane {
    bytes_per_s: f64,
    schedule: Schedule,
    state: Mutex<State>,
    turn: Condvar,
}

struct State {
    /// Virtual time: the start tag of the request last sent.
    vtime: f64,
    /// When the lane finishes what it is sending.
    free_at: Instant,
    /// Waiting requests.
    waiting: Vec<Waiting>,
    arrivals: u64,
}

impl Link {
    /// A link of `bytes_per_s` in each direction, its waiting requests ordered by `schedule`.
    pub(crate) fn new(bytes_per_s: u64, schedule: Schedule) -> Link {
        Link {
            lanes: [
                Lane::new(bytes_per_s, schedule),
                Lane::new(bytes_per_s, schedule),
            ],
            departures: Departures::default(),
        }
    }

    /// Waits for this request's turn and a free lane in its direction (reads out, write-backs
    /// in), then holds that lane for `bytes` at its rate: the turn goes in start-time fair order
    /// by the tenant's `weight` across sessions (`queue` is the tenant's), and by `class` within
    /// `session`. A request with a `deadline` that has waited past it when its turn comes is
    /// dropped instead (it never takes the link).
    pub(crate) fn transfer(
        &self,
        queue: &TenantQueue,
        weight: u32,
        session: u64,
        class: Class,
        bytes: u64,
        deadline: Option<Duration>,
    ) -> Result<(), Late> {
        let lane = &self.lanes[class.lane()];
        precise_timers();
        let arrived = Instant::now();
        let mut st = lane.state.lock().unwrap_or_else(PoisonError::into_inner);
        let start = {
            let mut finish = queue.finish[class.lane()]
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let start = st.vtime.max(*finish);
            *finish = start + bytes as f64 / f64::from(weight.max(1));
            start
        };
        st.arrivals += 1;
        let me = Waiting {
            start,
            arrival: st.arrivals,
            session,
            class,
        };
        st.waiting.push(me);
        loop {
            let now = Instant::now();
            if st.next(lane.schedule) == Some(me) {
                let late = deadline.is_some_and(|d| now - arrived > d);
                if late && lane.schedule == Schedule::Fair {
                    st.waiting.retain(|w| *w != me);
                    drop(st);
                    lane.turn.notify_all();
                    queue.dropped.fetch_add(1, Ordering::Relaxed);
                    return Err(Late {
                        waited_us: (now - arrived).as_micros() as u64,
                    });
                }
                if now >= st.free_at {
                    break;
                }
                let until = st.free_at - now;
                st = lane
                    .turn
                    .wait_timeout(st, until)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            } else {
                st = lane.turn.wait(st).unwrap_or_else(PoisonError::into_inner);
            }
        }
        st.waiting.retain(|w| *w != me);
        st.vtime = start;
        // On a real link the bytes start when the lane frees (or on arrival, if it was free
        // then), not when this thread got round to running: starting them at `now` would add
        // every wake-up's latency to the lane's busy time, a slower link than the rate asked.
        let begin = arrived.max(st.free_at);
        let busy = Duration::from_secs_f64(bytes as f64 / lane.bytes_per_s);
        st.free_at = begin + busy;
        let done = st.free_at;
        drop(st);
        // The next request may take the link once this one's bytes are through.
        lane.turn.notify_all();
        queue.record(class, bytes, begin - arrived);
        // Until the bytes are through (replies leave on time on average: `departure.rs`).
        self.departures.hold_until(done);
        Ok(())
    }

    /// How this link's replies left, for the stats.
    pub(crate) fn departures(&self) -> DepartureStats {
        self.departures.stats()
    }
}

impl Lane {
    fn new(bytes_per_s: u64, schedule: Schedule) -> Lane {
        Lane {
            bytes_per_s: bytes_per_s.max(1) as f64,
            schedule,
            state: Mutex::new(State {
                vtime: 0.0,
                free_at: Instant::now(),
                waiting: Vec::new(),
                arrivals: 0,
            }),
            turn: Condvar::new(),
        }
    }
}

/// Asks the kernel to end this thread's timed waits on time: the default timer slack (50 µs)
/// would hold each reply that long past its bytes, a third of a page's time on a 32 MB/s link.
fn precise_timers() {
    thread_local! {
        static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    DONE.with(|done| {
        if !done.get() {
            done.set(true);
            // A thread's own timer slack; failing leaves the default, which is only slower.
            let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1000));
        }
    });
}

impl State {
    /// The request whose turn it is: the fair order picks the waiting request with the
    /// smallest start tag; its session's best class (then earliest arrival) goes in its place.
    fn next(&self, schedule: Schedule) -> Option<Waiting> {
        if schedule == Schedule::Fifo {
            return self.waiting.iter().min_by_key(|w| w.arrival).copied();
        }
        let first = self
            .waiting
            .iter()
            .min_by(|a, b| a.start.total_cmp(&b.start).then(a.arrival.cmp(&b.arrival)))?;
        self.waiting
            .iter()
            .filter(|w| w.session == first.session)
            .min_by_key(|w| (w.class, w.arrival))
            .copied()
    }
}
