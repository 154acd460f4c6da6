//! The pool store: far pages spread over several memnodes, each extent of the region written to
//! `replicas` of them, so that losing a memnode loses nothing.
//!
//! # Placement
//!
//! The region is cut into extents of [`EXTENT_PAGES`] pages (8 MiB). An extent is placed on its
//! first write-back: `replicas` distinct live memnodes, each chosen by the power of two choices
//! (two members drawn at random, the one with fewer extents per byte of capacity wins), as
//! Infiniswap places its slabs. A placement is one `u64` per extent (member index + 1 in each
//! byte), read without locks on every fetch and write-back.
//!
//! # Reads, writes and failures
//!
//! A write-back stages every page once (one encoding, one version) into a batch per member of
//! its extent and sends the batches; it succeeds when every page reached at least one live
//! member. A fetch asks, for each page, the live replica that has answered fastest (an average
//! of its recent reads). Each member's connections replace themselves within the member's lease
//! (see `socket.rs`); a member that stays unreachable, refuses the session, or returns a blob
//! that does not open is **lost**: it is never asked again, its pages are read from another
//! replica, and the repair thread re-replicates every extent it held onto another member,
//! copying the pages from a survivor. The program stops (exit 86) only when every replica of a
//! page it needs is lost; the message names them and why.
//!
//! Re-replication is race-free with the write-backs going on meanwhile: the new placement is
//! published first (later write-backs go to the new member too), the copy then waits for the
//! write-backs staged under the old placement, and each page is copied with its version, which
//! the memnode compares (protocol v4): a copy can never replace a newer blob. Pages whose
//! version moved during the copy are copied again.
//!
//! A pool always uses the socket data path (even for `unix:` memnodes): shared-memory slabs are
//! one host's memory, which replication across hosts is meant to survive.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gleaner_proto::{ConnectOptions, Endpoint, PageBatch, PendingRead, SessionKey, Token};
use serde::Serialize;

use super::coded::CodedStore;
use super::socket::{Forgets, Link, MemnodeSession, FORGET_BATCH};
use super::{
    zeroed_atomics, Bell, BlobHandle, BlobStore, FarCopy, PageStore, StoreError, StoreStats,
};
use crate::codec::versions::Versions;
use crate::codec::{Codec, Encoded, ENCODE_ROOM};
use crate::PagerError;

mod repair;

/// Pages per extent: the unit of placement and re-replication (8 MiB).
pub(crate) const EXTENT_PAGES: u64 = 2048;

/// The most replicas of an extent a program may ask for: a placement word holds 8 members, and
/// while an extent moves it holds its old members and their replacements.
pub const MAX_REPLICAS: usize = 4;

/// Members one placement word holds (one byte each).
const WORD_MEMBERS: usize = 8;

/// The most memnodes in a pool (a member index + 1 fits a byte).
pub const MAX_MEMNODES: usize = 255;

/// How long a replicated pool tries to reconnect to a memnode before giving it up.
const REPLICATED_RECONNECT_WINDOW: Duration = Duration::from_secs(1);

/// One memnode of the pool.
struct Member {
    session: Arc<MemnodeSession>,
    alive: AtomicBool,
    /// Why it was lost (empty while alive).
    lost_because: Mutex<String>,
    /// Extents placed on it.
    extents: AtomicU64,
    /// Average latency of its recent reads, in ns (0: none yet).
    read_ns: AtomicU64,
    /// Pages read from it and written to it.
    pages_read: AtomicU64,
    pages_written: AtomicU64,
    /// It asked its clients to leave (`gleaner memnode drain`): no new extent goes there, and
    /// its extents move to other members.
    draining: AtomicBool,
    /// Its extents moved away and its session was ended.
    drained: AtomicBool,
}

impl Member {
    /// A live member on `session`, with nothing placed on it yet.
    fn new(session: MemnodeSession) -> Member {
        Member {
            session: Arc::new(session),
            alive: AtomicBool::new(true),
            lost_because: Mutex::new(String::new()),
            extents: AtomicU64::new(0),
            read_ns: AtomicU64::new(0),
            pages_read: AtomicU64::new(0),
            pages_written: AtomicU64::new(0),
            draining: AtomicBool::new(false),
            drained: AtomicBool::new(false),
        }
    }
}

/// The pool and its placement, shared by the store, its handles and the repair thread.
struct Pool {
    members: Vec<Member>,
    replicas: usize,
    /// Per extent: member index + 1 per byte, 0 where unplaced.
    placement: Box<[AtomicU64]>,
    /// Per extent: the members of its placement still being filled by re-replication, which
    /// take its writes but must not serve its reads yet (packed like `placement`).
    filling: Box<[AtomicU64]>,
    /// Per extent: write-backs staged and not yet committed.
    inflight: Box<[AtomicU32]>,
    /// Per region page: the version of its blob on the memnodes (0: none there): the codec
    /// layer's table, read here to name far copies to drop and to bound re-replication.
    versions: Versions,
    /// Wakes the repair thread (a member was lost, or the store is closing).
    wake: (Mutex<bool>, Condvar),
    stop: AtomicBool,
    rng: AtomicU64,
    pages_repaired: AtomicU64,
    extents_repaired: AtomicU64,
    /// Time spent copying pages to new replicas, ns.
    repair_ns: AtomicU64,
    /// Far copies of resident pages to drop, on every member holding them.
    forgets: Forgets,
}

/// Unpacks a placement word into member indices.
fn members_of(word: u64) -> impl Iterator<Item = usize> {
    (0..WORD_MEMBERS)
        .map(move |k| ((word >> (8 * k)) & 0xFF) as usize)
        .take_while(|&b| b != 0)
        .map(|b| b - 1)
}

/// Packs member indices (at most [`WORD_MEMBERS`]) into a placement word.
fn pack(members: &[usize]) -> u64 {
    members
        .iter()
        .enumerate()
        .fold(0, |w, (k, &m)| w | ((m as u64 + 1) << (8 * k)))
}

impl Pool {
    /// A pool of `members`, its extents placed as `placement` and `filling` say, nothing in
    /// flight or repaired yet.
    fn new(
        members: Vec<Member>,
        replicas: usize,
        placement: Box<[AtomicU64]>,
        filling: Box<[AtomicU64]>,
        versions: Versions,
    ) -> Pool {
        let seed: [u8; 8] = gleaner_proto::random_bytes();
        Pool {
            members,
            replicas,
            inflight: (0..placement.len()).map(|_| AtomicU32::new(0)).collect(),
            placement,
            filling,
            versions,
            wake: (Mutex::new(false), Condvar::new()),
            stop: AtomicBool::new(false),
            rng: AtomicU64::new(u64::from_le_bytes(seed) | 1),
            pages_repaired: AtomicU64::new(0),
            extents_repaired: AtomicU64::new(0),
            repair_ns: AtomicU64::new(0),
            forgets: Forgets::default(),
        }
    }

    /// Sends the notes of copies to drop while at least `at_least` wait, each to the members
    /// its page's extent is placed on (those being filled too: a copy made there since is at
    /// the same version).
    fn send_forgets(&self, at_least: usize) {
        self.forgets.send(at_least, &mut |copies| {
            let mut per_member = vec![Vec::new(); self.members.len()];
            for &(page, version) in copies {
                let extent = (page / EXTENT_PAGES) as usize;
                let word = self
                    .placement
                    .get(extent)
                    .map_or(0, |w| w.load(Ordering::Relaxed));
                for m in members_of(word) {
                    per_member[m].push((page, version));
                }
            }
            let mut dropped = 0;
            for (m, list) in per_member.iter().enumerate() {
                if !list.is_empty() && self.alive(m) {
                    dropped += self.members[m].session.forget(list)?;
                }
            }
            Ok(dropped)
        });
    }

    fn alive(&self, m: usize) -> bool {
        self.members[m].alive.load(Ordering::Acquire)
    }

    fn draining(&self, m: usize) -> bool {
        self.members[m].draining.load(Ordering::Acquire)
    }

    fn name(&self, m: usize) -> String {
        self.members[m].session.endpoint().to_string()
    }

    /// Marks member `m` lost because of `why` (once), and wakes the repair thread.
    fn lose(&self, m: usize, why: &str) {
        let member = &self.members[m];
        *member.lost_because.lock().expect("lost lock") = why.to_string();
        if member.alive.swap(false, Ordering::AcqRel) {
            log::error!(
                "memnode {} is lost ({why}); its extents are re-replicated from the other replicas",
                self.name(m)
            );
            let (flag, cv) = &self.wake;
            *flag.lock().expect("wake lock") = true;
            cv.notify_all();
        }
    }

    /// A pseudo-random number (xorshift; placement only needs spread, not secrecy).
    fn random(&self) -> u64 {
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Ordering::Relaxed);
        x
    }

    /// How loaded member `m` is: extents per GiB of its capacity.
    fn load(&self, m: usize) -> f64 {
        let capacity = self.members[m].session.capacity_pages().max(1) as f64;
        self.members[m].extents.load(Ordering::Relaxed) as f64 / capacity
    }

    /// Up to `n` live members not in `taken`, each the less loaded of two drawn at random.
    fn choose(&self, n: usize, taken: &[usize]) -> Vec<usize> {
        let mut chosen: Vec<usize> = Vec::with_capacity(n);
        for _ in 0..n {
            let candidates: Vec<usize> = (0..self.members.len())
                .filter(|&m| {
                    self.alive(m)
                        && !self.draining(m)
                        && !taken.contains(&m)
                        && !chosen.contains(&m)
                })
                .collect();
            let pick = match candidates.len() {
                0 => break,
                1 => candidates[0],
                k => {
                    let a = candidates[(self.random() % k as u64) as usize];
                    let b = candidates[(self.random() % k as u64) as usize];
                    if self.load(b) < self.load(a) {
                        b
                    } else {
                        a
                    }
                }
            };
            chosen.push(pick);
        }
        chosen
    }

    /// The placement of `extent`, placing it now if it has none.
    fn place(&self, extent: usize) -> Result<u64, StoreError> {
        let slot = &self.placement[extent];
        let word = slot.load(Ordering::Acquire);
        if word != 0 {
            return Ok(word);
        }
        let chosen = self.choose(self.replicas, &[]);
        if chosen.is_empty() {
            return Err(StoreError::Lost(format!(
                "every memnode of the pool is lost: {}",
                self.lost_list()
            )));
        }
        if chosen.len() < self.replicas {
            log::warn!(
                "extent {extent} placed on {} memnode(s) instead of {}: too few are alive",
                chosen.len(),
                self.replicas
            );
        }
        match slot.compare_exchange(0, pack(&chosen), Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                for &m in &chosen {
                    self.members[m].extents.fetch_add(1, Ordering::Relaxed);
                }
                Ok(pack(&chosen))
            }
            Err(winner) => Ok(winner),
        }
    }

    /// "A (why), B (why)" for every lost member.
    fn lost_list(&self) -> String {
        self.lost_of(0..self.members.len())
    }

    /// "A (why), B (why)" for the lost members among `ms`.
    fn lost_of(&self, ms: impl Iterator<Item = usize>) -> String {
        ms.filter(|&m| !self.alive(m))
            .map(|m| {
                format!(
                    "{} ({})",
                    self.name(m),
                    self.members[m].lost_because.lock().expect("lost lock")
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The live replica of `page` that has read fastest, skipping `avoid`.
    fn reader_for(&self, page: u64, avoid: &[usize]) -> Result<usize, StoreError> {
        let extent = (page / EXTENT_PAGES) as usize;
        let word = self.placement[extent].load(Ordering::Acquire);
        let filling = self.filling[extent].load(Ordering::Acquire);
        let readable = || {
            members_of(word)
                .filter(|&m| self.alive(m) && !avoid.contains(&m))
                .filter(|&m| !members_of(filling).any(|f| f == m))
        };
        // One read in 16 goes to a replica at random, so that one slow sample does not keep a
        // replica from ever being asked again (its average only moves when it is read).
        let explore = self.random().is_multiple_of(16);
        let count = readable().count() as u64;
        let pick = if explore && count > 1 {
            readable().nth((self.random() % count) as usize)
        } else {
            readable().min_by_key(|&m| self.members[m].read_ns.load(Ordering::Relaxed))
        };
        pick.ok_or_else(|| {
            // The extent may have been re-placed since a replica was lost: name every lost
            // memnode of the pool, not only those of its placement now.
            StoreError::Lost(format!(
                "every memnode holding page {page} is lost (lost memnodes: {})",
                self.lost_list()
            ))
        })
    }

    /// Folds one read's latency into member `m`'s average (weight 1/8).
    fn record_read(&self, m: usize, took: Duration, pages: usize) {
        let member = &self.members[m];
        let ns = took.as_nanos().min(u64::MAX as u128) as u64;
        let old = member.read_ns.load(Ordering::Relaxed);
        let new = if old == 0 { ns } else { old - old / 8 + ns / 8 };
        member.read_ns.store(new.max(1), Ordering::Relaxed);
        member.pages_read.fetch_add(pages as u64, Ordering::Relaxed);
    }

    fn version(&self, page: u64) -> u64 {
        self.versions.get(page)
    }
}

/// The store over a pool of memnodes.
pub(crate) struct PoolStore {
    pool: Arc<Pool>,
    repair: Mutex<Option<JoinHandle<()>>>,
    /// The copies of every member's session the memnodes made for the fork being prepared
    /// (`Fork`), which the child attaches to.
    child_sessions: Mutex<Option<Vec<(u64, SessionKey)>>>,
}

/// Opens a session on every memnode of `endpoints` and the pool store over them, each extent on
/// `replicas` of them, its pages encoded by `codec`.
pub(crate) fn open(
    endpoints: Vec<Endpoint>,
    token: Token,
    opts: ConnectOptions,
    replicas: usize,
    region_pages: usize,
    codec: Arc<Codec>,
) -> Result<Box<dyn PageStore>, PagerError> {
    if endpoints.is_empty() || endpoints.len() > MAX_MEMNODES {
        return Err(PagerError::Config(format!(
            "a pool needs 1 to {MAX_MEMNODES} memnodes, not {}",
            endpoints.len()
        )));
    }
    if replicas == 0 || replicas > endpoints.len().min(MAX_REPLICAS) {
        return Err(PagerError::Config(format!(
            "{replicas} replicas cannot be placed on {} memnode(s) (1 to {} replicas)",
            endpoints.len(),
            endpoints.len().min(MAX_REPLICAS)
        )));
    }
    // With other replicas to read from, a memnode that does not come back within a second is
    // given up (and its extents re-replicated) rather than waited for as long as its lease.
    let window = (replicas > 1).then_some(REPLICATED_RECONNECT_WINDOW);
    let mut members = Vec::with_capacity(endpoints.len());
    for endpoint in endpoints {
        let session = MemnodeSession::open(endpoint, token, opts.clone())?.reconnect_within(window);
        members.push(Member::new(session));
    }
    let extents = (region_pages as u64).div_ceil(EXTENT_PAGES) as usize;
    let versions = Versions::new(region_pages);
    let pool = Arc::new(Pool::new(
        members,
        replicas,
        zeroed_atomics(extents),
        zeroed_atomics(extents),
        versions.clone(),
    ));
    let p = pool.clone();
    let repair = std::thread::Builder::new()
        .name("gleaner-repair".into())
        .spawn(move || repair::run(&p))
        .map_err(|source| PagerError::Os {
            op: "starting the re-replication thread",
            source,
        })?;
    let store = PoolStore {
        pool,
        repair: Mutex::new(Some(repair)),
        child_sessions: Mutex::new(None),
    };
    Ok(Box::new(CodedStore::new(Box::new(store), codec, versions)))
}

impl PoolStore {
    /// In a fork child: the pool on the memnodes' copies of the parent's sessions, with the
    /// parent's placement as it was at the fork and a codec of the child's own. No repair
    /// thread: a member lost during the child's life is read around (its extents stay
    /// degraded for the child), and a draining memnode keeps the child's session until it ends.
    fn for_fork_child(
        &self,
        client_name: &str,
        sessions: Vec<(u64, SessionKey)>,
    ) -> Result<PoolStore, PagerError> {
        let parent = &*self.pool;
        let window = (parent.replicas > 1).then_some(REPLICATED_RECONNECT_WINDOW);
        let mut members = Vec::with_capacity(parent.members.len());
        for (m, copy) in parent.members.iter().zip(sessions) {
            let session = m
                .session
                .attach_other(client_name, copy)?
                .reconnect_within(window);
            let member = Member::new(session);
            member
                .extents
                .store(m.extents.load(Ordering::Relaxed), Ordering::Relaxed);
            member
                .read_ns
                .store(m.read_ns.load(Ordering::Relaxed), Ordering::Relaxed);
            members.push(member);
        }
        let copy = |words: &[AtomicU64]| -> Box<[AtomicU64]> {
            words
                .iter()
                .map(|w| AtomicU64::new(w.load(Ordering::Relaxed)))
                .collect()
        };
        let pool = Arc::new(Pool::new(
            members,
            parent.replicas,
            copy(&parent.placement),
            copy(&parent.filling),
            // This process's copy of the parent's versions: those of the copied sessions.
            parent.versions.clone(),
        ));
        Ok(PoolStore {
            pool,
            repair: Mutex::new(None),
            child_sessions: Mutex::new(None),
        })
    }
}

impl BlobStore for PoolStore {
    fn handle(&self) -> Result<Box<dyn BlobHandle>, PagerError> {
        let mut links = Vec::with_capacity(self.pool.members.len());
        for m in &self.pool.members {
            links.push(Some(Link::open(&m.session)?));
        }
        Ok(Box::new(PoolHandle {
            pool: self.pool.clone(),
            links,
            room: vec![0; ENCODE_ROOM],
            requested: Vec::new(),
            reads: Vec::new(),
            staged: Vec::new(),
            batches: Vec::new(),
            held: Vec::new(),
        }))
    }

    fn forget(&self, page: u64) {
        self.pool.forgets.note(page, self.pool.version(page));
    }

    fn release(&self, ranges: &[(u64, u32)]) {
        for (m, member) in self.pool.members.iter().enumerate() {
            if self.pool.alive(m) {
                member.session.release(ranges);
            }
        }
    }

    fn close(&self) {
        self.pool.stop.store(true, Ordering::Release);
        {
            let (flag, cv) = &self.pool.wake;
            *flag.lock().expect("wake lock") = true;
            cv.notify_all();
        }
        if let Some(t) = self.repair.lock().expect("repair lock").take() {
            let _ = t.join();
        }
        for (m, member) in self.pool.members.iter().enumerate() {
            if self.pool.alive(m) {
                member.session.close();
            }
        }
    }

    fn can_share_with_child(&self) -> bool {
        // Every member must take part (a degraded or draining pool brings its pages home for a
        // fork).
        let pool = &*self.pool;
        (0..pool.members.len()).all(|m| pool.alive(m) && !pool.draining(m))
    }

    fn hold_for_child(&self, _alive: OwnedFd) -> Result<(), StoreError> {
        // Each memnode keeps a copy of its session (`Fork`): nothing to hold here.
        let mut copies = Vec::with_capacity(self.pool.members.len());
        for (m, member) in self.pool.members.iter().enumerate() {
            let copy = member
                .session
                .with_control(|c| c.fork_session())
                .ok_or_else(|| StoreError::Lost(format!("{}: session closed", self.pool.name(m))))?
                .map_err(|e| StoreError::Lost(format!("{}: {e}", self.pool.name(m))))?;
            copies.push(copy);
        }
        *self.child_sessions.lock().expect("child sessions lock") = Some(copies);
        Ok(())
    }

    fn fork_child(&self, client_name: &str) -> Result<Box<dyn BlobStore>, PagerError> {
        let sessions = self
            .child_sessions
            .lock()
            .expect("child sessions lock")
            .take()
            .ok_or_else(|| PagerError::Config("no sessions were copied for this child".into()))?;
        Ok(Box::new(self.for_fork_child(client_name, sessions)?))
    }

    fn describe(&self) -> String {
        let names: Vec<String> = (0..self.pool.members.len())
            .map(|m| self.pool.name(m))
            .collect();
        format!(
            "a pool of {} memnodes ({}), {} replica{}",
            names.len(),
            names.join(", "),
            self.pool.replicas,
            if self.pool.replicas == 1 { "" } else { "s" }
        )
    }

    fn capacity_pages(&self) -> u64 {
        let total: u64 = self
            .pool
            .members
            .iter()
            .map(|m| m.session.capacity_pages())
            .sum();
        total / self.pool.replicas as u64
    }

    fn stats(&self) -> StoreStats {
        let pool = &self.pool;
        let degraded = pool
            .placement
            .iter()
            .filter(|w| {
                let word = w.load(Ordering::Relaxed);
                word != 0 && members_of(word).filter(|&m| pool.alive(m)).count() < pool.replicas
            })
            .count() as u64;
        StoreStats {
            data_path: "socket",
            reconnects: pool.members.iter().map(|m| m.session.reconnects()).sum(),
            copies_dropped: pool.forgets.dropped(),
            pool: Some(PoolStats {
                replicas: pool.replicas,
                extent_pages: EXTENT_PAGES,
                extents_degraded: degraded,
                extents_repaired: pool.extents_repaired.load(Ordering::Relaxed),
                pages_repaired: pool.pages_repaired.load(Ordering::Relaxed),
                repair_seconds: pool.repair_ns.load(Ordering::Relaxed) as f64 / 1e9,
                memnodes: (0..pool.members.len())
                    .map(|m| {
                        let member = &pool.members[m];
                        MemberStats {
                            endpoint: pool.name(m),
                            alive: pool.alive(m),
                            draining: pool.draining(m),
                            drained: member.drained.load(Ordering::Relaxed),
                            lost_because: member.lost_because.lock().expect("lost lock").clone(),
                            extents: member.extents.load(Ordering::Relaxed),
                            pages_read: member.pages_read.load(Ordering::Relaxed),
                            pages_written: member.pages_written.load(Ordering::Relaxed),
                            read_us: member.read_ns.load(Ordering::Relaxed) as f64 / 1000.0,
                            reconnects: member.session.reconnects(),
                        }
                    })
                    .collect(),
            }),
            ..StoreStats::default()
        }
    }
}

impl Drop for PoolStore {
    fn drop(&mut self) {
        self.pool.stop.store(true, Ordering::Release);
        let (flag, cv) = &self.pool.wake;
        *flag.lock().expect("wake lock") = true;
        cv.notify_all();
    }
}

/// The pool's part of the stats.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PoolStats {
    /// Replicas of each extent.
    pub replicas: usize,
    /// Pages per extent.
    pub extent_pages: u64,
    /// Extents with fewer live replicas than asked for now.
    pub extents_degraded: u64,
    /// Extents given a new replica after a memnode was lost.
    pub extents_repaired: u64,
    /// Pages copied to new replicas.
    pub pages_repaired: u64,
    /// Time spent copying them (waiting for write-backs under the old placement included).
    pub repair_seconds: f64,
    /// Each memnode.
    pub memnodes: Vec<MemberStats>,
}

/// One memnode of a pool, in the stats.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MemberStats {
    /// Its address.
    pub endpoint: String,
    /// Whether it is still used.
    pub alive: bool,
    /// Whether it asked its clients to leave.
    pub draining: bool,
    /// Whether this program left it at its request (its extents moved).
    pub drained: bool,
    /// Why it was lost (empty while alive).
    pub lost_because: String,
    /// Extents placed on it.
    pub extents: u64,
    /// Pages read from it.
    pub pages_read: u64,
    /// Pages written to it.
    pub pages_written: u64,
    /// Average latency of its recent reads, µs.
    pub read_us: f64,
    /// Broken connections to it replaced.
    pub reconnects: u64,
}

/// One thread's connections to every member.
struct PoolHandle {
    pool: Arc<Pool>,
    /// Per member (None once it is lost).
    links: Vec<Option<Link>>,
    /// Where the codec encodes a page's blob, before it joins the members' batches.
    room: Vec<u8>,
    /// The pages of the outstanding read.
    requested: Vec<u64>,
    /// The outstanding read, per member asked: (member, the read if it left, its pages, their
    /// indices in `requested`, when it left).
    reads: Vec<PoolRead>,
    /// The pages being written back.
    staged: Vec<u64>,
    /// Per member with a batch being built: (member, indices in `staged`).
    batches: Vec<(usize, Vec<usize>)>,
    /// Extents whose in-flight count this write-back holds.
    held: Vec<usize>,
}

/// One member's part of a read.
struct PoolRead {
    member: usize,
    pending: Option<PendingRead>,
    pages: Vec<u64>,
    indices: Vec<usize>,
    sent: Instant,
}

impl PoolHandle {
    /// Member `m`'s link, if it is alive.
    fn link(&mut self, m: usize) -> Option<&mut Link> {
        if !self.pool.alive(m) {
            self.links[m] = None;
        }
        self.links[m].as_mut()
    }

    /// Marks member `m` lost and drops this thread's link to it.
    fn lose(&mut self, m: usize, why: &str) {
        self.links[m] = None;
        self.pool.lose(m, why);
    }

    /// Sends one read per member for the pages at `indices` of `requested`, each page to its
    /// fastest live replica not in `avoid`.
    fn send_reads(&mut self, indices: &[usize], avoid: &[usize]) -> Result<(), StoreError> {
        for &i in indices {
            let page = self.requested[i];
            let m = self.pool.reader_for(page, avoid)?;
            match self
                .reads
                .iter_mut()
                .find(|r| r.member == m && r.pending.is_none())
            {
                Some(r) => {
                    r.pages.push(page);
                    r.indices.push(i);
                }
                None => self.reads.push(PoolRead {
                    member: m,
                    pending: None,
                    pages: vec![page],
                    indices: vec![i],
                    sent: Instant::now(),
                }),
            }
        }
        for k in 0..self.reads.len() {
            if self.reads[k].pending.is_some() {
                continue;
            }
            let m = self.reads[k].member;
            let pages = std::mem::take(&mut self.reads[k].pages);
            let sent = self
                .link(m)
                .map(|l| l.send_read(&pages, &mut 0))
                .unwrap_or_else(|| Err(StoreError::Lost("lost".into())));
            self.reads[k].pages = pages;
            self.reads[k].sent = Instant::now();
            match sent {
                Ok(p) => self.reads[k].pending = Some(p),
                // Left without a read: `receive` asks another replica.
                Err(StoreError::Lost(why)) => self.lose(m, &why),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Releases the in-flight counts of the last write-back.
    fn release_held(&mut self) {
        for e in self.held.drain(..) {
            self.pool.inflight[e].fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl BlobHandle for PoolHandle {
    fn request(&mut self, pages: &[u64]) -> Result<(), StoreError> {
        assert!(self.reads.is_empty(), "a read is already outstanding");
        self.requested.clear();
        self.requested.extend_from_slice(pages);
        let all: Vec<usize> = (0..pages.len()).collect();
        self.send_reads(&all, &[])
    }

    fn receive(
        &mut self,
        f: &mut dyn FnMut(usize, u64, FarCopy<'_>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut avoid: Vec<usize> = Vec::new();
        let result = loop {
            let reads = std::mem::take(&mut self.reads);
            let mut retry: Vec<usize> = Vec::new();
            for read in reads {
                let m = read.member;
                let outcome = match (read.pending, self.links[m].as_mut()) {
                    (Some(pending), Some(link)) => {
                        let indices = &read.indices;
                        // The version the memnode echoes is not passed on: the codec layer
                        // opens the blob with the one it recorded.
                        let r = link.finish_read(
                            pending,
                            &read.pages,
                            &mut 0,
                            &mut |k, page, _, blob| f(indices[k], page, FarCopy::Blob(blob)),
                        );
                        if r.is_ok() {
                            self.pool
                                .record_read(m, read.sent.elapsed(), read.pages.len());
                        }
                        r
                    }
                    _ => Err(StoreError::Lost(format!(
                        "{}",
                        self.pool.members[m].lost_because.lock().expect("lost lock")
                    ))),
                };
                if let Err(e) = outcome {
                    // Some pages of this read may have reached `f` already (they opened, so
                    // they are what this program wrote): they are read again from another
                    // replica and delivered again, which `f` (a copy into the page's
                    // destination) tolerates.
                    self.lose(m, &e.to_string());
                    avoid.push(m);
                    retry.extend_from_slice(&read.indices);
                }
            }
            if retry.is_empty() {
                break Ok(());
            }
            if let Err(e) = self.send_reads(&retry, &avoid) {
                break Err(e);
            }
        };
        self.reads.clear();
        result
    }

    fn begin_stage(&mut self) {
        self.release_held();
        self.staged.clear();
        self.batches.clear();
    }

    fn room(&mut self) -> &mut [u8] {
        &mut self.room
    }

    fn push(&mut self, page: u64, copy: Encoded) -> Result<(), StoreError> {
        let Encoded::Blob { len, version } = copy else {
            unreachable!("a pool keeps no words: every page leaves as a blob")
        };
        let extent = (page / EXTENT_PAGES) as usize;
        if !self.held.contains(&extent) {
            // Counted before the placement is read, so that re-replication, which swaps the
            // placement and then waits for this count, also waits for this write.
            self.pool.inflight[extent].fetch_add(1, Ordering::AcqRel);
            self.held.push(extent);
        }
        let word = self.pool.place(extent)?;
        let i = self.staged.len();
        self.staged.push(page);
        for m in members_of(word) {
            let Some(link) = self.links[m].as_mut().filter(|_| self.pool.alive(m)) else {
                continue;
            };
            let k = match self.batches.iter().position(|b| b.0 == m) {
                Some(k) => k,
                None => {
                    PageBatch::begin(link.batch());
                    self.batches.push((m, Vec::new()));
                    self.batches.len() - 1
                }
            };
            PageBatch::push(link.batch(), page, version, &self.room[..len]);
            self.batches[k].1.push(i);
        }
        Ok(())
    }

    fn commit_watching(&mut self, mut bell: Option<Bell<'_>>) -> Result<(), StoreError> {
        let mut copies = vec![0u32; self.staged.len()];
        let mut full: Option<String> = None;
        let batches = std::mem::take(&mut self.batches);
        for (m, indices) in &batches {
            let sent = match self.link(*m) {
                Some(link) => link.write_batch(bell.as_mut().map(Bell::reborrow)),
                None => continue,
            };
            match sent {
                Ok(()) => {
                    self.pool.members[*m]
                        .pages_written
                        .fetch_add(indices.len() as u64, Ordering::Relaxed);
                    for &i in indices {
                        copies[i] += 1;
                    }
                }
                Err(StoreError::Full(why)) => full = Some(why),
                Err(StoreError::Lost(why) | StoreError::Late(why)) => self.lose(*m, &why),
            }
        }
        self.release_held();
        if let Some(why) = full {
            // Pages stay local until written back again; copies stored elsewhere meanwhile are
            // replaced then (or never read). Room the copies of resident pages take goes first.
            self.pool.send_forgets(1);
            return Err(StoreError::Full(why));
        }
        if let Some(i) = copies.iter().position(|&c| c == 0) {
            let page = self.staged[i];
            return Err(StoreError::Lost(format!(
                "page {page} could not be written to any memnode holding it (lost memnodes: {})",
                self.pool.lost_list()
            )));
        }
        self.staged.clear();
        self.pool.send_forgets(FORGET_BATCH);
        Ok(())
    }
}

impl Drop for PoolHandle {
    fn drop(&mut self) {
        self.release_held();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_pack_and_unpack() {
        assert_eq!(members_of(0).count(), 0);
        let w = pack(&[3, 0, 254]);
        assert_eq!(members_of(w).collect::<Vec<_>>(), vec![3, 0, 254]);
        let w = pack(&[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(members_of(w).count(), 8);
    }
}
