//! An elastic local budget (`gleaner run --local-mem FLOOR..CEILING`): a pager thread registers
//! the region with the node daemon (`gleaner node`) as a far program, reports its far-fault
//! count, the far pages it brought in (on demand and prefetched) and the time its timed faults
//! took (counters the fault path keeps anyway: nothing is added to it), and applies the grants
//! the daemon pushes, clamped to the floor..ceiling.
//!
//! * A grant above the budget applies at once: the budget, the reclaim scheduler's and the
//!   eviction order's capacity grow (as `evict/watchdog.rs`'s orphaned fork child's does).
//! * A grant below it is reached in steps, on this thread: evict one batch, then lower the
//!   budget by what left, so the distance between what is resident and the budget stays what
//!   it was and no fault waits for the shrink; where what is resident is already under the
//!   grant, the budget drops to it at once.
//! * If the daemon goes away (killed, restarted), the budget stays where it is (never
//!   below the floor nor above the ceiling) and the thread re-registers, every second, as the
//!   budget it holds, when a daemon answers again. A refused registration (an older daemon, a
//!   bad range) is said once on stderr, and the budget stays where it is (the floor, when it
//!   is the first registration).
//!
//! The thread never touches managed memory: its buffers come from the pager's own heap (it
//! starts through the pager's thread start hook, as every pager thread does).

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gleaner_node::proto::{self, Kind, Reply, Request};

use crate::config::ElasticBudget;
use crate::engine::Engine;
use crate::evict::batch::Evictor;
use crate::evict::reclaimer::evict_for_shrink;
use crate::store::StoreHandle;
use crate::PAGE_SIZE;

/// How often the region reports its counters to the daemon.
const REPORT_EVERY: Duration = Duration::from_millis(250);
/// How often it tries to register again after the daemon went away.
const RECONNECT_EVERY: Duration = Duration::from_secs(1);
/// How long one shrink step evicts before the thread looks at its socket again.
const SHRINK_SLICE: Duration = Duration::from_millis(20);

/// The budget's bounds, in pages.
#[derive(Debug, Clone, Copy)]
struct Range {
    floor: usize,
    ceiling: usize,
}

impl Range {
    fn clamp_bytes(&self, bytes: u64) -> usize {
        ((bytes / PAGE_SIZE as u64) as usize).clamp(self.floor, self.ceiling)
    }
}

/// The thread's loop, until the region stops. `floor` and `ceiling` in pages.
pub(crate) fn run(
    engine: Arc<Engine>,
    cfg: ElasticBudget,
    floor: usize,
    ceiling: usize,
    mut store: Box<dyn StoreHandle>,
) {
    let range = Range {
        floor,
        ceiling: ceiling.max(floor),
    };
    let mut target = engine.budget.pages().clamp(range.floor, range.ceiling);
    let mut conn: Option<UnixStream> = None;
    let mut next_connect = Instant::now();
    let mut next_report = Instant::now();
    let mut refused = false;
    let mut lost_said = false;
    let mut ev: Option<Evictor> = None;
    loop {
        if engine.stopping() {
            return;
        }
        let now = Instant::now();
        if conn.is_none() && !refused && now >= next_connect {
            next_connect = now + RECONNECT_EVERY;
            match register(&cfg, range, engine.budget.pages()) {
                Ok((s, grant)) => {
                    target = range.clamp_bytes(grant);
                    log::info!(
                        "elastic budget: registered with the node daemon at {}, granted {} MiB \
                         (range {}..{} MiB)",
                        cfg.socket.display(),
                        (target * PAGE_SIZE) >> 20,
                        (range.floor * PAGE_SIZE) >> 20,
                        (range.ceiling * PAGE_SIZE) >> 20
                    );
                    conn = Some(s);
                    lost_said = false;
                    next_report = now;
                }
                Err(Failure::Refused(why)) => {
                    log::warn!(
                        "elastic budget: the node daemon at {} refused the registration ({why}); \
                         the local budget stays at {} MiB",
                        cfg.socket.display(),
                        (engine.budget.pages() * PAGE_SIZE) >> 20
                    );
                    refused = true;
                }
                Err(Failure::Unreachable(why)) => {
                    if !lost_said {
                        log::warn!(
                            "elastic budget: no node daemon answers at {} ({why}); the local \
                             budget stays at {} MiB and the region registers when one answers",
                            cfg.socket.display(),
                            (engine.budget.pages() * PAGE_SIZE) >> 20
                        );
                        lost_said = true;
                    }
                }
            }
        }
        let shrinking = apply(&engine, &mut ev, &mut *store, target);
        if let Some(s) = &conn {
            if Instant::now() >= next_report {
                next_report = Instant::now() + REPORT_EVERY;
                if proto::send(s, &report(&engine), None).is_err() {
                    conn = None;
                    said_gone(&cfg, &engine, &mut lost_said);
                    continue;
                }
            }
        }
        let wait = if shrinking {
            Duration::ZERO
        } else if conn.is_some() {
            next_report.saturating_duration_since(Instant::now())
        } else {
            RECONNECT_EVERY
        };
        if wait_readable(&engine, conn.as_ref(), wait) {
            let s = conn.as_ref().expect("readable only with a connection");
            match proto::recv::<Reply>(s) {
                Ok((Reply::Limit { limit_bytes, .. }, _)) => {
                    target = range.clamp_bytes(limit_bytes)
                }
                Ok((Reply::Error { error }, _)) => {
                    log::warn!("elastic budget: the node daemon ended the registration: {error}");
                    conn = None;
                    refused = true;
                }
                Ok(_) => {}
                Err(_) => {
                    conn = None;
                    said_gone(&cfg, &engine, &mut lost_said);
                }
            }
        }
    }
}

fn said_gone(cfg: &ElasticBudget, engine: &Engine, said: &mut bool) {
    if !*said {
        log::warn!(
            "elastic budget: the node daemon at {} went away; the local budget stays at {} MiB \
             and the region registers again when a daemon answers",
            cfg.socket.display(),
            (engine.budget.pages() * PAGE_SIZE) >> 20
        );
        *said = true;
    }
}

/// Why a registration failed.
enum Failure {
    /// The daemon answered no (it will not say yes later).
    Refused(String),
    /// No daemon answered (or it went away mid-registration).
    Unreachable(String),
}

/// Registers as a far program holding `pages` pages; returns the connection and the grant.
fn register(cfg: &ElasticBudget, range: Range, pages: usize) -> Result<(UnixStream, u64), Failure> {
    // Held from the start (`gleaner_fds::connect_unix`): the program must not close or replace
    // the daemon's connection.
    let s =
        gleaner_fds::connect_unix(&cfg.socket).map_err(|e| Failure::Unreachable(e.to_string()))?;
    let unreachable = |e: &dyn std::fmt::Display| Failure::Unreachable(e.to_string());
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| unreachable(&e))?;
    s.set_write_timeout(Some(Duration::from_millis(200)))
        .map_err(|e| unreachable(&e))?;
    let req = Request::Register {
        version: proto::VERSION,
        kind: Kind::FarProgram,
        name: cfg.name.clone(),
        weight: 1.0,
        floor_bytes: (range.floor * PAGE_SIZE) as u64,
        ceiling_bytes: (range.ceiling * PAGE_SIZE) as u64,
        resident_bytes: (pages * PAGE_SIZE) as u64,
    };
    proto::send(&s, &req, None).map_err(|e| unreachable(&e))?;
    match proto::recv::<Reply>(&s).map_err(|e| unreachable(&e))?.0 {
        Reply::Registered { limit_bytes, .. } => {
            s.set_read_timeout(None).map_err(|e| unreachable(&e))?;
            Ok((s, limit_bytes))
        }
        Reply::Error { error } => Err(Failure::Refused(error)),
        other => Err(Failure::Refused(format!("unexpected reply {other:?}"))),
    }
}

/// The region's counters as a report.
fn report(engine: &Engine) -> Request {
    let c = &engine.counters;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    Request::Report {
        far_faults: get(&c.remote_faults),
        far_pages_in: get(&c.bytes_in) / PAGE_SIZE as u64,
        timed_faults: get(&c.timed_faults),
        timed_ns: get(&c.lookup_ns) + get(&c.fetch_ns) + get(&c.install_ns),
        resident_bytes: (engine.budget.resident() * PAGE_SIZE) as u64,
        budget_bytes: (engine.budget.pages() * PAGE_SIZE) as u64,
    }
}

/// Moves the budget towards `target` pages: at once up, one slice of evictions down. Returns
/// whether it is still above the target (more to evict).
fn apply(
    engine: &Engine,
    ev: &mut Option<Evictor>,
    store: &mut dyn StoreHandle,
    target: usize,
) -> bool {
    let b = &engine.budget;
    let before = b.pages();
    if target > before {
        b.grow(target);
        engine.budget_changed(target);
        log::debug!("elastic budget: grew from {before} to {target} pages");
        return false;
    }
    if target == before {
        return false;
    }
    let until = Instant::now() + SHRINK_SLICE;
    loop {
        let pages = b.pages();
        if pages <= target {
            break;
        }
        if b.resident() <= target {
            b.lower(target);
            break;
        }
        let ev = match ev {
            Some(ev) => ev,
            None => match Evictor::try_new(engine, false) {
                Ok(made) => ev.insert(made),
                Err(e) => {
                    // Shrinking then waits for what is resident to fall by itself.
                    log::warn!("elastic budget: cannot evict to shrink: {e}");
                    return false;
                }
            },
        };
        let n = evict_for_shrink(engine, ev, store);
        if n == 0 {
            // Paused around a fork, every candidate busy, or the memnode full: later.
            b.wait_progress(Duration::from_millis(5));
            break;
        }
        b.lower(pages.saturating_sub(n).max(target));
        if Instant::now() >= until {
            break;
        }
    }
    let after = b.pages();
    if after != before {
        engine.budget_changed(after);
    }
    after > target
}

/// Waits up to `wait` for `conn` to be readable or the region to stop; whether it is readable.
fn wait_readable(engine: &Engine, conn: Option<&UnixStream>, wait: Duration) -> bool {
    let mut fds = [
        libc::pollfd {
            fd: engine.stop.fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: conn.map_or(-1, |c| c.as_raw_fd()),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = wait.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: poll on two pollfd entries that live across the call (a negative fd is ignored).
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    n > 0 && fds[1].revents != 0
}
