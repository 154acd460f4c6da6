//! Keeping decompression's bill on the fault path bounded: decompression may cost at most a
//! budget per page *on average*, and pages that would decode slower are stored raw only when the
//! average has no room left for them.
//!
//! Decompressing sits on every remote fault's critical path, and its cost depends on the data, not
//! only on its size: LZ4 decodes a page of 8-byte counters (`gleaner bench micro`'s pages: one
//! short match per word, 510 sequences) several times slower than a page of text (the counters'
//! time is in `bench/results/DETAILS.md`, "(b) The codec's cost on the fault path"), while saving
//! only half of the page, and compressing such a page again at every eviction costs the reclaim
//! path more than the decode. So the codec learns, per *chunk* of [`CHUNK_PAGES`] neighbouring
//! pages (data of one kind tends to sit together), whether decoding is cheap:
//!
//! - a chunk starts *unknown*: the next page encoded there is compressed and then decoded once
//!   as a trial, off the fault path (twice if the first trial was slow, keeping the faster, so
//!   a preemption does not condemn a chunk), and the chunk becomes *fast* or *slow*, or
//!   *incompressible* when the page did not compress at all;
//! - pages of an *incompressible* chunk are stored raw without a compression attempt (LZ4 takes
//!   a few microseconds to find that a page of random letters, memcached's values in the
//!   harness, does not compress);
//! - pages of a *slow* chunk are compressed while the region's decompressions have *credit*,
//!   and stored raw without an attempt when they have none (below);
//! - a page of a *fast* chunk that does not compress sends the chunk back to *unknown*;
//! - every [`RELEARN_AFTER`]-th encoding in a chunk learns again (data changes);
//! - a decode on the fault path slower than the budget in a *fast* chunk makes it *unknown*
//!   again (confirmed by a trial at its next encoding).
//!
//! The map also steers compression's own cost, which the reclaim path pays at every eviction: a
//! chunk whose last compressed page saved less than a fifth of it is *poor*, and its next pages
//! are compressed with LZ4's acceleration [`LZ4_FAST_ACCELERATION`] (it gives up sooner on
//! stretches without matches); a page there that saves a fifth or more makes the chunk ordinary
//! again. On memcached's and redis's pages in the harness, which compress little, that about
//! halved LZ4's time per page and cut the reclaim thread's CPU per page, for a slightly lower
//! ratio (`bench/results/lz4-fast-ab/README.md`). Pages that compress well (the demo job's) keep
//! LZ4's default and their ratio.
//!
//! # The credit: the budget is a mean, not a limit per page
//!
//! Every decompression adds the budget less its own time to the region's credit (kept within
//! [`CREDIT_PAGES`] pages' worth of budget either way), so the credit is what the mean over the
//! decompressions done so far leaves to spend. A slow chunk's page is compressed only while the
//! credit is positive. A program whose far pages mostly decode fast therefore keeps its few
//! slow ones compressed too (the quick-start demo job: Python's object pages decode slower than
//! the budget and halve, its 2 KiB values decode far faster; with a limit per page many of its
//! far pages were stored raw and its far memory grew, while the mean stays under the budget with
//! every page compressed: `bench/results/codec/README.md`), and one whose pages all decode
//! slowly (`bench micro`'s counters) earns no credit and keeps them raw. A decision made per page
//! by a time measured on a busy VM also moved with the machine's speed that day: a mean is
//! steadier. Pages evicted but never fetched again cost no decompression at all, and the credit
//! charges only those fetched.
//!
//! The states live in one byte per chunk, read and written with relaxed atomics: a lost update
//! only changes whether one page is compressed, never what it decodes to.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicUsize, Ordering};

use crate::PAGE_SIZE;

/// Pages per chunk that share one learned decision (256 KiB).
pub const CHUNK_PAGES: u64 = 64;
/// Encodings in a chunk between two learnings.
pub const RELEARN_AFTER: u8 = 63;
/// The decode budget with LZ4 when none is given: the bound on decompression per page.
pub const DEFAULT_MAX_DECODE_NS: u64 = 1500;
/// The credit is kept within this many pages' worth of the budget, either way: a long run of
/// fast decodes cannot pay for an unbounded burst of slow pages later, and a burst of slow
/// decodes is paid back within as many fast ones.
pub const CREDIT_PAGES: i64 = 256;

/// LZ4's acceleration for the pages of a *poor* chunk (the library's default is 1).
pub const LZ4_FAST_ACCELERATION: i32 = 16;
/// A compressed page longer than this (it saved less than a fifth) makes its chunk poor.
const POOR_ABOVE: usize = PAGE_SIZE * 4 / 5;

const UNKNOWN: u8 = 0;
const FAST: u8 = 1;
const SLOW: u8 = 2;
const INCOMPRESSIBLE: u8 = 3;
const STATE_MASK: u8 = 3;
const COUNT_ONE: u8 = 4;

/// What decompression may cost per page, on average, before slow pages are stored raw.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum DecodeBudget {
    /// 1.5 µs with LZ4 (the fault path's bound); none with zstd, chosen for memory over speed.
    #[default]
    Auto,
    /// No bound: every page that compresses is stored compressed.
    Off,
    /// This many microseconds.
    Micros(f64),
}

impl DecodeBudget {
    /// The budget in nanoseconds, `auto` standing for `auto_ns` (the compressor's own default:
    /// `codec/mod.rs`), or `None` for no bound.
    pub fn nanos(&self, auto_ns: Option<u64>) -> Option<u64> {
        match self {
            DecodeBudget::Off => None,
            DecodeBudget::Auto => auto_ns,
            DecodeBudget::Micros(us) => Some((us * 1000.0).round() as u64),
        }
    }
}

impl std::str::FromStr for DecodeBudget {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(DecodeBudget::Auto),
            "off" | "none" => Ok(DecodeBudget::Off),
            _ => match s.parse::<f64>() {
                Ok(us) if us.is_finite() && us > 0.0 => Ok(DecodeBudget::Micros(us)),
                _ => Err(format!(
                    "`{s}` is not a decode budget: use a number of microseconds above 0 \
                     (e.g. 1.5), auto (1.5 with lz4, none with zstd) or off"
                )),
            },
        }
    }
}

impl std::fmt::Display for DecodeBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeBudget::Auto => f.write_str("auto"),
            DecodeBudget::Off => f.write_str("off"),
            DecodeBudget::Micros(us) => write!(f, "{us}"),
        }
    }
}

/// What to do with the page being encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice {
    /// Compress it (its chunk decodes fast).
    Compress,
    /// Compress it although its chunk decodes slowly: the mean has room for it.
    OnCredit,
    /// Compress it and time a trial decode: the chunk's decision is due.
    Learn,
    /// Store it raw (its chunk decodes slowly and the mean has no room for it).
    Raw,
    /// Store it raw (its chunk's pages do not compress).
    Incompressible,
}

/// The learned decision of every chunk of a region.
pub(crate) struct SpeedMap {
    chunks: Box<[AtomicU8]>,
    /// Per chunk: whether its last compressed page saved less than a fifth (see the module's
    /// doc).
    poor: Box<[AtomicBool]>,
    /// One past the highest chunk ever given a decision: the census of decisions
    /// ([`SpeedMap::raw_chunks`]) stops there rather than reading every chunk of the arena.
    learnt_end: AtomicUsize,
    budget_ns: u64,
    /// What the mean of the decompressions so far leaves to spend, in nanoseconds (see the
    /// module's doc).
    credit_ns: AtomicI64,
}

impl SpeedMap {
    /// A map for a region of `pages` pages, every chunk unknown.
    pub(crate) fn new(pages: u64, budget_ns: u64) -> SpeedMap {
        let n = pages.div_ceil(CHUNK_PAGES).max(1) as usize;
        // Zeroed memory the kernel fills as it is used (256 KiB each for a 64 GiB arena):
        // UNKNOWN is 0, as is `false`.
        const _: () = assert!(UNKNOWN == 0);
        let chunks = Box::<[AtomicU8]>::new_zeroed_slice(n);
        let poor = Box::<[AtomicBool]>::new_zeroed_slice(n);
        // SAFETY: an all-zero byte is a valid AtomicU8 holding UNKNOWN and a valid AtomicBool
        // holding false.
        let (chunks, poor) = unsafe { (chunks.assume_init(), poor.assume_init()) };
        SpeedMap {
            chunks,
            poor,
            learnt_end: AtomicUsize::new(0),
            budget_ns,
            credit_ns: AtomicI64::new(0),
        }
    }

    /// The budget, in nanoseconds.
    pub(crate) fn budget_ns(&self) -> u64 {
        self.budget_ns
    }

    /// A map of the same size and budget with everything unknown (a fork child's).
    pub(crate) fn fresh(&self) -> SpeedMap {
        SpeedMap::new(self.chunks.len() as u64 * CHUNK_PAGES, self.budget_ns)
    }

    fn chunk(&self, page_no: u64) -> Option<&AtomicU8> {
        self.chunks.get((page_no / CHUNK_PAGES) as usize)
    }

    /// Whether page `page_no` is to be compressed with [`LZ4_FAST_ACCELERATION`]: its chunk's
    /// last compressed page saved less than a fifth.
    pub(crate) fn compress_fast(&self, page_no: u64) -> bool {
        self.poor
            .get((page_no / CHUNK_PAGES) as usize)
            .is_some_and(|p| p.load(Ordering::Relaxed))
    }

    /// A page of `page_no`'s chunk was just compressed to `len` bytes (`None`: it did not
    /// compress): the chunk is poor if that saved less than a fifth.
    pub(crate) fn compressed(&self, page_no: u64, len: Option<usize>) {
        if let Some(p) = self.poor.get((page_no / CHUNK_PAGES) as usize) {
            p.store(len.is_none_or(|n| n > POOR_ABOVE), Ordering::Relaxed);
        }
    }

    /// What to do with page `page_no`, about to be encoded.
    pub(crate) fn choose(&self, page_no: u64) -> Choice {
        let Some(c) = self.chunk(page_no) else {
            return Choice::Compress;
        };
        let s = c.load(Ordering::Relaxed);
        let state = s & STATE_MASK;
        if state == UNKNOWN || s >> 2 >= RELEARN_AFTER {
            return Choice::Learn;
        }
        c.store(s + COUNT_ONE, Ordering::Relaxed);
        match state {
            SLOW if self.credit_ns() > 0 => Choice::OnCredit,
            SLOW => Choice::Raw,
            INCOMPRESSIBLE => Choice::Incompressible,
            _ => Choice::Compress,
        }
    }

    /// A trial decode of a page of `page_no`'s chunk took `decode_ns`: records the chunk's
    /// decision and returns whether it is slow.
    pub(crate) fn learned(&self, page_no: u64, decode_ns: u64) -> bool {
        let slow = decode_ns > self.budget_ns;
        if let Some(c) = self.chunk(page_no) {
            c.store(if slow { SLOW } else { FAST }, Ordering::Relaxed);
            self.note_learnt(page_no);
        }
        slow
    }

    /// A page of `page_no`'s chunk did not compress: after a trial (`learning`) the chunk is
    /// incompressible; otherwise a chunk thought fast learns again at its next encoding.
    pub(crate) fn incompressible(&self, page_no: u64, learning: bool) {
        if let Some(c) = self.chunk(page_no) {
            if learning {
                c.store(INCOMPRESSIBLE, Ordering::Relaxed);
                self.note_learnt(page_no);
            } else if c.load(Ordering::Relaxed) & STATE_MASK == FAST {
                c.store(UNKNOWN, Ordering::Relaxed);
            }
        }
    }

    /// Whether a decode of `decode_ns` is over the budget.
    pub(crate) fn over(&self, decode_ns: u64) -> bool {
        decode_ns > self.budget_ns
    }

    /// A page of `page_no`'s chunk took `decode_ns` to decompress: the credit takes the budget
    /// less that time, and a slow decode in a chunk thought fast makes it unknown, to be learnt
    /// again at its next encoding. Returns whether the decode was over the budget.
    pub(crate) fn observed(&self, page_no: u64, decode_ns: u64) -> bool {
        // Saturating: a budget given as an absurd number of microseconds must not overflow.
        let budget = i64::try_from(self.budget_ns).unwrap_or(i64::MAX);
        let cap = budget.saturating_mul(CREDIT_PAGES);
        let change = budget.saturating_sub(i64::try_from(decode_ns).unwrap_or(i64::MAX));
        // A lost race between two updates only misplaces one page's worth of credit.
        let credit = self.credit_ns.load(Ordering::Relaxed);
        self.credit_ns.store(
            credit.saturating_add(change).clamp(-cap, cap),
            Ordering::Relaxed,
        );
        if !self.over(decode_ns) {
            return false;
        }
        if let Some(c) = self.chunk(page_no) {
            let s = c.load(Ordering::Relaxed);
            if s & STATE_MASK == FAST {
                c.store(UNKNOWN, Ordering::Relaxed);
            }
        }
        true
    }

    /// Adds `ns` to the credit (a test's way to give a region credit without timing decodes).
    #[cfg(test)]
    pub(crate) fn add_credit(&self, ns: i64) {
        self.credit_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The credit now, in nanoseconds: positive while the decompressions' mean is under the
    /// budget.
    pub(crate) fn credit_ns(&self) -> i64 {
        self.credit_ns.load(Ordering::Relaxed)
    }

    /// Page `page_no`'s chunk was just given a decision.
    fn note_learnt(&self, page_no: u64) {
        let end = (page_no / CHUNK_PAGES) as usize + 1;
        if self.learnt_end.load(Ordering::Relaxed) < end {
            self.learnt_end.fetch_max(end, Ordering::Relaxed);
        }
    }

    /// Chunks now learnt slow, and incompressible.
    pub(crate) fn raw_chunks(&self) -> (u64, u64) {
        let learnt = &self.chunks[..self
            .learnt_end
            .load(Ordering::Relaxed)
            .min(self.chunks.len())];
        let count = |state| {
            learnt
                .iter()
                .filter(|c| c.load(Ordering::Relaxed) & STATE_MASK == state)
                .count() as u64
        };
        (count(SLOW), count(INCOMPRESSIBLE))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse_and_default_by_compressor() {
        assert_eq!("auto".parse::<DecodeBudget>().unwrap(), DecodeBudget::Auto);
        assert_eq!("off".parse::<DecodeBudget>().unwrap(), DecodeBudget::Off);
        assert_eq!(
            "2.5".parse::<DecodeBudget>().unwrap(),
            DecodeBudget::Micros(2.5)
        );
        assert!("0".parse::<DecodeBudget>().is_err());
        assert!("-1".parse::<DecodeBudget>().is_err());
        assert!("fast".parse::<DecodeBudget>().is_err());
        assert_eq!(DecodeBudget::Auto.nanos(Some(1500)), Some(1500));
        assert_eq!(DecodeBudget::Auto.nanos(None), None);
        assert_eq!(DecodeBudget::Micros(2.5).nanos(None), Some(2500));
        assert_eq!(DecodeBudget::Off.nanos(Some(1500)), None);
    }

    #[test]
    fn a_chunk_learns_then_keeps_its_decision_until_it_relearns() {
        let m = SpeedMap::new(3 * CHUNK_PAGES, 1000);
        assert_eq!(m.choose(5), Choice::Learn);
        assert!(m.learned(5, 2000));
        // Its neighbours (same chunk) are stored raw without an attempt; other chunks are unknown.
        for _ in 0..RELEARN_AFTER {
            assert_eq!(m.choose(CHUNK_PAGES - 1), Choice::Raw);
        }
        assert_eq!(m.choose(CHUNK_PAGES), Choice::Learn);
        assert_eq!(m.raw_chunks(), (1, 0));
        // After RELEARN_AFTER encodings the chunk learns again, and data that now decodes fast
        // is compressed again.
        assert_eq!(m.choose(0), Choice::Learn);
        assert!(!m.learned(0, 300));
        assert_eq!(m.choose(1), Choice::Compress);
        assert_eq!(m.raw_chunks(), (0, 0));
    }

    #[test]
    fn the_census_of_decisions_counts_every_learnt_chunk_up_to_the_last_one() {
        // A 64 GiB arena's map, as the preload library makes one per process.
        let pages = 16 << 20;
        let m = SpeedMap::new(pages, 1000);
        assert_eq!(m.raw_chunks(), (0, 0));
        let last_chunk = (pages - 1) / CHUNK_PAGES;
        // Decisions out of order: the census must reach the highest chunk whichever came last.
        assert!(m.learned(7 * CHUNK_PAGES + 3, 5000));
        assert!(m.learned(pages - 1, 5000));
        m.incompressible(2 * CHUNK_PAGES, true);
        assert!(!m.learned(CHUNK_PAGES, 10));
        assert_eq!(m.raw_chunks(), (2, 1));
        assert_eq!(
            m.learnt_end.load(Ordering::Relaxed),
            last_chunk as usize + 1
        );
        // A chunk that learns again (now fast) leaves the count, and a fresh map (a fork
        // child's) starts with none.
        assert!(!m.learned(pages - 1, 10));
        assert_eq!(m.raw_chunks(), (1, 1));
        assert_eq!(m.fresh().raw_chunks(), (0, 0));
    }

    #[test]
    fn a_chunk_whose_trial_does_not_compress_skips_compression_until_it_relearns() {
        let m = SpeedMap::new(2 * CHUNK_PAGES, 1000);
        assert_eq!(m.choose(0), Choice::Learn);
        m.incompressible(0, true);
        for _ in 0..RELEARN_AFTER {
            assert_eq!(m.choose(7), Choice::Incompressible);
        }
        assert_eq!(m.raw_chunks(), (0, 1));
        assert_eq!(m.choose(7), Choice::Learn);
        // A fast chunk with one page that does not compress learns again.
        assert!(!m.learned(CHUNK_PAGES, 100));
        m.incompressible(CHUNK_PAGES + 1, false);
        assert_eq!(m.choose(CHUNK_PAGES + 2), Choice::Learn);
    }

    #[test]
    fn a_slow_decode_on_the_fault_path_sends_a_fast_chunk_back_to_learning() {
        let m = SpeedMap::new(CHUNK_PAGES, 1000);
        assert_eq!(m.choose(0), Choice::Learn);
        assert!(!m.learned(0, 500));
        assert!(!m.observed(3, 900));
        assert_eq!(m.choose(3), Choice::Compress);
        assert!(m.observed(3, 1100));
        assert_eq!(m.choose(3), Choice::Learn);
        // Pages beyond the map (never in a region) are simply compressed.
        assert_eq!(m.choose(10 * CHUNK_PAGES), Choice::Compress);
    }

    #[test]
    fn slow_chunks_are_compressed_while_the_mean_decode_has_room_and_raw_when_it_has_none() {
        let m = SpeedMap::new(2 * CHUNK_PAGES, 1000);
        // Chunk 0 decodes slowly, chunk 1 fast.
        assert_eq!(m.choose(0), Choice::Learn);
        assert!(m.learned(0, 3000));
        assert_eq!(m.choose(CHUNK_PAGES), Choice::Learn);
        assert!(!m.learned(CHUNK_PAGES, 200));
        // No decompression yet, no credit: the slow chunk's pages are stored raw.
        assert_eq!(m.credit_ns(), 0);
        assert_eq!(m.choose(1), Choice::Raw);
        // Ten fast decompressions (200 ns against 1000) leave 8000 ns to spend ...
        for _ in 0..10 {
            assert!(!m.observed(CHUNK_PAGES + 1, 200));
        }
        assert_eq!(m.credit_ns(), 8000);
        assert_eq!(m.choose(2), Choice::OnCredit);
        assert_eq!(m.choose(CHUNK_PAGES + 2), Choice::Compress);
        // ... which four slow ones (3000 ns: 2000 over) spend: then slow pages are raw again.
        for _ in 0..4 {
            assert!(m.observed(2, 3000));
        }
        assert_eq!(m.credit_ns(), 0);
        assert_eq!(m.choose(3), Choice::Raw);
        // The mean of those 14 decompressions is exactly the budget.
        assert_eq!((10 * 200 + 4 * 3000) / 14, 1000);
    }

    #[test]
    fn the_credit_is_kept_within_its_bounds_either_way() {
        let m = SpeedMap::new(CHUNK_PAGES, 1000);
        let cap = CREDIT_PAGES * 1000;
        for _ in 0..2 * CREDIT_PAGES {
            m.observed(0, 0);
        }
        assert_eq!(m.credit_ns(), cap);
        // A decode that took absurdly long (a preempted thread) cannot sink it beyond the bound.
        m.observed(0, u64::MAX);
        assert_eq!(m.credit_ns(), -cap);
        for _ in 0..CREDIT_PAGES {
            m.observed(0, 0);
        }
        assert_eq!(m.credit_ns(), 0);
        // Neither does an absurd budget (`--max-decode-us 1e30`) overflow anything.
        let m = SpeedMap::new(CHUNK_PAGES, u64::MAX);
        assert!(!m.observed(0, 5));
        assert!(!m.observed(0, u64::MAX));
        assert!(m.credit_ns() > 0);
    }
}
