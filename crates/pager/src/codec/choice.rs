//! Which compressor a write-back batch uses under `--compress auto`, chosen by what each costs
//! per page on this link.
//!
//! Over a link to the store, a page's blob crosses it twice (written back, later read), so the
//! bytes a stronger compressor saves are worth the more CPU it takes only where the link is
//! slow *per byte*. Over a 32 MB/s link (`gleaner memnode --bandwidth 32M`) memcached's pages of
//! random letters, which LZ4 barely compresses, cost less each under zstd (encoding plus twice
//! the commit) than under LZ4; over TCP loopback at full speed the demo job's pages, already
//! small under LZ4, take as long to commit either way (the memnode's work per page, not the
//! bytes, makes the time) and zstd's CPU is pure loss (both measured in
//! `bench/results/compress-auto/README.md`).
//! Neither the link's rate nor its per-page costs can be told apart from a batch's time alone
//! (batches of one program have nearly the same pages and bytes), so both compressors are
//! measured instead: each batch's cost per page (its encoding, which is where the compressor's
//! CPU shows, plus twice its commit, which is where the bytes show) feeds a moving average per
//! compressor, every batch uses the cheaper one, and one batch in [`EXPLORE_EVERY`] the other,
//! so a change of link or of data turns the choice (`bench/results/compress-auto/`).
//!
//! Only a store with a link asks (a socket, `StoreHandle::choose_compressor`); through shared
//! memory pages are always compressed with LZ4. Averages are relaxed atomics shared by the
//! region's evicting threads: a lost update only delays the choice by a batch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// One batch in this many uses the compressor not chosen, to keep its cost known.
pub(crate) const EXPLORE_EVERY: u64 = 16;
/// Weight of a new batch in a compressor's moving average (1/2: the compressor not chosen is
/// measured only one batch in [`EXPLORE_EVERY`], and a change must not take a hundred of its
/// batches to show).
const NEW_SHARE: u64 = 2;

/// How much less than LZ4 a page must cost with zstd for zstd to be chosen (an eighth): its
/// decoding, on the fault path, is not in the batch's cost and takes several times LZ4's, and where
/// the two cost alike (over TCP loopback with the memnode's work per page making the time) the
/// faster decoder should win.
pub(crate) const ZSTD_MARGIN: f64 = 0.125;

/// The two compressors `auto` chooses between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compressor {
    /// LZ4: cheap to encode and decode, the choice until zstd is measured cheaper.
    Lz4,
    /// zstd level 1: smaller blobs for more CPU.
    Zstd,
}

/// The region's costs per page for each compressor, and the choice they make.
#[derive(Default)]
pub(crate) struct CompressorChoice {
    /// Batches chosen for so far (for exploring).
    batches: AtomicU64,
    /// Moving averages of a batch's cost per page in nanoseconds, LZ4's then zstd's (0: not
    /// measured yet).
    ns_per_page: [AtomicU64; 2],
}

impl CompressorChoice {
    /// The compressor the next batch uses.
    pub(crate) fn pick(&self) -> Compressor {
        let n = self.batches.fetch_add(1, Ordering::Relaxed);
        let [lz4, zstd] = self.costs();
        let other = match self.chosen() {
            Compressor::Lz4 => Compressor::Zstd,
            Compressor::Zstd => Compressor::Lz4,
        };
        // Each compressor is measured early (LZ4 first), then the one not chosen for one batch
        // in EXPLORE_EVERY.
        if lz4 == 0 {
            return Compressor::Lz4;
        }
        if zstd == 0 || n % EXPLORE_EVERY == EXPLORE_EVERY - 1 {
            return other;
        }
        self.chosen()
    }

    /// The cheaper compressor by the batches measured so far: zstd where it costs at least
    /// [`ZSTD_MARGIN`] less than LZ4, LZ4 otherwise (and until both are measured).
    pub(crate) fn chosen(&self) -> Compressor {
        match self.costs() {
            [lz4, zstd]
                if zstd != 0 && lz4 != 0 && zstd as f64 <= lz4 as f64 * (1.0 - ZSTD_MARGIN) =>
            {
                Compressor::Zstd
            }
            _ => Compressor::Lz4,
        }
    }

    /// A batch of `pages` written back with `with` took `encode` to encode and `commit` to
    /// commit.
    pub(crate) fn observed(
        &self,
        with: Compressor,
        pages: usize,
        encode: Duration,
        commit: Duration,
    ) {
        if pages == 0 {
            return;
        }
        let cost = (encode + 2 * commit).as_nanos() as u64 / pages as u64;
        let avg = &self.ns_per_page[with as usize];
        let old = avg.load(Ordering::Relaxed);
        let new = if old == 0 {
            cost
        } else {
            old - old / NEW_SHARE + cost / NEW_SHARE
        };
        avg.store(new.max(1), Ordering::Relaxed);
    }

    /// The costs per page in microseconds, LZ4's and zstd's (0: not measured).
    pub(crate) fn us_per_page(&self) -> [f64; 2] {
        self.costs().map(|ns| ns as f64 / 1000.0)
    }

    fn costs(&self) -> [u64; 2] {
        [
            self.ns_per_page[0].load(Ordering::Relaxed),
            self.ns_per_page[1].load(Ordering::Relaxed),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `batches` batches of 16 pages, each compressor costing what `cost` says per page
    /// (encode, commit) in µs; returns how many used zstd.
    fn run(c: &CompressorChoice, batches: usize, cost: impl Fn(Compressor) -> (u64, u64)) -> usize {
        let mut zstd = 0;
        for _ in 0..batches {
            let with = c.pick();
            zstd += usize::from(with == Compressor::Zstd);
            let (encode, commit) = cost(with);
            c.observed(
                with,
                16,
                Duration::from_micros(16 * encode),
                Duration::from_micros(16 * commit),
            );
        }
        zstd
    }

    #[test]
    fn a_slow_link_turns_the_choice_to_zstd_and_a_fast_one_back() {
        let c = CompressorChoice::default();
        assert_eq!(c.chosen(), Compressor::Lz4, "nothing measured");
        // 32 MB/s and memcached's pages: LZ4 1.5 + 113 µs a page, zstd 14 + 70.
        let slow = |with| match with {
            Compressor::Lz4 => (2, 113),
            Compressor::Zstd => (14, 70),
        };
        let zstd = run(&c, 160, slow);
        assert_eq!(c.chosen(), Compressor::Zstd);
        assert!(zstd >= 140, "{zstd} of 160 batches");
        // Fast TCP and the demo job: the commit is per page, 7 µs either way.
        let fast = |with| match with {
            Compressor::Lz4 => (2, 7),
            Compressor::Zstd => (8, 7),
        };
        let zstd = run(&c, 320, fast);
        assert_eq!(c.chosen(), Compressor::Lz4);
        assert!(zstd <= 160, "{zstd} of 320 batches");
        // Still exploring: one batch in EXPLORE_EVERY.
        let zstd = run(&c, 160, fast);
        assert_eq!(zstd as u64, 160 / EXPLORE_EVERY);
        let [lz4_us, zstd_us] = c.us_per_page();
        assert!(lz4_us < zstd_us, "{lz4_us} {zstd_us}");
    }

    #[test]
    fn both_are_tried_early_and_empty_batches_teach_nothing() {
        let c = CompressorChoice::default();
        assert_eq!(c.pick(), Compressor::Lz4);
        c.observed(Compressor::Lz4, 0, Duration::from_secs(1), Duration::ZERO);
        assert_eq!(c.us_per_page(), [0.0, 0.0]);
        c.observed(
            Compressor::Lz4,
            1,
            Duration::from_micros(1),
            Duration::from_micros(10),
        );
        assert_eq!(c.pick(), Compressor::Zstd, "zstd's first measurement");
    }
}
