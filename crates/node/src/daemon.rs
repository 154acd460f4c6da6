//! The node daemon: one per machine. It accepts registrations on a Unix socket, watches memory
//! pressure, runs the allocation policy every round and enforces every pool's grant.
//!
//! Enforcement, every tick: a pool holding more than its grant (measured from its memfd, not
//! taken from the runtime's word) is first asked to shrink (its grant is written to its control
//! area and pushed on its connection: the runtime evacuates and releases segments itself); if it
//! still holds too much after the grace period, or at once under severe pressure, the daemon
//! punches its segments itself, coldest first by the runtime's published order (a hint it
//! validates), bumping each segment's generation before the punch.
//!
//! Far programs (`gleaner run --local-mem FLOOR..CEILING`) register too: each round the local
//! memory that pressure allows ([`Config::elastic_budget`] at most) is arbitrated between them
//! and the soft pools taken together by time lost per second (`elastic.rs`); the soft pools'
//! share is then divided among them by the policy as before. A program's grant is pushed on its
//! connection and its pager applies it (growing at once, shrinking by evicting in the
//! background). Between rounds only the soft pools are cut under pressure: a program's floor
//! is the user's promise, and its grant above it falls at the next round.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::batch::Reclaimer;
use crate::policy::{self, Params, Policy, PolicyKind, PoolView};
use crate::pressure::{self, Level, Sample, Source};
use crate::proto::{self, Class, Kind, ProtoError, Reply, Request};
use crate::shared::{self, Control, PoolCounters, SEGMENT_BYTES};

/// The daemon's settings (the flags of `gleaner node`).
#[derive(Debug, Clone)]
pub struct Config {
    /// The registration socket.
    pub socket: PathBuf,
    /// The allocation policy.
    pub policy: PolicyKind,
    /// The policy's tunables.
    pub params: Params,
    /// Time between policy rounds (the dissertation: 5 s).
    pub interval: Duration,
    /// Time between pressure readings and enforcement passes.
    pub tick: Duration,
    /// How long a runtime has to shrink by itself before the daemon punches.
    pub grace: Duration,
    /// Memory to keep free for everything else, bytes.
    pub reserve: u64,
    /// The most all soft pools may hold together, bytes (default: idle memory).
    pub soft_budget: Option<u64>,
    /// The most the soft pools and the far programs' grants may total, bytes (default: idle
    /// memory plus what they hold, less the reserve).
    pub elastic_budget: Option<u64>,
    /// How grants move between far programs and the soft pools.
    pub elastic: crate::elastic::Params,
    /// Where pressure is read.
    pub source: Source,
    /// Exit after this long with no registration (for daemons started on demand).
    pub exit_when_idle: Option<Duration>,
    /// How the batch reclaimer (Hermes) drops.
    pub batch_reclaim: crate::batch::Mode,
}

struct Pool {
    id: u64,
    pid: i32,
    name: String,
    cgroup: String,
    memfd: OwnedFd,
    ctrl: Control,
    nseg: u64,
    weight: f64,
    floor: u64,
    ceiling: u64,
    limit: u64,
    lowered_at: Option<Instant>,
    conn: UnixStream,
    last: PoolCounters,
    registered: Instant,
    punched: u64,
}

impl Pool {
    fn resident(&self) -> u64 {
        shared::resident_bytes(&self.memfd).unwrap_or(0)
    }

    fn set_limit(&mut self, limit: u64, direct: bool) {
        let limit = limit.min(self.ceiling);
        if limit < self.limit {
            self.lowered_at = Some(Instant::now());
        }
        let changed = limit != self.limit;
        self.limit = limit;
        self.ctrl
            .word(shared::OFF_LIMIT)
            .store(limit, Ordering::SeqCst);
        if changed || direct {
            // A runtime that does not read (stopped) must not stall the daemon: the write has a
            // timeout and its failure is ignored (the control area carries the grant anyway).
            let _ = proto::send(
                &self.conn,
                &Reply::Limit {
                    limit_bytes: limit,
                    direct,
                },
                None,
            );
        }
    }
}

/// A registered far program (a pager with an elastic budget).
struct Program {
    id: u64,
    pid: i32,
    name: String,
    cgroup: String,
    floor: u64,
    ceiling: u64,
    limit: u64,
    conn: UnixStream,
    /// Its latest report (cumulative counters) and the one at the last round.
    now: Report,
    last: Report,
    /// Mean far-fault cost, ns (the last known; a default until a timed fault is reported).
    cost_ns: f64,
    /// Time lost per second over the last round, ns/s.
    loss: f64,
    registered: Instant,
}

/// A far program's cumulative counters, as reported.
#[derive(Debug, Clone, Copy, Default)]
struct Report {
    far_faults: u64,
    far_pages_in: u64,
    timed_faults: u64,
    timed_ns: u64,
    resident: u64,
    budget: u64,
}

/// The fault cost assumed for a program until it reports a timed fault: a fetch over a local
/// memnode's shared memory with decompression, measured around 20 us here.
const DEFAULT_FAULT_COST_NS: f64 = 20_000.0;

impl Program {
    fn set_limit(&mut self, limit: u64) {
        let limit = limit.clamp(self.floor, self.ceiling);
        if limit != self.limit {
            self.limit = limit;
            let _ = proto::send(
                &self.conn,
                &Reply::Limit {
                    limit_bytes: limit,
                    direct: false,
                },
                None,
            );
        }
    }

    /// What the arbitration (`elastic.rs`) sees of it, with the loss of its last round.
    fn claimant(&self) -> crate::elastic::Claimant {
        crate::elastic::Claimant {
            id: self.id,
            floor: self.floor,
            ceiling: self.ceiling,
            grant: self.limit,
            // The budget its pager applies: above the grant while it shrinks to it.
            holds: self.limit.max(self.now.budget),
            loss: self.loss,
        }
    }

    /// Closes the round: its loss since the last one, over `secs` seconds: far pages brought in
    /// (each a far fault, on demand or served ahead by the prefetcher; the faults alone where
    /// the pager does not report pages) times the mean far-fault cost.
    fn close_round(&mut self, secs: f64) {
        let faults = self
            .now
            .far_faults
            .saturating_sub(self.last.far_faults)
            .max(self.now.far_pages_in.saturating_sub(self.last.far_pages_in));
        let timed = self.now.timed_faults.saturating_sub(self.last.timed_faults);
        let ns = self.now.timed_ns.saturating_sub(self.last.timed_ns);
        if timed > 0 {
            self.cost_ns = ns as f64 / timed as f64;
        } else if self.now.timed_faults > 0 {
            self.cost_ns = self.now.timed_ns as f64 / self.now.timed_faults as f64;
        }
        self.loss = crate::elastic::fault_loss(faults, self.cost_ns, secs);
        self.last = self.now;
    }
}

struct State {
    pools: BTreeMap<u64, Pool>,
    programs: BTreeMap<u64, Program>,
    /// What soft pools and programs may total now (bytes).
    elastic_total: u64,
    next_id: u64,
    policy: Box<dyn Policy>,
    decisions: VecDeque<serde_json::Value>,
    sample: Sample,
    level: Level,
    budget: u64,
    direct_bytes: u64,
    direct_secs: f64,
    /// How fast others' memory grows, and the reserve kept for it now (the fixed reserve plus
    /// the growth over the reaction horizon, [`pressure::Growth`]).
    growth: pressure::Growth,
    reserve_now: u64,
    last_registration: Instant,
    errors: u64,
    /// Batch and latency-critical processes, and the batch reclaimer (Hermes).
    batch: Reclaimer,
}

/// A running daemon's shared state.
pub struct Daemon {
    cfg: Config,
    state: Mutex<State>,
    stop: AtomicBool,
    _lock: std::fs::File,
    /// The listening socket (a clone of the one [`Daemon::serve`] accepts on), shut down by
    /// [`Daemon::stop`] to wake the accept loop.
    listening: UnixListener,
}

/// Errors starting the daemon.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Another daemon holds the socket's lock.
    #[error("another gleaner node is running on {0} (its lock {0}.lock is held)")]
    Running(String),
    /// The socket could not be set up.
    #[error("{0}: {1}")]
    Io(String, io::Error),
    /// Pressure cannot be read.
    #[error("{0}")]
    Pressure(String),
}

impl Daemon {
    /// Takes the socket's lock, binds it and returns the daemon and its listener.
    pub fn bind(cfg: Config) -> Result<(Arc<Daemon>, UnixListener), StartError> {
        let sock = cfg.socket.clone();
        let show = sock.display().to_string();
        if let Some(dir) = sock.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| StartError::Io(dir.display().to_string(), e))?;
        }
        let lock_path = PathBuf::from(format!("{show}.lock"));
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| StartError::Io(lock_path.display().to_string(), e))?;
        if rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
            return Err(StartError::Running(show));
        }
        // We hold the lock: a socket file left there is a dead daemon's.
        let _ = std::fs::remove_file(&sock);
        let listener = UnixListener::bind(&sock).map_err(|e| StartError::Io(show.clone(), e))?;
        let sample = cfg.source.sample().map_err(StartError::Pressure)?;
        let policy = policy::build(cfg.policy, cfg.params.clone());
        // The budget is known before the first tick, so the first registrations get grants.
        let budget = pressure::budget(&sample, 0, cfg.reserve, cfg.soft_budget);
        let d = Arc::new(Daemon {
            state: Mutex::new(State {
                pools: BTreeMap::new(),
                programs: BTreeMap::new(),
                elastic_total: pressure::budget(&sample, 0, cfg.reserve, cfg.elastic_budget),
                next_id: 1,
                policy,
                decisions: VecDeque::new(),
                sample,
                level: Level::None,
                budget,
                direct_bytes: 0,
                direct_secs: 0.0,
                growth: pressure::Growth::default(),
                reserve_now: cfg.reserve,
                last_registration: Instant::now(),
                errors: 0,
                batch: Reclaimer::new(cfg.reserve, cfg.batch_reclaim),
            }),
            cfg,
            stop: AtomicBool::new(false),
            _lock: lock,
            listening: listener
                .try_clone()
                .map_err(|e| StartError::Io(show.clone(), e))?,
        });
        Ok((d, listener))
    }

    /// Asks the daemon to stop (its control loop and accept loop end soon after).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop: shutting the listening socket down makes a blocked accept
        // return (on Linux) even where the socket's file was removed (a test's directory gone),
        // which a connection to its path could no longer do; the daemon then hung for good.
        let _ = rustix::net::shutdown(&self.listening, rustix::net::Shutdown::Read);
        let _ = UnixStream::connect(&self.cfg.socket);
    }

    /// Whether [`Daemon::stop`] was called.
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Serves until stopped: the control loop on its own thread, connections on theirs.
    pub fn serve(self: &Arc<Daemon>, listener: UnixListener) {
        let me = self.clone();
        let control = std::thread::Builder::new()
            .name("node-control".into())
            .spawn(move || me.control_loop())
            .expect("spawn the control thread");
        for conn in listener.incoming() {
            if self.stopping() {
                break;
            }
            match conn {
                Ok(c) => {
                    let me = self.clone();
                    let _ = std::thread::Builder::new()
                        .name("node-conn".into())
                        .spawn(move || me.connection(c));
                }
                Err(e) => log::warn!("accept: {e}"),
            }
        }
        let _ = control.join();
        let _ = std::fs::remove_file(&self.cfg.socket);
    }

    fn connection(self: Arc<Daemon>, conn: UnixStream) {
        let (req, fd) = match proto::recv::<Request>(&conn) {
            Ok(r) => r,
            Err(ProtoError::Closed) => return,
            Err(e) => {
                self.refuse(&conn, &e.to_string());
                return;
            }
        };
        match req {
            Request::Report { .. } => {
                self.refuse(
                    &conn,
                    "a report comes on a far_program's registration, after register",
                );
            }
            Request::Status => {
                let state = self.status();
                let _ = proto::send(&conn, &Reply::Status { state }, None);
            }
            Request::MarkCgroup { path, class } => match self.mark_cgroup(&conn, &path, class) {
                Ok(n) => {
                    let _ = proto::send(&conn, &Reply::MarkedCgroup { processes: n }, None);
                }
                Err(e) => self.refuse(&conn, &e),
            },
            Request::Mark { pid, class } => match self.mark(&conn, pid, class) {
                Ok(()) => {
                    let _ = proto::send(&conn, &Reply::Marked { pid }, None);
                }
                Err(e) => self.refuse(&conn, &e),
            },
            Request::Register {
                version,
                kind,
                name,
                weight,
                floor_bytes,
                ceiling_bytes,
                resident_bytes,
            } => {
                let reg = self.register(
                    &conn,
                    fd,
                    RegisterArgs {
                        version,
                        kind,
                        name,
                        weight,
                        floor: floor_bytes,
                        ceiling: ceiling_bytes,
                        resident: resident_bytes,
                    },
                );
                let id = match reg {
                    Ok(id) => id,
                    Err(e) => {
                        self.refuse(&conn, &e);
                        return;
                    }
                };
                if kind == Kind::FarProgram {
                    self.follow_program(&conn, id);
                    return;
                }
                // The registration lives as long as the connection. Anything further the
                // client sends is a protocol error (and ends the registration).
                let r = proto::recv_raw(&conn);
                if let Ok((body, _)) = r {
                    let msg = String::from_utf8_lossy(&body)
                        .chars()
                        .take(80)
                        .collect::<String>();
                    self.refuse(&conn, &format!("unexpected message after register: {msg}"));
                }
                let mut st = self.state.lock().unwrap();
                if let Some(p) = st.pools.remove(&id) {
                    log::info!("pool {id} ({}, pid {}) left", p.name, p.pid);
                }
                st.last_registration = Instant::now();
            }
        }
    }

    /// Reads a registered far program's reports until its connection closes (or it sends
    /// anything else, which is refused), then drops the registration.
    fn follow_program(&self, conn: &UnixStream, id: u64) {
        loop {
            match proto::recv::<Request>(conn) {
                Ok((
                    Request::Report {
                        far_faults,
                        far_pages_in,
                        timed_faults,
                        timed_ns,
                        resident_bytes,
                        budget_bytes,
                    },
                    None,
                )) => {
                    let mut st = self.state.lock().unwrap();
                    if let Some(p) = st.programs.get_mut(&id) {
                        p.now = Report {
                            far_faults,
                            far_pages_in,
                            timed_faults,
                            timed_ns,
                            resident: resident_bytes,
                            budget: budget_bytes,
                        };
                    }
                }
                Ok((_, Some(_))) => {
                    self.refuse(conn, "a report carries no descriptor");
                    break;
                }
                Ok((other, None)) => {
                    let op = serde_json::to_value(&other)
                        .ok()
                        .and_then(|v| v.get("op").and_then(|o| o.as_str()).map(String::from))
                        .unwrap_or_default();
                    self.refuse(
                        conn,
                        &format!("a registered far_program sends only reports, not `{op}`"),
                    );
                    break;
                }
                Err(ProtoError::Closed) => break,
                Err(e) => {
                    self.refuse(conn, &e.to_string());
                    break;
                }
            }
        }
        let mut st = self.state.lock().unwrap();
        if let Some(p) = st.programs.remove(&id) {
            log::info!("program {id} ({}, pid {}) left", p.name, p.pid);
        }
        st.last_registration = Instant::now();
    }

    /// Registers a far program (no descriptor): its grant starts at its floor, or at what it
    /// holds (a re-registration after a daemon restart) where the total leaves room.
    fn register_program(
        &self,
        conn: &UnixStream,
        fd: Option<OwnedFd>,
        a: RegisterArgs,
    ) -> Result<u64, String> {
        if fd.is_some() {
            return Err("a far_program registers without a descriptor".into());
        }
        if a.ceiling == 0 {
            return Err("a far_program gives its ceiling_bytes (above 0)".into());
        }
        if a.floor > a.ceiling {
            return Err(format!(
                "floor_bytes {} above ceiling_bytes {}",
                a.floor, a.ceiling
            ));
        }
        let (pid, cgroup, write_conn) = registrant(conn)?;
        let mut st = self.state.lock().unwrap();
        let granted: u64 = st.programs.values().map(|p| p.limit).sum::<u64>()
            + st.pools.values().map(|p| p.limit).sum::<u64>();
        let free = st.elastic_total.saturating_sub(granted);
        let limit = a.resident.min(a.floor + free).clamp(a.floor, a.ceiling);
        let id = st.next_id;
        st.next_id += 1;
        send_registered(conn, id, limit)?;
        log::info!(
            "program {id} ({}, pid {pid}) registered: {}..{} MiB, grant {} MiB",
            a.name,
            a.floor >> 20,
            a.ceiling >> 20,
            limit >> 20
        );
        st.programs.insert(
            id,
            Program {
                id,
                pid,
                name: a.name,
                cgroup,
                floor: a.floor,
                ceiling: a.ceiling,
                limit,
                conn: write_conn,
                now: Report::default(),
                last: Report::default(),
                cost_ns: DEFAULT_FAULT_COST_NS,
                loss: 0.0,
                registered: Instant::now(),
            },
        );
        st.last_registration = Instant::now();
        Ok(id)
    }

    /// Marks `pid` for the batch reclaimer, if the caller may: the process's own user, or root.
    fn mark(&self, conn: &UnixStream, pid: i32, class: Class) -> Result<(), String> {
        let cred =
            rustix::net::sockopt::socket_peercred(conn).map_err(|e| format!("SO_PEERCRED: {e}"))?;
        use std::os::unix::fs::MetadataExt;
        let owner = std::fs::metadata(format!("/proc/{pid}"))
            .map_err(|_| format!("no process {pid}"))?
            .uid();
        let caller = cred.uid.as_raw();
        if caller != 0 && caller != owner {
            return Err(format!(
                "process {pid} belongs to uid {owner}, not to the caller (uid {caller})"
            ));
        }
        let mut st = self.state.lock().unwrap();
        st.batch.mark(pid, class);
        st.last_registration = Instant::now();
        Ok(())
    }

    /// Marks the cgroup at `path` for the batch reclaimer, if the caller may: the owner of the
    /// cgroup's directory, or root.
    fn mark_cgroup(&self, conn: &UnixStream, path: &str, class: Class) -> Result<u64, String> {
        let cred =
            rustix::net::sockopt::socket_peercred(conn).map_err(|e| format!("SO_PEERCRED: {e}"))?;
        use std::os::unix::fs::MetadataExt;
        let dir = std::fs::canonicalize(path).map_err(|e| format!("cgroup {path}: {e}"))?;
        if !dir.join("cgroup.procs").is_file() {
            return Err(format!(
                "{} is not a cgroup directory (it has no cgroup.procs)",
                dir.display()
            ));
        }
        let owner = std::fs::metadata(&dir)
            .map_err(|e| format!("cgroup {}: {e}", dir.display()))?
            .uid();
        let caller = cred.uid.as_raw();
        if caller != 0 && caller != owner {
            return Err(format!(
                "cgroup {} belongs to uid {owner}, not to the caller (uid {caller})",
                dir.display()
            ));
        }
        let mut st = self.state.lock().unwrap();
        let n = st
            .batch
            .mark_cgroup(&dir, class)
            .map_err(|e| format!("cgroup {}: {e}", dir.display()))?;
        st.last_registration = Instant::now();
        Ok(n as u64)
    }

    fn refuse(&self, conn: &UnixStream, error: &str) {
        log::warn!("refused a client: {error}");
        self.state.lock().unwrap().errors += 1;
        let _ = proto::send(
            conn,
            &Reply::Error {
                error: error.to_string(),
            },
            None,
        );
    }

    fn register(
        &self,
        conn: &UnixStream,
        fd: Option<OwnedFd>,
        a: RegisterArgs,
    ) -> Result<u64, String> {
        if a.version != proto::VERSION {
            return Err(format!(
                "protocol version {} (this daemon speaks {})",
                a.version,
                proto::VERSION
            ));
        }
        if a.kind == Kind::LatencyCritical {
            return Err(
                "kind latency_critical is not served by this daemon yet (only soft_pool and \
                 far_program; mark a latency-critical process with `gleaner node mark`)"
                    .into(),
            );
        }
        if a.name.is_empty() || a.name.len() > 200 {
            return Err("name: give 1 to 200 bytes".into());
        }
        if !a.weight.is_finite() || a.weight <= 0.0 || a.weight > 1e6 {
            return Err(format!(
                "weight {}: give a number above 0 and at most 1e6",
                a.weight
            ));
        }
        if a.kind == Kind::FarProgram {
            return self.register_program(conn, fd, a);
        }
        let fd = fd.ok_or("register a soft_pool with its memfd attached (SCM_RIGHTS)")?;
        let (nseg, ctrl) = shared::adopt_pool_memfd(&fd)?;
        let capacity = nseg * SEGMENT_BYTES;
        let ceiling = if a.ceiling == 0 {
            capacity
        } else {
            a.ceiling.min(capacity)
        };
        if a.floor > ceiling {
            return Err(format!("floor {} above ceiling {ceiling}", a.floor));
        }
        let (pid, cgroup, write_conn) = registrant(conn)?;
        let mut st = self.state.lock().unwrap();
        let granted: u64 = st.pools.values().map(|p| p.limit).sum();
        let budget = st.budget;
        let admit = st
            .policy
            .admit(granted, budget, a.resident, &self.cfg.params);
        // A re-registration (after a daemon restart) keeps what it holds if the budget allows.
        let free = budget.saturating_sub(granted);
        let limit = admit
            .max(a.resident.min(free))
            .max(a.floor.min(free))
            .min(ceiling);
        let id = st.next_id;
        st.next_id += 1;
        let counters = ctrl.counters();
        let mut pool = Pool {
            id,
            pid,
            name: a.name,
            cgroup,
            memfd: fd,
            ctrl,
            nseg,
            weight: a.weight,
            floor: a.floor,
            ceiling,
            limit: 0,
            lowered_at: None,
            conn: write_conn,
            last: counters,
            registered: Instant::now(),
            punched: 0,
        };
        pool.ctrl
            .word(shared::OFF_LIMIT)
            .store(limit, Ordering::SeqCst);
        pool.limit = limit;
        if pool.resident() > limit + SEGMENT_BYTES {
            pool.lowered_at = Some(Instant::now());
        }
        send_registered(conn, id, limit)?;
        log::info!(
            "pool {id} ({}, pid {pid}) registered: {nseg} segments, grant {} MiB",
            pool.name,
            limit >> 20
        );
        st.pools.insert(id, pool);
        st.last_registration = Instant::now();
        Ok(id)
    }

    fn control_loop(&self) {
        if crate::priority::raise_this_thread(crate::priority::CONTROL_NICE) {
            log::debug!("control loop at nice {}", crate::priority::CONTROL_NICE);
        } else {
            log::info!(
                "the control loop could not take nice {} (needs root or CAP_SYS_NICE): on a \
                 busy machine it reads pressure late",
                crate::priority::CONTROL_NICE
            );
        }
        let mut last_round = Instant::now();
        let started = Instant::now();
        // Five ticks, at least 50 ms: how long others' growth is provided for.
        let horizon_s = (self.cfg.tick.as_secs_f64() * 5.0).max(0.05);
        while !self.stopping() {
            std::thread::sleep(self.cfg.tick);
            let sample = match self.cfg.source.sample() {
                Ok(s) => s,
                Err(e) => {
                    log::warn!("reading pressure: {e}");
                    continue;
                }
            };
            let mut st = self.state.lock().unwrap();
            let st = &mut *st;
            let resident: BTreeMap<u64, u64> =
                st.pools.iter().map(|(&id, p)| (id, p.resident())).collect();
            let soft: u64 = resident.values().sum();
            let programs: u64 = st.programs.values().map(|p| p.now.resident).sum();
            st.sample = sample;
            let others =
                (sample.total.saturating_sub(sample.available)).saturating_sub(soft + programs);
            st.growth.observe(started.elapsed().as_secs_f64(), others);
            let reserve = self.cfg.reserve + st.growth.headroom(horizon_s);
            st.reserve_now = reserve;
            st.level = pressure::level(&sample, reserve);
            st.elastic_total =
                pressure::budget(&sample, soft + programs, reserve, self.cfg.elastic_budget);
            let to_programs: u64 = st.programs.values().map(|p| p.limit).sum();
            st.budget = pressure::budget(&sample, soft, reserve, self.cfg.soft_budget)
                .min(st.elastic_total.saturating_sub(to_programs));
            let now = Instant::now();
            let round_due = now.duration_since(last_round) >= self.cfg.interval;
            let granted: u64 = st.pools.values().map(|p| p.limit).sum();
            if round_due && !(st.pools.is_empty() && st.programs.is_empty()) {
                let secs = now.duration_since(last_round).as_secs_f64();
                last_round = now;
                self.round(st, &resident, secs);
            } else {
                // Pressure between rounds: the far programs give first what their grants and
                // the soft pools' floors exceed the total by (the least losing first), then the
                // soft pools are cut, the cheapest rebuilders first.
                self.shed_programs(st);
                if granted > st.budget {
                    self.cut(st, &resident);
                }
            }
            self.enforce(st, &resident);
            st.batch.tick(sample.available);
            if let Some(idle) = self.cfg.exit_when_idle {
                if st.pools.is_empty()
                    && st.programs.is_empty()
                    && st.batch.is_empty()
                    && st.last_registration.elapsed() >= idle
                {
                    log::info!("no registration for {idle:?}: exiting");
                    self.stop();
                }
            }
        }
    }

    fn views(&self, st: &State, resident: &BTreeMap<u64, u64>, secs: f64) -> Vec<PoolView> {
        st.pools
            .values()
            .map(|p| PoolView {
                id: p.id,
                weight: p.weight,
                floor: p.floor,
                ceiling: p.ceiling,
                limit: p.limit,
                // Its data segments: the control area's pages are not part of the grant.
                resident: resident
                    .get(&p.id)
                    .copied()
                    .unwrap_or(0)
                    .saturating_sub(shared::control_resident_bytes(&p.memfd)),
                delta: p.ctrl.counters().since(&p.last),
                secs,
                ghost_bytes: p.ctrl.word(shared::OFF_GHOST_BYTES).load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Arbitrates local memory between the far programs and the soft pools taken together
    /// (`elastic.rs`), applies the programs' grants, and returns the soft pools' share.
    fn arbitrate(
        &self,
        st: &mut State,
        views: &[PoolView],
        secs: f64,
        record: &mut Vec<serde_json::Value>,
    ) -> u64 {
        use crate::elastic::{arbitrate, Claimant};
        let mut claimants: Vec<Claimant> = st
            .programs
            .values_mut()
            .map(|p| {
                p.close_round(secs);
                p.claimant()
            })
            .collect();
        if !views.is_empty() {
            let rebuild_ns: u64 = views.iter().map(|v| v.delta.rebuild_ns).sum();
            claimants.push(Claimant {
                id: 0,
                floor: views.iter().map(|v| v.floor).sum(),
                ceiling: views
                    .iter()
                    .map(|v| v.ceiling)
                    .sum::<u64>()
                    .min(self.cfg.soft_budget.unwrap_or(u64::MAX)),
                grant: views.iter().map(|v| v.limit).sum(),
                holds: views.iter().map(|v| v.limit.max(v.resident)).sum(),
                loss: if secs > 0.0 {
                    rebuild_ns as f64 / secs
                } else {
                    0.0
                },
            });
        }
        let grants = arbitrate(&claimants, st.elastic_total, &self.cfg.elastic);
        let mut soft = 0;
        for g in grants {
            if g.id == 0 {
                soft = g.grant;
                continue;
            }
            if let Some(p) = st.programs.get_mut(&g.id) {
                if g.grant != p.limit {
                    record.push(json!({"program": g.id, "name": p.name, "from": p.limit,
                                       "to": g.grant, "loss_ns_per_s": p.loss, "why": g.why}));
                }
                p.set_limit(g.grant);
            }
        }
        soft
    }

    fn round(&self, st: &mut State, resident: &BTreeMap<u64, u64>, secs: f64) {
        let views = self.views(st, resident, secs);
        let mut record = Vec::new();
        if !st.programs.is_empty() {
            let soft = self.arbitrate(st, &views, secs, &mut record);
            st.budget = st.budget.min(soft);
        }
        let decisions = if views.is_empty() {
            Vec::new()
        } else {
            st.policy.round(&views, st.budget)
        };
        let direct = st.level == Level::Severe;
        for d in &decisions {
            if let Some(p) = st.pools.get_mut(&d.id) {
                p.last = p.ctrl.counters();
                if d.limit != p.limit {
                    record.push(json!({"pool": d.id, "name": p.name, "from": p.limit, "to": d.limit, "why": d.why}));
                }
                p.set_limit(d.limit, direct);
            }
        }
        push_decisions(st, record);
    }

    /// Between rounds: where the far programs' grants and the soft pools' floors exceed the
    /// elastic total, lowers the programs' grants at once (`elastic::shed`: the least losing
    /// first, down to their floors) rather than at the next round, and lowers the soft budget
    /// to what is left.
    fn shed_programs(&self, st: &mut State) {
        if st.programs.is_empty() {
            return;
        }
        let soft_floors: u64 = st.pools.values().map(|p| p.floor).sum();
        let room = st.elastic_total.saturating_sub(soft_floors);
        let to_programs: u64 = st.programs.values().map(|p| p.limit).sum();
        if to_programs <= room {
            return;
        }
        let claimants: Vec<crate::elastic::Claimant> =
            st.programs.values().map(Program::claimant).collect();
        let mut record = Vec::new();
        for g in crate::elastic::shed(&claimants, room) {
            if let Some(p) = st.programs.get_mut(&g.id) {
                if g.grant < p.limit {
                    record.push(json!({"program": g.id, "name": p.name, "from": p.limit,
                                       "to": g.grant, "loss_ns_per_s": p.loss,
                                       "why": format!("between rounds: {}", g.why)}));
                    p.set_limit(g.grant);
                }
            }
        }
        let to_programs: u64 = st.programs.values().map(|p| p.limit).sum();
        st.budget = st.budget.min(st.elastic_total.saturating_sub(to_programs));
        push_decisions(st, record);
    }

    fn cut(&self, st: &mut State, resident: &BTreeMap<u64, u64>) {
        let views = self.views(st, resident, 1.0);
        let mut order: Vec<usize> = (0..views.len()).collect();
        let cost = |v: &PoolView| v.weight * v.delta.rebuild_ns as f64;
        order.sort_by(|&a, &b| cost(&views[a]).total_cmp(&cost(&views[b])));
        let mut limits: Vec<u64> = views.iter().map(|v| v.limit).collect();
        policy::fit(&views, &mut limits, st.budget, &order);
        let direct = st.level == Level::Severe;
        for (v, l) in views.iter().zip(limits) {
            if let Some(p) = st.pools.get_mut(&v.id) {
                if l < p.limit {
                    p.set_limit(l, direct);
                }
            }
        }
    }

    fn enforce(&self, st: &mut State, resident: &BTreeMap<u64, u64>) {
        let severe = st.level == Level::Severe;
        for p in st.pools.values_mut() {
            let held = resident.get(&p.id).copied().unwrap_or(0);
            // One segment of slack covers the control area's own pages.
            if held <= p.limit + SEGMENT_BYTES {
                p.lowered_at = None;
                continue;
            }
            let late = p.lowered_at.is_none_or(|t| t.elapsed() >= self.cfg.grace);
            if !(severe || late) {
                continue;
            }
            let count = (held - p.limit).div_ceil(SEGMENT_BYTES) as usize;
            let t0 = Instant::now();
            let n = direct_shrink(p, count);
            let freed = held.saturating_sub(p.resident());
            st.direct_secs += t0.elapsed().as_secs_f64();
            st.direct_bytes += freed;
            if n > 0 {
                log::info!(
                    "pool {} ({}, pid {}): punched {n} segments ({} MiB) {}",
                    p.id,
                    p.name,
                    p.pid,
                    freed >> 20,
                    if severe {
                        "under severe pressure"
                    } else {
                        "after the grace period"
                    }
                );
            }
        }
    }

    /// The daemon's state as JSON (`gleaner node status`).
    pub fn status(&self) -> serde_json::Value {
        let st = self.state.lock().unwrap();
        let pools: Vec<serde_json::Value> = st
            .pools
            .values()
            .map(|p| {
                let c = p.ctrl.counters();
                json!({
                    "id": p.id, "pid": p.pid, "name": p.name, "kind": Kind::SoftPool, "cgroup": p.cgroup,
                    "segments": p.nseg, "weight": p.weight, "floor": p.floor, "ceiling": p.ceiling,
                    "limit": p.limit, "resident": p.resident(),
                    "used_reported": p.ctrl.word(shared::OFF_USED).load(Ordering::Relaxed),
                    "hits": c.hits, "misses": c.misses, "victim_hits": c.vhits,
                    "rebuild_ns": c.rebuild_ns, "miss_bytes": c.miss_bytes,
                    "punched_segments": p.punched,
                    "released_segments": p.ctrl.word(shared::OFF_RELEASED).load(Ordering::Relaxed),
                    "heartbeat": p.ctrl.word(shared::OFF_HEARTBEAT).load(Ordering::Relaxed),
                    "utility": st.policy.utility(p.id),
                    "share": p.limit as f64 / st.elastic_total.max(1) as f64,
                    "registered_secs": p.registered.elapsed().as_secs_f64(),
                })
            })
            .collect();
        let total = st.elastic_total.max(1) as f64;
        let programs: Vec<serde_json::Value> = st
            .programs
            .values()
            .map(|p| {
                json!({
                    "id": p.id, "pid": p.pid, "name": p.name, "kind": Kind::FarProgram,
                    "cgroup": p.cgroup, "floor": p.floor, "ceiling": p.ceiling, "limit": p.limit,
                    "share": p.limit as f64 / total,
                    "budget_applied": p.now.budget, "resident": p.now.resident,
                    "far_faults": p.now.far_faults, "far_pages_in": p.now.far_pages_in,
                    "fault_cost_ns": p.cost_ns,
                    "loss_ns_per_s": p.loss,
                    "registered_secs": p.registered.elapsed().as_secs_f64(),
                })
            })
            .collect();
        json!({
            "pid": std::process::id(),
            "elastic_total": st.elastic_total,
            "programs": programs,
            "policy": self.cfg.policy,
            "budget": st.budget,
            "level": st.level,
            "total": st.sample.total,
            "available": st.sample.available,
            "psi_some_avg10": st.sample.some_avg10,
            "psi_full_avg10": st.sample.full_avg10,
            "direct_punched_bytes": st.direct_bytes,
            "others_growth_bytes_per_s": st.growth.rate() as u64,
            "reserve_now": st.reserve_now,
            "direct_punch_secs": st.direct_secs,
            "refused_clients": st.errors,
            "pools": pools,
            "decisions": st.decisions,
            "batch": st.batch.status(),
        })
    }
}

struct RegisterArgs {
    version: u32,
    kind: Kind,
    name: String,
    weight: f64,
    floor: u64,
    ceiling: u64,
    resident: u64,
}

/// Punches up to `count` of `p`'s segments, coldest first; returns how many.
fn direct_shrink(p: &mut Pool, count: usize) -> usize {
    let nseg = p.nseg as u32;
    let len =
        (p.ctrl.word(shared::OFF_COLD_LEN).load(Ordering::Acquire) as usize).min(nseg as usize);
    let hint: Vec<u32> = (0..len)
        .map(|i| p.ctrl.cold(i).load(Ordering::Relaxed))
        .collect();
    let fd = p.memfd.as_fd();
    let pick = crate::evict::pick(&hint, nseg, count, &|s| shared::segment_has_data(fd, s));
    let mut n = 0;
    for s in pick {
        // The generation moves first: a reader that copies while (or after) the punch runs sees
        // it changed when it re-checks, and takes a miss.
        p.ctrl.gen(s).fetch_add(1, Ordering::SeqCst);
        if shared::punch_segment(fd, s).is_ok() {
            n += 1;
        }
    }
    p.punched += n as u64;
    p.ctrl
        .word(shared::OFF_PUNCHED)
        .fetch_add(n as u64, Ordering::Relaxed);
    n
}

/// Keeps a round's (or a between-rounds shed's) changes, if any, among the last 32 decisions
/// `gleaner node status` shows.
fn push_decisions(st: &mut State, record: Vec<serde_json::Value>) {
    if record.is_empty() {
        return;
    }
    st.decisions
        .push_back(json!({"at_ms": unix_ms(), "budget": st.budget,
        "elastic_total": st.elastic_total, "level": st.level, "changes": record}));
    while st.decisions.len() > 32 {
        st.decisions.pop_front();
    }
}

/// Tells a client on `conn` it is registered as `id` with a grant of `limit` bytes.
fn send_registered(conn: &UnixStream, id: u64, limit: u64) -> Result<(), String> {
    proto::send(
        conn,
        &Reply::Registered {
            id,
            limit_bytes: limit,
        },
        None,
    )
    .map_err(|e| e.to_string())
}

/// Who registers on `conn`: its pid (from the socket's credentials), its cgroup, and the
/// connection to push grants on (writes time out after 100 ms: a stalled client never holds the
/// daemon up).
fn registrant(conn: &UnixStream) -> Result<(i32, String, UnixStream), String> {
    let cred =
        rustix::net::sockopt::socket_peercred(conn).map_err(|e| format!("SO_PEERCRED: {e}"))?;
    let pid = cred.pid.as_raw_nonzero().get();
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map(|s| s.trim().rsplit("::").next().unwrap_or("").to_string())
        .unwrap_or_default();
    let write_conn = conn.try_clone().map_err(|e| e.to_string())?;
    write_conn
        .set_write_timeout(Some(Duration::from_millis(100)))
        .map_err(|e| e.to_string())?;
    Ok((pid, cgroup, write_conn))
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
