//! Leap's majority-trend prefetcher (Leap, USENIX ATC 2020).
//!
//! # What follows the paper
//!
//! * **Access history** (§2.3): a FIFO ring of `h_size` (32) deltas between consecutive faulting
//!   pages, logged on every page-in fault, misses and prefetch hits alike. The very first fault
//!   logs a delta of 0, as in the paper's example (faults 0x2, 0x5, … → 0, +3, …).
//! * **FINDTREND** (§2.4, [`find_trend`]): Boyer–Moore majority vote over windows of the most
//!   recent `w` deltas, `w = h_size / n_split`, doubling up to `h_size`; a delta is the majority
//!   if it occurs at least `⌊w/2⌋ + 1` times. Windows hold exactly `w` entries (the example and
//!   the public code, not the paper's `w + 1`).
//! * **Prefetch window** (§2.5): `C_hit` = hits on prefetched pages since the previous decision;
//!   `PW = 1` if `C_hit = 0` and the last delta equals the trend, else 0; otherwise
//!   `PW = next_pow2(C_hit + 1)`; capped at `pw_max` (8) and never below half the previous
//!   window (8 → 4 → 2 → 1 → 0).
//! * **Candidates** (§2.5): with a majority Δ, `P_t + i·Δ` for `i = 1..PW`; without one, the same
//!   walk along the previous trend (speculative prefetch; "around P_t" is read as the forward
//!   walk, as a user-space port suggests). With PW = 0 nothing is fetched.
//!
//! # gleaner adaptations
//!
//! * **Trend detection runs at every decision**, also while the window is 0, and a trend found
//!   replaces the previous one. Otherwise a suspended prefetcher whose new trend differs from the
//!   old one could never restart (PW = 1 needs the last delta to equal the trend). This is how
//!   "nothing is prefetched until a new trend appears" is implemented.
//! * **Decisions on misses and at window markers.** In the kernel, Leap decides on swap-cache
//!   misses only, so a sequential scan misses once per `PW_max + 1` pages. In gleaner a prefetched
//!   page waits unmapped, so its first use is a fault we see: like Linux's asynchronous readahead
//!   marker, the first page of each issued batch is a *marker*, and a prefetch hit at or past the
//!   marker is a decision point too. Such a decision continues the walk from the end of the
//!   previous batch (when it used the same Δ) instead of restarting at `P_t`, so the prefetcher
//!   stays between one and two windows ahead of the stream. Other prefetch hits only count
//!   towards `C_hit` and the history.
//! * **Only timely hits count** towards `C_hit`: a page of a batch the stream issued within its
//!   last [`RECENT_FAULTS`] faults (or its marker). Prefetched pages wait long (a marker until
//!   its first use, the rest until evicted), so once accesses turn random a page of an old batch
//!   is still hit by chance (at 50% local memory, many of them), long after. Counted, those hits
//!   kept the window open along a trend long gone (redis after loading its keys: many prefetches
//!   wasted, and a share of its GET throughput lost with them:
//!   `docs/decisions/0011-leap-counts-timely-hits.md`). A stream that follows its batches hits
//!   them a few faults after they are issued.
//! * **Streams per thread, history per process** (the issue: "streams tracked per process and per
//!   thread"). Each thread (`uffd_msg` thread id) has its own history, trend, window and marker,
//!   so interleaved threads with different strides each keep their trend. A process-wide history,
//!   fed with every fault as in the paper, is the fallback when a thread's own history shows no
//!   majority (e.g. threads that share one sequential scan). `per_thread = false` gives the
//!   paper's single per-process stream. The number of thread streams is bounded
//!   (`max_streams`, least recently used stream dropped).
//! * Deltas are computed exactly (`i128`) and clamped to `i64`, and candidates that would leave
//!   `0..=u64::MAX` are dropped: page-number arithmetic never wraps.

use std::collections::{HashMap, VecDeque};

use super::{walk, Fault, Prefetcher, DEFAULT_DEPTH};

/// The difference `cur - prev` between two page numbers, computed exactly and clamped to the
/// `i64` range (so a jump across the whole page space is a huge delta, never a wrapped one).
pub fn delta(prev: u64, cur: u64) -> i64 {
    let d = i128::from(cur) - i128::from(prev);
    d.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// FINDTREND over a history given most-recent-first (`hist[0]` is the latest delta), as
/// Leap's FINDTREND is written.
///
/// Windows of `w = h_size / n_split` (at least 1), `2w`, … up to `h_size` entries are examined in
/// turn; the first window with a majority (`≥ ⌊w/2⌋ + 1` occurrences, found by a Boyer–Moore
/// vote and verified by a count) gives the trend. Only the first `h_size` entries are used. A
/// window longer than the history is never examined: a history shorter than the first window
/// has no trend.
pub fn find_trend(hist: &[i64], h_size: usize, n_split: usize) -> Option<i64> {
    let len = hist.len().min(h_size);
    find_trend_by(len, h_size, n_split, |j| hist[j])
}

fn find_trend_by(
    len: usize,
    h_size: usize,
    n_split: usize,
    get: impl Fn(usize) -> i64,
) -> Option<i64> {
    let mut w = (h_size / n_split.max(1)).max(1);
    while w <= h_size {
        if w > len {
            return None;
        }
        // Boyer–Moore pass 1: the only possible majority.
        let (mut cand, mut count) = (0i64, 0usize);
        for j in 0..w {
            let d = get(j);
            if count == 0 {
                cand = d;
                count = 1;
            } else if d == cand {
                count += 1;
            } else {
                count -= 1;
            }
        }
        // Pass 2: verification.
        let occurrences = (0..w).filter(|&j| get(j) == cand).count();
        if occurrences > w / 2 {
            return Some(cand);
        }
        w *= 2;
    }
    None
}

/// A fixed-capacity ring of page deltas (Leap's `ACCESSHISTORY`). Allocates once.
#[derive(Debug, Clone)]
pub struct History {
    buf: Vec<i64>,
    /// Index of the most recent entry.
    head: usize,
    len: usize,
}

impl History {
    /// An empty history holding at most `h_size` deltas (at least 1).
    pub fn new(h_size: usize) -> Self {
        History {
            buf: vec![0; h_size.max(1)],
            head: 0,
            len: 0,
        }
    }

    /// Appends a delta, dropping the oldest when full.
    pub fn push(&mut self, d: i64) {
        self.head = if self.head + 1 == self.buf.len() {
            0
        } else {
            self.head + 1
        };
        self.buf[self.head] = d;
        self.len = (self.len + 1).min(self.buf.len());
    }

    /// The number of deltas held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no delta was logged yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The capacity `h_size`.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// The `j`-th most recent delta (`j = 0` is the latest). Panics if `j >= len()`.
    pub fn recent(&self, j: usize) -> i64 {
        assert!(j < self.len, "history index {j} out of {}", self.len);
        let n = self.buf.len();
        self.buf[if j <= self.head {
            self.head - j
        } else {
            self.head + n - j
        }]
    }

    /// FINDTREND ([`find_trend`]) over this history. It runs on every fault and reads up to
    /// 112 entries through [`History::recent`], which is why that indexes the ring without a
    /// division (a `%` by the history's length, not a constant, cost a visible share of
    /// memcached's CPU at 50% local: `bench/results/harness-50/README.md`, "Leap's trend
    /// search").
    pub fn find_trend(&self, n_split: usize) -> Option<i64> {
        find_trend_by(self.len, self.buf.len(), n_split, |j| self.recent(j))
    }
}

/// Leap's parameters. [`Default`] gives the published ones (Leap, USENIX ATC 2020).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeapConfig {
    /// History length H_size (32).
    pub h_size: usize,
    /// The first window is `h_size / n_split` (4, as the public code; the paper's example uses 2).
    pub n_split: usize,
    /// Window cap PW_max (8).
    pub pw_max: usize,
    /// Per-thread streams with a process-wide fallback (true), or one process-wide stream only.
    pub per_thread: bool,
    /// The most thread streams kept (the least recently used is dropped beyond it).
    pub max_streams: usize,
}

impl Default for LeapConfig {
    fn default() -> Self {
        LeapConfig {
            h_size: 32,
            n_split: 4,
            pw_max: DEFAULT_DEPTH,
            per_thread: true,
            max_streams: 256,
        }
    }
}

/// A hit counts for its stream only on a batch issued within this many of the stream's faults.
pub const RECENT_FAULTS: u64 = 512;
/// Batches a stream remembers for that (a batch per decision at most).
const RECENT_BATCHES: usize = 64;

/// One batch issued: `first + i * step` for `i` up to `last`.
#[derive(Debug, Clone, Copy)]
struct Batch {
    first: u64,
    last: u64,
    step: i64,
    /// The stream's fault count when it was issued.
    at: u64,
}

impl Batch {
    fn holds(&self, page: u64) -> bool {
        let (diff, span, step) = (
            i128::from(page) - i128::from(self.first),
            i128::from(self.last) - i128::from(self.first),
            i128::from(self.step),
        );
        diff % step == 0 && (0..=span / step).contains(&(diff / step))
    }
}

#[derive(Debug, Clone)]
struct Stream {
    hist: History,
    last: Option<u64>,
    /// Δ_trend: the last majority found.
    trend: Option<i64>,
    pw_prev: usize,
    /// C_hit: prefetch hits since the last decision.
    hits: usize,
    /// First page of the last batch: a prefetch hit at or past it is a decision point.
    marker: Option<u64>,
    /// The last batches issued, newest last, with the stream's fault count when each was.
    recent: VecDeque<Batch>,
    /// Faults this stream has seen.
    faults: u64,
    /// Last page issued and the step it was issued along.
    ahead: Option<(u64, i64)>,
    /// Last use, for dropping the least recently used stream.
    stamp: u64,
}

impl Stream {
    fn new(h_size: usize) -> Self {
        Stream {
            hist: History::new(h_size),
            last: None,
            trend: None,
            pw_prev: 0,
            hits: 0,
            marker: None,
            recent: VecDeque::with_capacity(RECENT_BATCHES),
            faults: 0,
            ahead: None,
            stamp: 0,
        }
    }

    /// Logs the delta to `page` and returns it (0 for the first fault).
    fn observe(&mut self, page: u64) -> i64 {
        let d = self.last.map_or(0, |p| delta(p, page));
        self.faults += 1;
        self.hist.push(d);
        self.last = Some(page);
        d
    }

    /// GETPREFETCHWINDOWSIZE (§2.5) with `C_hit` taken (and reset) from the stream.
    fn window(&mut self, last_delta: i64, pw_max: usize) -> usize {
        let c_hit = std::mem::take(&mut self.hits);
        let mut pw = if c_hit == 0 {
            usize::from(self.trend == Some(last_delta))
        } else {
            (c_hit + 1).next_power_of_two()
        };
        pw = pw.min(pw_max);
        if pw < self.pw_prev / 2 {
            pw = self.pw_prev / 2;
        }
        self.pw_prev = pw;
        pw
    }

    /// Whether `page` belongs to a batch this stream issued within its last
    /// [`RECENT_FAULTS`] faults: a use of it follows the stream.
    fn on_batch(&self, page: u64) -> bool {
        self.recent
            .iter()
            .rev()
            .take_while(|b| self.faults - b.at <= RECENT_FAULTS)
            .any(|b| b.holds(page))
    }

    /// Remembers a batch just issued.
    fn issued(&mut self, batch: Batch) {
        if self.recent.len() == RECENT_BATCHES {
            self.recent.pop_front();
        }
        self.recent.push_back(batch);
    }

    /// Whether a prefetch hit on `page` reached the marker (at it or past it along the step,
    /// within two windows).
    fn reached_marker(&self, page: u64, pw_max: usize) -> bool {
        let (Some(m), Some((_, step))) = (self.marker, self.ahead) else {
            return false;
        };
        let diff = i128::from(page) - i128::from(m);
        let step = i128::from(step);
        diff == 0 || (diff % step == 0 && (0..=2 * pw_max as i128).contains(&(diff / step)))
    }
}

/// Leap's prefetcher: see the module documentation for the rules and the gleaner adaptations.
#[derive(Debug, Clone)]
pub struct Leap {
    cfg: LeapConfig,
    /// The process-wide stream (every fault); the only stream when `per_thread` is false.
    global: Stream,
    streams: HashMap<u32, Stream>,
    clock: u64,
    /// The thread whose stream last owned a hit reported by another thread.
    last_owner: Option<u32>,
}

impl Leap {
    /// A Leap prefetcher; zero sizes in `cfg` are taken as 1.
    pub fn new(mut cfg: LeapConfig) -> Self {
        cfg.h_size = cfg.h_size.max(1);
        cfg.n_split = cfg.n_split.max(1);
        cfg.max_streams = cfg.max_streams.max(1);
        Leap {
            global: Stream::new(cfg.h_size),
            streams: HashMap::new(),
            clock: 0,
            last_owner: None,
            cfg,
        }
    }

    /// The parameters in use.
    pub fn config(&self) -> &LeapConfig {
        &self.cfg
    }

    /// Δ_trend of `tid`'s stream (of the process stream without per-thread streams), if any.
    pub fn trend(&self, tid: u32) -> Option<i64> {
        self.stream(tid).and_then(|s| s.trend)
    }

    /// The last prefetch window of `tid`'s stream (0 when suspended or unknown).
    pub fn window(&self, tid: u32) -> usize {
        self.stream(tid).map_or(0, |s| s.pw_prev)
    }

    /// The number of thread streams currently kept.
    pub fn streams(&self) -> usize {
        self.streams.len()
    }

    fn stream(&self, tid: u32) -> Option<&Stream> {
        if self.cfg.per_thread {
            self.streams.get(&tid)
        } else {
            Some(&self.global)
        }
    }

    fn thread_stream(&mut self, tid: u32) -> &mut Stream {
        if !self.streams.contains_key(&tid) && self.streams.len() >= self.cfg.max_streams {
            if let Some(oldest) = self
                .streams
                .iter()
                .min_by_key(|(_, s)| s.stamp)
                .map(|(&t, _)| t)
            {
                self.streams.remove(&oldest);
            }
        }
        let h = self.cfg.h_size;
        let s = self.streams.entry(tid).or_insert_with(|| Stream::new(h));
        s.stamp = self.clock;
        s
    }

    /// Counts a hit on `page` for the thread stream whose recent batch holds it: `tid`'s own
    /// first, then the last other owner found (a marker's window is reported page by page); a
    /// page no stream's recent batch holds is not counted.
    fn credit_batch_owner(&mut self, page: u64, tid: u32) {
        for t in [Some(tid), self.last_owner].into_iter().flatten() {
            if let Some(s) = self.streams.get_mut(&t).filter(|s| s.on_batch(page)) {
                s.hits += 1;
                return;
            }
        }
        if let Some((&t, s)) = self.streams.iter_mut().find(|(_, s)| s.on_batch(page)) {
            s.hits += 1;
            self.last_owner = Some(t);
        }
    }

    /// One decision for stream `s` (Algorithm 2), with `fallback` the process-wide history.
    fn decide(
        cfg: &LeapConfig,
        s: &mut Stream,
        fallback: Option<&History>,
        fault: Fault,
        out: &mut Vec<u64>,
    ) {
        let page = fault.page;
        let marker_hit = fault.prefetch_hit && s.reached_marker(page, cfg.pw_max);
        let follows = marker_hit || (fault.prefetch_hit && s.on_batch(page));
        let d = s.observe(page);
        if fault.prefetch_hit {
            // Only a hit that follows the stream is evidence for it: a page of an old batch hit
            // by chance (random accesses reuse half of what a half-size memory holds) would keep
            // the window open along a trend that is gone.
            s.hits += usize::from(follows);
            if !marker_hit {
                return;
            }
        }
        let found = s
            .hist
            .find_trend(cfg.n_split)
            .or_else(|| fallback.and_then(|h| h.find_trend(cfg.n_split)));
        if found.is_some() {
            s.trend = found;
        }
        let pw = s.window(d, cfg.pw_max);
        let step = match found.or(s.trend) {
            Some(step) if pw > 0 && step != 0 => step,
            _ => {
                s.marker = None;
                s.ahead = None;
                return;
            }
        };
        // Continue a pipelined walk from the end of the previous batch on a marker hit.
        let mut first = 1u64;
        if marker_hit {
            if let Some((a, a_step)) = s.ahead {
                let diff = i128::from(a) - i128::from(page);
                let k = diff / i128::from(step);
                if a_step == step
                    && diff % i128::from(step) == 0
                    && (1..=2 * cfg.pw_max as i128).contains(&k)
                {
                    first = k as u64 + 1;
                }
            }
        }
        let before = out.len();
        walk(page, step, first, first + pw as u64 - 1, out);
        if out.len() > before {
            s.marker = Some(out[before]);
            s.ahead = Some((out[out.len() - 1], step));
            let at = s.faults;
            s.issued(Batch {
                first: out[before],
                last: out[out.len() - 1],
                step,
                at,
            });
        } else {
            s.marker = None;
            s.ahead = None;
        }
    }
}

impl Prefetcher for Leap {
    fn name(&self) -> String {
        if self.cfg.pw_max == DEFAULT_DEPTH {
            "leap".into()
        } else {
            format!("leap:{}", self.cfg.pw_max)
        }
    }

    fn on_fault(&mut self, fault: Fault, out: &mut Vec<u64>) {
        self.clock += 1;
        let cfg = self.cfg;
        if cfg.per_thread {
            self.global.observe(fault.page);
            let own = self.thread_stream(fault.tid);
            if fault.prefetch_hit
                && !own.on_batch(fault.page)
                && !own.reached_marker(fault.page, cfg.pw_max)
            {
                // Another thread's batch (threads sharing one scan): the hit is its evidence.
                self.credit_batch_owner(fault.page, fault.tid);
            }
            // Split borrows: the thread stream and the process-wide history.
            let s = self.streams.get_mut(&fault.tid).expect("just inserted");
            Self::decide(&cfg, s, Some(&self.global.hist), fault, out);
        } else {
            Self::decide(&cfg, &mut self.global, None, fault, out);
        }
    }

    fn on_prefetch_hit(&mut self, page: u64, tid: u32) {
        // As for a hit reported by a fault: only a page of a stream's recent batch counts.
        if self.cfg.per_thread {
            self.clock += 1;
            self.thread_stream(tid);
            self.credit_batch_owner(page, tid);
        } else if self.global.on_batch(page) {
            self.global.hits += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_ring_keeps_the_latest() {
        let mut h = History::new(3);
        assert!(h.is_empty());
        for d in 1..=5 {
            h.push(d);
        }
        assert_eq!(h.len(), 3);
        assert_eq!((h.recent(0), h.recent(1), h.recent(2)), (5, 4, 3));
    }

    #[test]
    fn the_ring_finds_the_trend_the_plain_history_has_at_every_fill_and_wrap() {
        // Deltas drawn from a few values, so that majorities come and go.
        let mut x = 12345u64;
        for h_size in [1, 3, 8, 32] {
            let mut h = History::new(h_size);
            let mut plain: Vec<i64> = Vec::new();
            for _ in 0..300 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                let d = [1, 1, 1, -2, 5][(x >> 33) as usize % 5];
                h.push(d);
                plain.insert(0, d);
                plain.truncate(h_size);
                assert_eq!(h.len(), plain.len());
                for (j, &d) in plain.iter().enumerate() {
                    assert_eq!(h.recent(j), d);
                }
                for n_split in [1, 2, 4] {
                    assert_eq!(
                        h.find_trend(n_split),
                        find_trend(&plain, h_size, n_split),
                        "h_size {h_size}, n_split {n_split}, history {plain:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn window_grows_with_hits_and_shrinks_by_halves() {
        let mut s = Stream::new(8);
        s.trend = Some(1);
        assert_eq!(s.window(1, 8), 1, "no hits, on trend: one page");
        s.hits = 3;
        assert_eq!(s.window(1, 8), 4, "next_pow2(3 + 1)");
        s.hits = 8;
        assert_eq!(s.window(1, 8), 8, "capped at PW_max");
        for expect in [4, 2, 1, 0, 0] {
            assert_eq!(s.window(5, 8), expect, "off trend, no hits: halves");
        }
    }
}
