//! A soft-memory pool: a log-structured allocator over 2 MiB segments of a memfd, objects with
//! per-object hotness, an evacuator thread, and (optionally) a link to the node daemon.
//!
//! **Reads never return torn or foreign data.** Every object piece in a segment starts with a
//! 16-byte header (slot, version, length, tag). A read checks the segment's generation word,
//! copies header and payload out, then re-checks the generation and the header. The daemon bumps
//! the generation before it punches a segment, so a copy that overlapped a punch sees the new
//! generation (or a zeroed header) and the read becomes a miss that runs the reconstructor. An
//! object in one piece is read without the pool's lock: its read words (`words.rs`, a seqlock per
//! object that only the lock holder writes) say where it lies, and a move, a rewrite or an
//! eviction during the copy changes them, which sends the read to the locked path. Everything
//! else (objects in pieces, a read that failed its checks) reads under the lock, so evacuation
//! and writes cannot race it. The memfd is sealed against
//! shrinking, so a punched range reads as zeros and never faults: no signal handler or
//! fault-resilient copy is needed (Midas needed both; see docs/soft-memory.md).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use gleaner_node::shared::{self, Control, SEGMENT_BYTES};
use gleaner_node::Mapping;

use crate::hits::HitCounts;
use crate::plan::{self, Action, SegInfo};
use crate::words::{Placed, Word};

/// Bytes of an object piece's header.
pub const HEADER: u64 = 16;
const TAG: u32 = 0x50F7_0000;
const SEG: u64 = SEGMENT_BYTES;
/// How often the evacuator ages hotness and republishes the cold order.
const SCAN_EVERY: Duration = Duration::from_millis(250);
/// What one access adds to an object's hotness (a fixed-point count of accesses, so that
/// aging by a fraction keeps the objects read less than once a scan apart).
const HIT_WEIGHT: u16 = 16;
/// Each scan takes `1 / 2^AGE_SHIFT` of every object's hotness (at least one unit while any is
/// left): an exponentially weighted count of accesses over the last `2^AGE_SHIFT` scans
/// (8 s), long enough to rank objects read once a second or less.
const AGE_SHIFT: u32 = 5;
/// The hottest objects that fill this fraction of the grant are kept when their segment is
/// reused (moved to its start); the rest of the grant turns over with new objects.
const PROTECT_NUM: u64 = 7;
const PROTECT_DEN: u64 = 8;
/// A reused segment keeps at most this many bytes of its objects, so that each reuse frees at
/// least a quarter of a segment for new ones.
const KEEP_MAX: u64 = SEG / 4 * 3;
/// The largest payload of one piece (objects bigger than this are split across segments).
pub const PIECE_MAX: u64 = SEG - HEADER;

/// Rebuilds an object from its reconstruction arguments; `None` when it cannot.
pub type Reconstructor = Arc<dyn Fn(&[u8]) -> Option<Vec<u8>> + Send + Sync>;

/// How a pool is set up.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// A name for status output.
    pub name: String,
    /// The most memory the pool can ever hold (its memfd's size), bytes; rounded up to segments.
    pub capacity: u64,
    /// Its grant until (or without) a daemon, bytes.
    pub limit: u64,
    /// The node daemon's socket; `None` runs the pool alone with `limit`.
    pub node: Option<PathBuf>,
    /// Start a daemon if none answers on `node`.
    pub autostart: bool,
    /// Weight in the daemon's allocation.
    pub weight: f64,
    /// The least the daemon should leave it, bytes.
    pub floor: u64,
    /// The most the daemon may grant it, bytes (0: its capacity).
    pub ceiling: u64,
    /// Debug mode: every hit also runs the reconstructor and compares (Midas's debug mode).
    pub verify: bool,
    /// The victim cache's reach, bytes: a miss on an object evicted within the last this many
    /// evicted bytes is a victim hit.
    pub ghost_bytes: u64,
    /// Evacuator period.
    pub tick: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            name: "pool".into(),
            capacity: 1 << 30,
            limit: 64 << 20,
            node: None,
            autostart: false,
            weight: 1.0,
            floor: 0,
            ceiling: 0,
            verify: false,
            ghost_bytes: 64 << 20,
            tick: Duration::from_millis(10),
        }
    }
}

impl PoolConfig {
    /// Reads `GLEANER_SOFT_NODE` (`off`, `auto` for the default socket started on demand, or a
    /// socket path, also started on demand) and `GLEANER_SOFT_VERIFY=1` into this config.
    pub fn from_env(mut self) -> PoolConfig {
        match std::env::var("GLEANER_SOFT_NODE").as_deref() {
            Ok("off") | Err(_) => {}
            Ok("auto") | Ok("") => {
                self.node = Some(gleaner_node::client::default_socket());
                self.autostart = true;
            }
            Ok(p) => {
                self.node = Some(PathBuf::from(p));
                self.autostart = true;
            }
        }
        if std::env::var("GLEANER_SOFT_VERIFY").as_deref() == Ok("1") {
            self.verify = true;
        }
        self
    }
}

/// A pool's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Reads that found their object.
    pub hits: u64,
    /// Reads that ran the reconstructor.
    pub misses: u64,
    /// Misses on recently evicted objects.
    pub victim_hits: u64,
    /// Nanoseconds in reconstructors.
    pub rebuild_ns: u64,
    /// Bytes reconstructed.
    pub miss_bytes: u64,
    /// Reads whose copy failed validation after the fact (a punch raced them): each was
    /// turned into a miss, never returned.
    pub torn_caught: u64,
    /// Segments the runtime found punched by the daemon.
    pub revoked_segments: u64,
    /// Segments released by the runtime (cooperative shrink).
    pub released_segments: u64,
    /// Segments emptied by compaction.
    pub compacted_segments: u64,
    /// Objects moved by compaction.
    pub moved_objects: u64,
    /// Hot objects kept when the segment they were in was reused (moved to its start).
    pub kept_hot_objects: u64,
    /// Debug mode: hits whose reconstruction differed from the cached bytes.
    pub verify_mismatches: u64,
    /// Segments held now.
    pub resident_segments: u64,
    /// The grant, bytes.
    pub limit: u64,
    /// Successful registrations with a daemon (more than one: the daemon restarted).
    pub registrations: u64,
    /// Whether a daemon holds the pool's registration now.
    pub registered: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Loc {
    seg: u32,
    off: u32,
    len: u32,
}

#[derive(Debug, Default)]
enum Place {
    #[default]
    None,
    One(Loc),
    Many(Box<[Loc]>),
}

impl Place {
    fn locs(&self) -> &[Loc] {
        match self {
            Place::None => &[],
            Place::One(l) => std::slice::from_ref(l),
            Place::Many(v) => v,
        }
    }
}

#[derive(Debug, Default)]
struct Obj {
    place: Place,
    len: u64,
    version: u32,
    /// Its hotness: [`HIT_WEIGHT`] per access, aged each scan by [`AGE_SHIFT`]. Kept while the
    /// object is evicted, so that one read often before is kept at once when it comes back.
    hot: u16,
    evicted_at: u64,
    in_use: bool,
    /// Where it lies, for reads without the lock (written under it); shared with its soft
    /// pointer.
    words: Arc<Word>,
}

#[derive(Debug, Default, Clone)]
struct Seg {
    used: bool,
    gen: u64,
    top: u64,
    live: u64,
    hotness: u64,
    objs: Vec<u32>,
}

pub(crate) struct Inner {
    objs: Vec<Obj>,
    free_slots: Vec<u32>,
    segs: Vec<Seg>,
    free_segs: Vec<u32>,
    open: Option<u32>,
    resident: u64,
    evicted_bytes: u64,
    stats: Stats,
    /// The segment being compacted (never reused as a destination meanwhile).
    pinned: Option<u32>,
    last_scan: Option<Instant>,
    /// Objects hotter than this survive the reuse of their segment (the last scan's cut: the
    /// hottest objects filling [`PROTECT_NUM`]/[`PROTECT_DEN`] of the grant).
    protect_above: u16,
    /// Where the reuse of a segment holds the objects it keeps while it empties the segment
    /// ([`KEEP_MAX`] bytes of capacity once a segment has been reused; cleared after each).
    scratch: Vec<u8>,
}

pub(crate) struct PoolInner {
    cfg: PoolConfig,
    recon: Reconstructor,
    memfd: OwnedFd,
    ctrl: Control,
    map: Mapping,
    nseg: u32,
    state: Mutex<Inner>,
    /// Hits, counted per thread; the evacuator publishes their total in the control area.
    hits: HitCounts,
    wake: Condvar,
    link: Mutex<Option<std::os::unix::net::UnixStream>>,
    registered: AtomicBool,
    registrations: AtomicU64,
    closing: AtomicBool,
}

/// A soft-memory pool (cheap to clone: a handle).
#[derive(Clone)]
pub struct Pool {
    pub(crate) inner: Arc<PoolInner>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("name", &self.inner.cfg.name)
            .finish()
    }
}

impl Pool {
    /// Creates a pool whose misses run `recon`, with its evacuator running; its link to the
    /// node daemon is started by [`Pool::new`] (`open.rs`).
    pub(crate) fn create(cfg: PoolConfig, recon: Reconstructor) -> io::Result<Pool> {
        let nseg = cfg.capacity.div_ceil(SEG).clamp(1, shared::MAX_SEGMENTS);
        let (memfd, ctrl) = shared::create_pool_memfd(&cfg.name, nseg)?;
        let map = Mapping::new(&memfd, ((nseg + 1) * SEG) as usize)?;
        ctrl.word(shared::OFF_LIMIT)
            .store(cfg.limit, Ordering::SeqCst);
        ctrl.word(shared::OFF_GHOST_BYTES)
            .store(cfg.ghost_bytes, Ordering::Relaxed);
        let inner = Arc::new(PoolInner {
            recon,
            memfd,
            ctrl,
            map,
            nseg: nseg as u32,
            state: Mutex::new(Inner {
                objs: Vec::new(),
                free_slots: Vec::new(),
                segs: vec![Seg::default(); nseg as usize + 1],
                free_segs: (1..=nseg as u32).rev().collect(),
                open: None,
                resident: 0,
                evicted_bytes: 0,
                stats: Stats::default(),
                pinned: None,
                last_scan: None,
                protect_above: 0,
                scratch: Vec::new(),
            }),
            hits: HitCounts::default(),
            wake: Condvar::new(),
            link: Mutex::new(None),
            registered: AtomicBool::new(false),
            registrations: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            cfg,
        });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name("soft-evacuator".into())
            .spawn(move || evacuator(weak))?;
        Ok(Pool { inner })
    }

    /// The counters now.
    pub fn stats(&self) -> Stats {
        let g = self.inner.lock();
        let mut s = g.stats;
        let c = self.inner.ctrl.counters();
        s.hits = self.inner.hits.total();
        s.misses = c.misses;
        s.victim_hits = c.vhits;
        s.rebuild_ns = c.rebuild_ns;
        s.miss_bytes = c.miss_bytes;
        s.resident_segments = g.resident;
        s.limit = self.limit();
        s.registrations = self.inner.registrations.load(Ordering::Relaxed);
        s.registered = self.inner.registered.load(Ordering::Relaxed);
        s
    }

    /// The grant, bytes (the daemon's, or the configured one).
    pub fn limit(&self) -> u64 {
        self.inner
            .ctrl
            .word(shared::OFF_LIMIT)
            .load(Ordering::SeqCst)
    }

    /// Sets the grant (a pool without a daemon; a daemon overrides it at its next decision).
    pub fn set_limit(&self, bytes: u64) {
        self.inner
            .ctrl
            .word(shared::OFF_LIMIT)
            .store(bytes, Ordering::SeqCst);
        self.inner.wake.notify_all();
    }

    /// The memory the memfd holds now (the kernel's count), bytes.
    pub fn resident_bytes(&self) -> u64 {
        shared::resident_bytes(&self.inner.memfd).unwrap_or(0)
    }

    /// The pool's memfd (tests punch it as a daemon would).
    pub fn memfd(&self) -> BorrowedFd<'_> {
        self.inner.memfd.as_fd()
    }

    /// The number of data segments.
    pub fn segments(&self) -> u32 {
        self.inner.nseg
    }

    /// Runs one evacuator pass now (it also runs every tick by itself).
    pub fn evacuate_now(&self) {
        self.inner.evacuate(true);
    }

    /// Punches segment `seg` as the daemon does (generation first): for tests and tools.
    pub fn punch_as_daemon(&self, seg: u32) -> io::Result<()> {
        self.inner.ctrl.gen(seg).fetch_add(1, Ordering::SeqCst);
        shared::punch_segment(&self.inner.memfd, seg)
    }

    /// The segments holding data now, as the runtime sees them.
    pub fn used_segments(&self) -> Vec<u32> {
        let g = self.inner.lock();
        (1..=self.inner.nseg)
            .filter(|&s| g.segs[s as usize].used)
            .collect()
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        if let Some(s) = self.link.lock().unwrap().take() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl PoolInner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn cfg(&self) -> &PoolConfig {
        &self.cfg
    }

    pub(crate) fn memfd_fd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    pub(crate) fn set_link(&self, s: Option<std::os::unix::net::UnixStream>, registered: bool) {
        *self.link.lock().unwrap() = s;
        self.registered.store(registered, Ordering::SeqCst);
        if registered {
            self.registrations.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    pub(crate) fn wake(&self) {
        self.wake.notify_all();
    }

    fn limit_segs(&self) -> u64 {
        self.ctrl.word(shared::OFF_LIMIT).load(Ordering::SeqCst) / SEG
    }

    /// A new slot and its read words, for its soft pointer to keep.
    pub(crate) fn new_slot(&self) -> (u32, Arc<Word>) {
        let mut g = self.lock();
        let slot = match g.free_slots.pop() {
            Some(s) => s,
            None => {
                g.objs.push(Obj::default());
                (g.objs.len() - 1) as u32
            }
        };
        // Fresh words: no read of the slot's previous object can be under way (its pointer
        // is gone), and the new pointer starts from an empty place.
        let words = Arc::new(Word::default());
        g.objs[slot as usize] = Obj {
            in_use: true,
            words: words.clone(),
            ..Default::default()
        };
        (slot, words)
    }

    pub(crate) fn free_slot(&self, slot: u32) {
        let mut g = self.lock();
        self.drop_place(&mut g, slot);
        g.objs[slot as usize].in_use = false;
        g.free_slots.push(slot);
    }

    pub(crate) fn present(&self, slot: u32) -> bool {
        !matches!(self.lock().objs[slot as usize].place, Place::None)
    }

    fn count(&self, off: usize, n: u64) {
        self.ctrl.word(off).fetch_add(n, Ordering::Relaxed);
    }

    /// Copies an object out into `out` without the pool's lock, where its read words `w`
    /// allow (one piece, not moved, rewritten or dropped during the copy, its segment not
    /// punched, its header the one written). False sends the read to the locked path.
    ///
    /// This is every hit's path, kept lean: a snapshot of the words (the place and length in
    /// one word, checked against the mapping when they were published, so nothing is computed
    /// or checked before the copy but the header), the header compared as two words, the copy,
    /// then the seqlock's re-checks (the sequence number and the segment's generation, both
    /// after the copy).
    #[inline(always)]
    fn try_copy_unlocked(&self, w: &Word, out: &mut Vec<u8>) -> bool {
        let Some(s) = w.snapshot() else {
            return false;
        };
        // SAFETY: the offset and length come from one word, published by `publish_one`, which
        // checked that the piece (16-aligned, its header and payload) lies inside the mapping.
        let piece = unsafe { self.map.piece_unchecked(s.at as usize, s.len as usize) };
        // The piece's header: not the one written for this version (the place was reused, or
        // punched): the locked path decides.
        if piece.header() != s.head {
            return false;
        }
        out.clear();
        piece.append_payload_to(out);
        // `still` fences, so the generation too is loaded after the copy: a punch before or
        // during the copy has moved it by then (the daemon bumps it before punching).
        let seg = (s.at / SEG) as usize;
        // SAFETY: the piece lies inside the mapping (above), whose segments are the control
        // area and at most `MAX_SEGMENTS` data segments, so `seg <= MAX_SEGMENTS`, inside the
        // array.
        let gen = unsafe { self.ctrl.gens().get_unchecked(seg) };
        let same = w.still(&s);
        if !same || gen.load(Ordering::Relaxed) != s.gen {
            out.clear();
            return false;
        }
        w.hit();
        true
    }

    /// Publishes where object `slot` lies now for reads without the lock (`None`: under the
    /// lock only), after checking that the piece lies inside the mapping: the unlocked read
    /// copies from it with no check of its own.
    fn publish_one(&self, g: &Inner, slot: u32, place: Option<(Loc, u32)>) {
        let placed = place.map(|(l, version)| {
            let at = shared::segment_offset(l.seg) + u64::from(l.off);
            assert!(
                l.seg >= 1
                    && l.seg <= self.nseg
                    && at.is_multiple_of(16)
                    && at + HEADER + u64::from(l.len) <= self.map.len() as u64,
                "a piece outside the pool's mapping"
            );
            let (h0, h1) = header_words(slot, version, l.len, 0);
            Placed {
                at,
                len: l.len,
                head: [h0.to_le(), h1.to_le()],
                gen: g.segs[l.seg as usize].gen,
            }
        });
        g.objs[slot as usize].words.publish(placed);
    }

    /// Copies the object out into `out` if it is present and intact. Returns false (after
    /// dropping whatever was found broken) otherwise.
    fn try_copy(&self, g: &mut Inner, slot: u32, out: &mut Vec<u8>) -> bool {
        out.clear();
        self.try_append(g, slot, out)
    }

    /// [`PoolInner::try_copy`], appending to `out` (left as it was on false).
    fn try_append(&self, g: &mut Inner, slot: u32, out: &mut Vec<u8>) -> bool {
        let obj = &g.objs[slot as usize];
        if matches!(obj.place, Place::None) {
            return false;
        }
        let single;
        let many;
        let locs: &[Loc] = match &obj.place {
            Place::One(l) => {
                single = [*l];
                &single
            }
            other => {
                many = other.locs().to_vec();
                &many
            }
        };
        let (len, version) = (obj.len, obj.version);
        for l in locs {
            if self.ctrl.gen(l.seg).load(Ordering::Acquire) != g.segs[l.seg as usize].gen {
                self.revoke(g, l.seg);
                return false;
            }
        }
        let start = out.len();
        out.reserve(len as usize);
        let mut hdr = [0u8; HEADER as usize];
        let mut ok = true;
        for (i, l) in locs.iter().enumerate() {
            let base = shared::segment_offset(l.seg) as usize + l.off as usize;
            self.map.copy_out(base, &mut hdr);
            self.map
                .append_to(base + HEADER as usize, l.len as usize, out);
            ok &= header_ok(&hdr, slot, version, l.len, i as u32);
        }
        // Seqlock close: the data is trusted only if no segment's generation moved during the
        // copy (a punch bumps it first) and every header is the one we wrote. The generation
        // loads after this fence cannot be ordered before the copy's loads (a seqlock reader's
        // acquire fence, as crossbeam's).
        fence(Ordering::Acquire);
        for l in locs {
            if self.ctrl.gen(l.seg).load(Ordering::Acquire) != g.segs[l.seg as usize].gen {
                g.stats.torn_caught += 1;
                self.revoke(g, l.seg);
                ok = false;
            }
        }
        if !ok {
            out.truncate(start);
            if !matches!(g.objs[slot as usize].place, Place::None) {
                g.stats.torn_caught += 1;
                self.evict(g, slot);
            }
            return false;
        }
        let o = &mut g.objs[slot as usize];
        o.hot = o.hot.saturating_add(HIT_WEIGHT);
        true
    }

    /// A read's first half: a hit without the lock, through the object's read words `words`
    /// (its soft pointer keeps them), counted; false sends the read to
    /// [`PoolInner::read_locked`]. The soft pointer calls the two (`SoftBox::read_into`), so
    /// that nothing only the second half needs (the slot) is held across the hit's copy.
    #[inline(always)]
    pub(crate) fn read_hit(&self, words: &Word, args: &[u8], out: &mut Vec<u8>) -> bool {
        if !self.try_copy_unlocked(words, out) {
            return false;
        }
        self.hits.add_one();
        if self.cfg.verify {
            self.verify(args, out);
        }
        true
    }

    /// The rest of a read of object `slot` into `out`: under the lock, a hit the unlocked path
    /// could not take (an object in pieces, one moving or in a segment the daemon took), or a
    /// miss, which runs the reconstructor (called with `args`). False if the reconstructor gave
    /// nothing.
    #[inline(never)]
    pub(crate) fn read_locked(&self, slot: u32, args: &[u8], out: &mut Vec<u8>) -> bool {
        let victim;
        {
            let mut g = self.lock();
            if self.try_copy(&mut g, slot, out) {
                drop(g);
                self.hits.add_one();
                if self.cfg.verify {
                    self.verify(args, out);
                }
                return true;
            }
            let evicted_bytes = g.evicted_bytes;
            let o = &mut g.objs[slot as usize];
            victim = o.evicted_at != 0
                && evicted_bytes.saturating_sub(o.evicted_at) <= self.cfg.ghost_bytes;
            // The access that missed counts too (a write keeps the hotness).
            o.hot = o.hot.saturating_add(HIT_WEIGHT);
        }
        self.count(shared::OFF_MISSES, 1);
        if victim {
            self.count(shared::OFF_VHITS, 1);
        }
        let t0 = Instant::now();
        let v = (self.recon)(args);
        self.count(shared::OFF_REBUILD_NS, t0.elapsed().as_nanos() as u64);
        let Some(v) = v else { return false };
        self.count(shared::OFF_MISS_BYTES, v.len() as u64);
        self.write(slot, &v);
        *out = v;
        true
    }

    fn verify(&self, args: &[u8], got: &[u8]) {
        if let Some(want) = (self.recon)(args) {
            if want != got {
                log::error!(
                    "soft pool {}: a hit differs from its reconstruction ({} vs {} bytes)",
                    self.cfg.name,
                    got.len(),
                    want.len()
                );
                self.lock().stats.verify_mismatches += 1;
            }
        }
    }

    /// Writes `data` as object `slot`'s new value (it may not stay: no room is a miss later).
    pub(crate) fn write(&self, slot: u32, data: &[u8]) -> bool {
        let mut g = self.lock();
        self.write_locked(&mut g, slot, data)
    }

    fn write_locked(&self, g: &mut Inner, slot: u32, data: &[u8]) -> bool {
        self.drop_place(g, slot);
        let o = &mut g.objs[slot as usize];
        o.version = o.version.wrapping_add(1);
        o.len = data.len() as u64;
        let version = o.version;
        let Some(locs) = self.alloc(g, data.len() as u64) else {
            return false;
        };
        let mut at = 0usize;
        for (i, l) in locs.iter().enumerate() {
            let base = shared::segment_offset(l.seg) as usize + l.off as usize;
            self.map
                .copy_in(base + HEADER as usize, &data[at..at + l.len as usize]);
            self.map
                .copy_in(base, &header(slot, version, l.len, i as u32));
            at += l.len as usize;
        }
        fence(Ordering::SeqCst);
        for l in &locs {
            let s = &mut g.segs[l.seg as usize];
            s.live += HEADER + round16(l.len as u64);
            s.objs.push(slot);
        }
        g.objs[slot as usize].place = if locs.len() == 1 {
            let l = locs[0];
            self.publish_one(g, slot, Some((l, version)));
            Place::One(l)
        } else {
            Place::Many(locs.clone().into_boxed_slice())
        };
        for l in &locs {
            if self.ctrl.gen(l.seg).load(Ordering::Acquire) != g.segs[l.seg as usize].gen {
                self.revoke(g, l.seg);
                return false;
            }
        }
        true
    }

    /// Compare-and-swap: writes `new` if the object's current bytes are `old`.
    pub(crate) fn cmpxchg(&self, slot: u32, old: &[u8], new: &[u8]) -> bool {
        let mut g = self.lock();
        let mut cur = Vec::new();
        if !self.try_copy(&mut g, slot, &mut cur) || cur != old {
            return false;
        }
        self.write_locked(&mut g, slot, new)
    }

    /// Places `len` bytes (split into pieces of at most [`PIECE_MAX`]), opening segments within
    /// the grant and releasing the coldest one when at it. None if the grant holds no room.
    fn alloc(&self, g: &mut Inner, len: u64) -> Option<Vec<Loc>> {
        let mut pieces = Vec::new();
        let mut left = len;
        loop {
            let take = left.min(PIECE_MAX);
            pieces.push(take);
            left -= take;
            if left == 0 {
                break;
            }
        }
        let mut locs: Vec<Loc> = Vec::with_capacity(pieces.len());
        for p in pieces {
            let need = HEADER + round16(p);
            let fits = g.open.is_some_and(|s| g.segs[s as usize].top + need <= SEG);
            if !fits {
                let busy: Vec<u32> = locs.iter().map(|l| l.seg).collect();
                let seg = self.open_segment(g, &busy, need)?;
                g.open = Some(seg);
            }
            let seg = g.open.unwrap();
            let s = &mut g.segs[seg as usize];
            locs.push(Loc {
                seg,
                off: s.top as u32,
                len: p as u32,
            });
            s.top += need;
        }
        Some(locs)
    }

    fn open_segment(&self, g: &mut Inner, busy: &[u32], need: u64) -> Option<u32> {
        // Compaction may borrow one segment beyond the grant as its destination (it frees more
        // than it fills, and the daemon allows a segment of slack).
        let reserve = u64::from(g.pinned.is_some());
        if g.resident < self.limit_segs() + reserve {
            if let Some(seg) = g.free_segs.pop() {
                g.resident += 1;
                let s = &mut g.segs[seg as usize];
                *s = Seg {
                    used: true,
                    gen: self.ctrl.gen(seg).load(Ordering::Acquire),
                    ..Default::default()
                };
                return Some(seg);
            }
        }
        // At the grant: reuse the segment with the fewest bytes of hot objects (then the
        // coldest), keeping the open one and any that hold pieces of the object being placed.
        let threshold = g.protect_above;
        let infos: Vec<(SegInfo, u64)> = seg_infos(g, self.nseg)
            .into_iter()
            .filter(|i| Some(i.seg) != g.open && Some(i.seg) != g.pinned && !busy.contains(&i.seg))
            .map(|i| {
                let hot = self
                    .hot_objects(g, i.seg, threshold)
                    .iter()
                    .map(|h| h.2)
                    .sum();
                (i, hot)
            })
            .collect();
        let victim = infos
            .iter()
            .min_by_key(|(i, hot)| (*hot, i.hotness, i.live, i.seg))?
            .0
            .seg;
        Some(self.reuse_segment(g, victim, threshold, need))
    }

    /// The objects of segment `seg` in one piece there that are hotter than `threshold`:
    /// (slot, hotness, bytes it takes), hottest first.
    fn hot_objects(&self, g: &Inner, seg: u32, threshold: u16) -> Vec<(u32, u16, u64)> {
        let mut v: Vec<(u32, u16, u64)> = g.segs[seg as usize]
            .objs
            .iter()
            .filter_map(|&slot| {
                let o = &g.objs[slot as usize];
                match o.place {
                    Place::One(l) if l.seg == seg && o.hot > threshold => {
                        Some((slot, o.hot, HEADER + round16(l.len as u64)))
                    }
                    _ => None,
                }
            })
            .collect();
        v.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.dedup_by_key(|x| x.0);
        v
    }

    /// Reuses segment `seg` as the open one: its objects hotter than `threshold` (at most
    /// [`KEEP_MAX`] bytes, and room for a piece of `need` bytes after them) are moved to its
    /// start, the others evicted. Hot objects thus gather in segments that are not reused,
    /// and a reused segment's cold objects leave without its hot ones (segregation by hotness,
    /// as a log-structured store's cleaner segregates by age).
    ///
    /// The move is a copy out with validation (a punch of the segment makes it a loss, never a
    /// corruption), then a write of a new version: readers without the lock see the old place
    /// withdrawn before the segment is written again.
    fn reuse_segment(&self, g: &mut Inner, seg: u32, threshold: u16, need: u64) -> u32 {
        let budget = KEEP_MAX.min(SEG.saturating_sub(need));
        // The kept objects' bytes, end to end in the pool's one scratch buffer: allocated once
        // (the objects' sizes with their headers add up to at most `budget`), where a buffer
        // per object made the C library grow and trim its heap at every reuse, page faults
        // that cost more than the copies (`bench/results/midas/README.md`).
        let mut scratch = std::mem::take(&mut g.scratch);
        scratch.clear();
        scratch.reserve_exact(KEEP_MAX as usize);
        let mut kept: Vec<(u32, u16, std::ops::Range<usize>)> = Vec::new();
        let mut bytes = 0;
        for (slot, hot, size) in self.hot_objects(g, seg, threshold) {
            if bytes + size > budget {
                continue;
            }
            let start = scratch.len();
            if !self.try_append(g, slot, &mut scratch) {
                if !g.segs[seg as usize].used {
                    break; // the segment itself was punched: nothing of it is kept
                }
                continue;
            }
            bytes += size;
            kept.push((slot, hot, start..scratch.len()));
        }
        if g.segs[seg as usize].used {
            for (slot, _, _) in &kept {
                self.drop_place(g, *slot);
            }
            self.empty_segment(g, seg);
            g.stats.released_segments += 1;
        } else {
            // Punched meanwhile (and released): take it back from the free list.
            kept.clear();
            g.free_segs.retain(|&s| s != seg);
            g.resident += 1;
        }
        g.segs[seg as usize] = Seg {
            used: true,
            gen: self.ctrl.gen(seg).load(Ordering::Acquire),
            ..Default::default()
        };
        g.open = Some(seg);
        for (slot, hot, bytes) in kept {
            // Room was reserved above; a punch of the segment (it is no longer open) ends the
            // moves, and what was not moved is a miss later.
            if g.open != Some(seg) {
                break;
            }
            if self.write_locked(g, slot, &scratch[bytes]) {
                g.stats.kept_hot_objects += 1;
            }
            g.objs[slot as usize].hot = hot;
        }
        scratch.clear();
        g.scratch = scratch;
        seg
    }

    /// Takes object `slot` out of its place (its pieces stop counting as live); reads without
    /// the lock see it gone.
    fn drop_place(&self, g: &mut Inner, slot: u32) {
        let place = std::mem::take(&mut g.objs[slot as usize].place);
        if matches!(place, Place::One(_)) {
            self.publish_one(g, slot, None);
        }
        for l in place.locs() {
            let s = &mut g.segs[l.seg as usize];
            s.live = s.live.saturating_sub(HEADER + round16(l.len as u64));
        }
    }

    fn evict(&self, g: &mut Inner, slot: u32) {
        let len = g.objs[slot as usize].len;
        self.drop_place(g, slot);
        g.evicted_bytes += len.max(1);
        g.objs[slot as usize].evicted_at = g.evicted_bytes;
    }

    /// Drops every object with a piece in `seg` (they become misses).
    fn empty_segment(&self, g: &mut Inner, seg: u32) {
        let objs = std::mem::take(&mut g.segs[seg as usize].objs);
        for slot in objs {
            let here = g.objs[slot as usize]
                .place
                .locs()
                .iter()
                .any(|l| l.seg == seg);
            if here {
                self.evict(g, slot);
            }
        }
        if g.open == Some(seg) {
            g.open = None;
        }
    }

    /// Gives segment `seg` back: objects dropped, memory punched, the segment free.
    fn release(&self, g: &mut Inner, seg: u32) {
        self.empty_segment(g, seg);
        let s = &mut g.segs[seg as usize];
        if s.used {
            s.used = false;
            g.resident -= 1;
            g.free_segs.push(seg);
        }
        let _ = shared::punch_segment(&self.memfd, seg);
    }

    /// The daemon punched `seg` (its generation moved): drop its objects, punch again whatever
    /// a racing copy faulted back in, and mark it free.
    fn revoke(&self, g: &mut Inner, seg: u32) {
        if !g.segs[seg as usize].used {
            return;
        }
        g.stats.revoked_segments += 1;
        self.release(g, seg);
    }

    fn compact_segment(&self, g: &mut Inner, seg: u32) -> bool {
        g.pinned = Some(seg);
        let r = self.compact_pinned(g, seg);
        g.pinned = None;
        r
    }

    fn compact_pinned(&self, g: &mut Inner, seg: u32) -> bool {
        let objs: Vec<u32> = g.segs[seg as usize].objs.clone();
        let mut buf = Vec::new();
        for slot in objs {
            let here = g.objs[slot as usize]
                .place
                .locs()
                .iter()
                .any(|l| l.seg == seg);
            if !here {
                continue;
            }
            // A fault-tolerant move: copy out with validation (a punch of the source makes it a
            // loss, not a corruption), then write anew (a punch of the destination is caught by
            // the write's own generation check).
            if !self.try_copy(g, slot, &mut buf) {
                if !g.segs[seg as usize].used {
                    return false; // the source segment itself was revoked
                }
                continue;
            }
            let hot = g.objs[slot as usize].hot;
            if g.open == Some(seg) {
                g.open = None;
            }
            if !self.write_locked(g, slot, &buf) {
                continue;
            }
            g.objs[slot as usize].hot = hot;
            g.stats.moved_objects += 1;
        }
        if g.segs[seg as usize].used {
            self.release(g, seg);
            g.stats.compacted_segments += 1;
        }
        true
    }

    /// One evacuator pass: notice punched segments, shrink to the grant (compacting what fits,
    /// releasing cold segments), compact when short of free space, age hotness, and
    /// publish the cold order and usage for the daemon.
    pub(crate) fn evacuate(&self, force_scan: bool) {
        let mut g = self.lock();
        // Under the lock, so that the published total never goes down.
        self.ctrl
            .word(shared::OFF_HITS)
            .store(self.hits.total(), Ordering::Relaxed);
        for seg in 1..=self.nseg {
            if g.segs[seg as usize].used
                && self.ctrl.gen(seg).load(Ordering::Acquire) != g.segs[seg as usize].gen
            {
                self.revoke(&mut g, seg);
            }
        }
        let limit = self.limit_segs();
        if g.resident > limit {
            let need = (g.resident - limit) as usize;
            let infos = seg_infos(&g, self.nseg);
            let room = g.open.map_or(0, |s| SEG - g.segs[s as usize].top);
            let keep: Vec<u32> = g.open.into_iter().collect();
            let released_before = g.stats.released_segments;
            let mut actions = plan::shrink(&infos, need, room, &keep, SEG);
            if actions.len() < need {
                // Not enough besides the open segment: it goes too.
                actions.extend(keep.iter().map(|&s| Action::Release(s)));
            }
            for a in actions {
                match a {
                    Action::Compact(s) => {
                        self.compact_segment(&mut g, s);
                    }
                    Action::Release(s) => {
                        self.release(&mut g, s);
                        g.stats.released_segments += 1;
                    }
                }
                // Segments compacted into may have had to open new ones: stop at the grant.
                if g.resident <= limit {
                    break;
                }
            }
            let n = g.stats.released_segments - released_before;
            self.count(shared::OFF_RELEASED, n);
        } else {
            let free = limit - g.resident;
            let headroom = (limit / 10).max(1);
            if free < headroom {
                let infos = seg_infos(&g, self.nseg);
                let room = (free + 1) * SEG + g.open.map_or(0, |s| SEG - g.segs[s as usize].top);
                let keep: Vec<u32> = g.open.into_iter().collect();
                for s in plan::compaction(&infos, &keep, room, SEG) {
                    self.compact_segment(&mut g, s);
                    self.count(shared::OFF_EVACUATED, 1);
                }
            }
        }
        if !force_scan && g.last_scan.is_some_and(|t| t.elapsed() < SCAN_EVERY) {
            self.ctrl
                .word(shared::OFF_USED)
                .store(g.resident * SEG, Ordering::Relaxed);
            self.ctrl
                .word(shared::OFF_HEARTBEAT)
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        g.last_scan = Some(Instant::now());
        // Scan: hits taken without the lock join the objects' hotness; hotness per segment;
        // the cut above which objects survive the reuse of their segment; then age every
        // object (an exponentially weighted count of its accesses).
        for o in g.objs.iter_mut() {
            let hits = o.words.take_hits();
            if hits > 0 {
                o.hot = o.hot.saturating_add(u16::from(hits) * HIT_WEIGHT);
            }
        }
        g.protect_above = protect_above(&g.objs, self.limit_segs() * SEG);
        for seg in 1..=self.nseg as usize {
            if !g.segs[seg].used {
                continue;
            }
            let mut objs = std::mem::take(&mut g.segs[seg].objs);
            objs.sort_unstable();
            objs.dedup();
            let mut hot = 0u64;
            objs.retain(|&slot| {
                let o = &g.objs[slot as usize];
                match o.place.locs().iter().find(|l| l.seg as usize == seg) {
                    Some(l) => {
                        hot += (l.len as u64 + HEADER) * o.hot as u64;
                        true
                    }
                    None => false,
                }
            });
            g.segs[seg].objs = objs;
            g.segs[seg].hotness = hot;
        }
        for o in g.objs.iter_mut() {
            if o.hot > 0 {
                o.hot -= (o.hot >> AGE_SHIFT).max(1);
            }
        }
        let order = plan::cold_order(&seg_infos(&g, self.nseg));
        self.ctrl
            .word(shared::OFF_COLD_LEN)
            .store(0, Ordering::Release);
        for (i, s) in order.iter().enumerate() {
            self.ctrl.cold(i).store(*s, Ordering::Relaxed);
        }
        self.ctrl
            .word(shared::OFF_COLD_LEN)
            .store(order.len() as u64, Ordering::Release);
        self.ctrl
            .word(shared::OFF_USED)
            .store(g.resident * SEG, Ordering::Relaxed);
        self.ctrl
            .word(shared::OFF_HEARTBEAT)
            .fetch_add(1, Ordering::Relaxed);
    }
}

fn seg_infos(g: &Inner, nseg: u32) -> Vec<SegInfo> {
    (1..=nseg)
        .filter(|&s| g.segs[s as usize].used)
        .map(|s| {
            let x = &g.segs[s as usize];
            SegInfo {
                seg: s,
                live: x.live,
                used: x.top,
                hotness: x.hotness,
            }
        })
        .collect()
}

/// The hotness above which objects are kept when their segment is reused: the hottest objects
/// present, by bytes, up to [`PROTECT_NUM`]/[`PROTECT_DEN`] of `grant` bytes (a histogram of
/// hotness in steps of one access, so a scan costs one pass over the objects).
fn protect_above(objs: &[Obj], grant: u64) -> u16 {
    const STEP: u32 = HIT_WEIGHT.trailing_zeros(); // one bucket per access's worth
    let mut hist = vec![0u64; (u16::MAX >> STEP) as usize + 1];
    for o in objs {
        let bytes: u64 = o
            .place
            .locs()
            .iter()
            .map(|l| HEADER + round16(l.len as u64))
            .sum();
        if bytes > 0 {
            hist[(o.hot >> STEP) as usize] += bytes;
        }
    }
    let cap = grant / PROTECT_DEN * PROTECT_NUM;
    let mut sum = 0u64;
    for b in (0..hist.len()).rev() {
        sum += hist[b];
        if sum > cap {
            // Objects in this bucket and below are not kept.
            return (((b as u32 + 1) << STEP) - 1) as u16;
        }
    }
    0
}

fn round16(n: u64) -> u64 {
    n.div_ceil(16) * 16
}

fn header(slot: u32, version: u32, len: u32, piece: u32) -> [u8; HEADER as usize] {
    let mut h = [0u8; HEADER as usize];
    h[0..4].copy_from_slice(&slot.to_le_bytes());
    h[4..8].copy_from_slice(&version.to_le_bytes());
    h[8..12].copy_from_slice(&len.to_le_bytes());
    h[12..16].copy_from_slice(&(TAG | piece).to_le_bytes());
    h
}

fn header_ok(h: &[u8; HEADER as usize], slot: u32, version: u32, len: u32, piece: u32) -> bool {
    *h == header(slot, version, len, piece)
}

/// [`header`] as the two little-endian words it is in memory.
#[inline(always)]
fn header_words(slot: u32, version: u32, len: u32, piece: u32) -> (u64, u64) {
    (
        u64::from(slot) | u64::from(version) << 32,
        u64::from(len) | u64::from(TAG | piece) << 32,
    )
}

fn evacuator(weak: Weak<PoolInner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        if inner.closing() {
            return;
        }
        let tick = inner.cfg.tick;
        {
            let g = inner.lock();
            let _ = inner.wake.wait_timeout(g, tick);
        }
        inner.evacuate(false);
    }
}
