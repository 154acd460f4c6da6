//! Hermes (Middleware'21): the pure decisions behind a latency-critical service's reserve and the
//! node daemon's batch reclaimer. No system calls: the preload library's management thread and
//! the node daemon feed in what they measured and carry out what these functions decide.
//!
//! * [`heap_plan`]: gradual heap reservation (the paper's Algorithm 1) for small requests.
//! * [`bucket`], [`chunk_len`], [`large_block_offset`]: the segregated pool of pre-faulted chunks
//!   for large requests (Algorithm 2); [`demand_rate`], [`reaction_peak`], [`horizon_us`],
//!   [`pool_target`]: how much it holds (the large requests' rate over the thread's measured
//!   reaction time).
//! * [`watermark`]: how much free memory the daemon keeps, sized from the latency-critical
//!   processes' allocation rate.
//! * [`files_to_drop`]: which batch files' page cache goes first (largest first), and how much.
//! * [`range_behind`]: which part of a file being read to drop (what its reader just read).

/// Requests of this many bytes or more are *large*: served from the chunk pool (the paper's
/// `min_mmap_size`, glibc's default mmap threshold).
pub const LARGE: usize = 128 * 1024;
/// The pool's buckets: bucket `b` holds chunks of `[b * LARGE, (b + 1) * LARGE)` bytes, the last
/// one every chunk from `TABLE_SIZE * LARGE` up (the paper's `table_size`).
pub const TABLE_SIZE: usize = 8;
/// The least a reserve keeps ready (the paper's `min_rsv`, 5 MB).
pub const MIN_RESERVE: usize = 5 << 20;
/// Reserve this many times the bytes asked in the last interval (the paper's `RSV_FACTOR`).
pub const RESERVE_FACTOR: usize = 2;
/// The heap grows in steps of at least this much: each step is pre-faulted outside the heap's
/// lock and joins it in O(1), so a step's size no longer decides how long a request waits (the
/// paper steps by the average request size because it extends the heap under the lock).
pub const MIN_STEP: usize = 256 * 1024;

/// What the management thread saw of one kind of request (small or large) in its last interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Interval {
    /// Bytes requested.
    pub bytes: usize,
    /// Requests.
    pub count: usize,
}

impl Interval {
    /// The mean request, if any were made.
    pub fn mean(&self) -> Option<usize> {
        (self.count > 0).then(|| self.bytes / self.count)
    }
}

/// The demand of an interval of `elapsed` scaled to one `period` (Hermes's `f`): the rate the
/// reserve's target is sized from. The management thread sleeps until the reserve runs low, so
/// its intervals vary in length; a long quiet interval must not inflate the target, and one cut
/// short by a burst keeps its bytes as they are (never scaled up). The mean request is kept.
pub fn per_period(last: Interval, elapsed_us: u64, period_us: u64) -> Interval {
    if last.count == 0 || elapsed_us <= period_us {
        return last;
    }
    let mean = last.bytes / last.count;
    let count = ((last.count as u128 * period_us as u128 / elapsed_us as u128) as usize).max(1);
    Interval {
        bytes: mean * count,
        count,
    }
}

/// The target a reserve is refilled to: `RESERVE_FACTOR` times the last interval's demand, at
/// least [`MIN_RESERVE`], never more than `bound` (the reserve's configured ceiling).
pub fn target(last: Interval, bound: usize) -> usize {
    (RESERVE_FACTOR * last.bytes).max(MIN_RESERVE).min(bound)
}

/// Algorithm 1's decision for the small-request heap: how many bytes to add now, in steps of
/// how many bytes. `free` is the heap's reserved bytes not yet handed out.
///
/// The heap is refilled once it falls under half its target (the paper's `RSV_THR`, which it
/// does not publish; its released code expands at half of the top chunk's use), up to the
/// target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapPlan {
    /// Bytes to add (0: nothing to do).
    pub grow: usize,
    /// Each step's size, a multiple of `page`.
    pub step: usize,
}

/// [`HeapPlan`] for the heap after an interval `last`, with `free` bytes ready, under `bound`.
pub fn heap_plan(last: Interval, free: usize, bound: usize, page: usize) -> HeapPlan {
    let tgt = target(last, bound);
    let step = round_up(last.mean().unwrap_or(0).max(MIN_STEP), page);
    if free >= tgt / 2 || free >= bound {
        return HeapPlan { grow: 0, step };
    }
    let grow = round_up(tgt - free, step).min(round_down(bound - free, step));
    HeapPlan { grow, step }
}

/// The bucket of a chunk of `len` bytes.
pub fn bucket(len: usize) -> usize {
    (len / LARGE).min(TABLE_SIZE)
}

/// The length of the chunk that serves a request of `size` bytes with a `header` before it:
/// whole pages.
pub fn chunk_len(size: usize, header: usize, page: usize) -> Option<usize> {
    size.checked_add(header)
        .and_then(|n| n.checked_add(page - 1))
        .map(|n| n / page * page)
}

/// Where a large block starts in its chunk (which is page-aligned, and one page longer than the
/// block needs): at a cache line from the second to the last of the first page, picked by
/// hashing `seq` (a count of large requests), then rounded up to `align` (a power of two, at most
/// `page`). At most `page`, at least one cache line, which holds the block's 16-byte header.
///
/// Why not right after the header, as small blocks: with every large block at the same page
/// offset (16), the kernel's socket copies into and out of them ran 1.7x slower (a 200 KiB
/// value received into a fresh block and a reply sent from another, over TCP loopback: p50
/// 223-293 µs against 147-180 with glibc's or jemalloc's blocks; at any other offset tried, 32
/// to 2,048 bytes, 144-167 µs; `bench/hermes/sockcopy.c`). The socket buffers' data sit at
/// fixed page offsets too, so the copies' loads and stores kept the same small distance modulo
/// the page, the pattern that stalls a copy on false store-to-load dependencies ("4K
/// aliasing"). jemalloc offsets its large blocks by a random cache line for the same reason
/// (its `cache_oblivious` option).
pub fn large_block_offset(seq: u64, align: usize, page: usize) -> usize {
    const LINE: usize = 64;
    let lines = (page / LINE).saturating_sub(1).max(1) as u64;
    // Fibonacci hashing: consecutive requests land far apart, every line equally often.
    let k = (seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % lines;
    (LINE * (k as usize + 1)).next_multiple_of(align.max(1))
}

/// The demand rate (bytes per second) the pool is sized from, after `bytes` were asked in
/// `elapsed_us`, given the previous estimate `prev`: a sliding window of `window_us` (the part of
/// the window the interval does not cover keeps the previous rate). A steady rate is kept as it
/// is whatever the interval's length; a burst in a short interval raises the estimate by its
/// bytes over the window, not by its instantaneous rate; an interval longer than the window is
/// its own rate.
pub fn demand_rate(prev: f64, bytes: usize, elapsed_us: u64, window_us: u64) -> f64 {
    let window = window_us.max(1) as f64;
    let elapsed = elapsed_us as f64;
    if elapsed >= window {
        return bytes as f64 * 1e6 / elapsed;
    }
    (bytes as f64 + prev.max(0.0) * (window - elapsed) / 1e6) * 1e6 / window
}

/// How long the pool must last between the moment it runs low and the moment the thread's
/// refill lands: the period (Hermes's `f`, which assumes the thread acts within it) or, if
/// longer, the thread's measured reaction time (its scheduling delay after a wake-up plus the
/// time it was off its CPU while refilling: on a busy machine a `SCHED_BATCH` thread waits out
/// another task's time slice, several milliseconds).
pub fn horizon_us(period_us: u64, reaction_us: u64) -> u64 {
    period_us.max(reaction_us)
}

/// The reaction time the pool is sized for: the longest seen, halving every second after it
/// (`since_us`: since the last update), raised at once by a longer `sample_us`.
pub fn reaction_peak(peak_us: u64, since_us: u64, sample_us: Option<u64>) -> u64 {
    let halvings = since_us / 1_000_000;
    let decayed = if halvings >= 64 {
        0
    } else {
        peak_us >> halvings
    };
    decayed.max(sample_us.unwrap_or(0))
}

/// The pool's target from its demand rate: `RESERVE_FACTOR` times what the program asks in one
/// horizon ([`horizon_us`]), at least [`MIN_RESERVE`], never more than `bound`. Hermes sizes it
/// from the bytes of the last interval, which assumes the thread runs every period; sized from
/// the rate over the thread's actual reaction time, the pool lasts until the refill lands.
pub fn pool_target(rate_bytes_per_s: f64, horizon_us: u64, bound: usize) -> usize {
    let ahead = rate_bytes_per_s.max(0.0) * horizon_us as f64 / 1e6;
    ((RESERVE_FACTOR as f64 * ahead) as usize)
        .max(MIN_RESERVE)
        .min(bound)
}

/// The free memory the daemon keeps on the node: what the latency-critical processes allocate
/// in `horizon_ms` at their measured rate (bytes per second), doubled (the reserve's factor),
/// at least `floor` bytes. Their first touches then find free pages instead of direct reclaim.
pub fn watermark(lc_bytes_per_s: f64, horizon_ms: u64, floor: u64) -> u64 {
    let ahead = lc_bytes_per_s.max(0.0) * horizon_ms as f64 / 1000.0;
    ((RESERVE_FACTOR as f64 * ahead) as u64).max(floor)
}

/// What the daemon frees once free memory fell under the `watermark`: enough to bring it back to
/// half again the watermark (hysteresis: a batch job streaming a file refills its cache at once,
/// and dropping it back to the watermark exactly would mean dropping again at every tick).
/// None while `available` is at or above the watermark.
pub fn shortfall(available: u64, watermark: u64) -> Option<u64> {
    (available < watermark).then(|| watermark + watermark / 2 - available)
}

/// One file a batch process holds, with the bytes of it in the page cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedFile<K> {
    /// What the caller knows the file by (a path, a device and inode).
    pub key: K,
    /// Its bytes in the page cache.
    pub cached: u64,
}

/// The files whose page cache to drop to free `need` bytes, with the bytes to drop of each:
/// largest first (few calls free much, as the paper argues), all of each file's cache but the
/// last one's, of which only what is still needed. Files with nothing cached are never picked.
pub fn files_to_drop<K: Clone>(files: &[CachedFile<K>], need: u64) -> Vec<(K, u64)> {
    let mut order: Vec<&CachedFile<K>> = files.iter().filter(|f| f.cached > 0).collect();
    order.sort_by_key(|f| std::cmp::Reverse(f.cached));
    let mut freed = 0;
    let mut out = Vec::new();
    for f in order {
        if freed >= need {
            break;
        }
        let take = f.cached.min(need - freed);
        freed += take;
        out.push((f.key.clone(), take));
    }
    out
}

/// The byte ranges (offset, length) of a file of `size` bytes to drop to free about `bytes`,
/// given the position `pos` its reader is at: the `bytes` just behind it, wrapping to the file's
/// end. A batch job that re-reads a file cyclically reads those last again (dropping them is
/// what is optimal for a cyclic scan, where the kernel's LRU drops what it reads next), and one
/// that reads a file once never again. Ranges are whole pages; `bytes` at or beyond the file's
/// size, or an unknown position, give the whole file: `[(0, size)]`.
pub fn range_behind(size: u64, pos: Option<u64>, bytes: u64) -> Vec<(u64, u64)> {
    const PAGE: u64 = 4096;
    let bytes = bytes.div_ceil(PAGE) * PAGE;
    let Some(pos) = pos.filter(|_| bytes < size) else {
        return vec![(0, size)];
    };
    let pos = (pos.min(size)).div_ceil(PAGE) * PAGE;
    if pos >= bytes {
        vec![(pos - bytes, bytes)]
    } else {
        let rest = bytes - pos;
        let end = size.div_ceil(PAGE) * PAGE;
        let mut out = vec![(end.saturating_sub(rest), rest)];
        if pos > 0 {
            out.insert(0, (0, pos));
        }
        out
    }
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

fn round_down(x: usize, to: usize) -> usize {
    x / to * to
}

#[cfg(test)]
mod tests {
    #[test]
    fn large_blocks_start_at_spread_cache_lines_within_the_first_page() {
        use super::large_block_offset;
        let mut seen = std::collections::HashSet::new();
        for seq in 0..630u64 {
            let off = large_block_offset(seq, 16, 4096);
            assert!(
                (64..=4032).contains(&off) && off.is_multiple_of(64),
                "{seq}: {off}"
            );
            seen.insert(off);
        }
        // Every one of the 63 choices, over ten times as many requests.
        assert_eq!(seen.len(), 63);
        // Consecutive requests do not share an offset.
        assert_ne!(
            large_block_offset(7, 16, 4096),
            large_block_offset(8, 16, 4096)
        );
        for align in [16, 64, 128, 1024, 4096] {
            for seq in 0..200u64 {
                let off = large_block_offset(seq, align, 4096);
                assert!(
                    off.is_multiple_of(align) && (64..=4096).contains(&off),
                    "{align} {seq}: {off}"
                );
            }
        }
        assert_eq!(large_block_offset(3, 4096, 4096), 4096);
    }

    use super::*;
    const P: usize = 4096;

    #[test]
    fn the_heap_refills_under_half_its_target_and_stays_under_the_bound() {
        let idle = Interval::default();
        // Nothing asked yet: the minimum reserve, in 256 KiB steps.
        let plan = heap_plan(idle, 0, 64 << 20, P);
        assert_eq!(plan.step, MIN_STEP);
        assert_eq!(plan.grow, MIN_RESERVE.div_ceil(MIN_STEP) * MIN_STEP);
        // More than half of the target ready: nothing.
        assert_eq!(heap_plan(idle, MIN_RESERVE / 2, 64 << 20, P).grow, 0);
        // A busy interval: twice its bytes.
        let busy = Interval {
            bytes: 20 << 20,
            count: 20,
        };
        let plan = heap_plan(busy, 0, 64 << 20, P);
        assert_eq!(plan.step, 1 << 20);
        assert_eq!(plan.grow, 40 << 20);
        // Never past the bound.
        let plan = heap_plan(busy, 1 << 20, 8 << 20, P);
        assert!(plan.grow + (1 << 20) <= 8 << 20, "{plan:?}");
        assert_eq!(heap_plan(busy, 8 << 20, 8 << 20, P).grow, 0);
    }

    #[test]
    fn a_long_interval_counts_as_its_rate_per_period() {
        let i = |bytes, count| Interval { bytes, count };
        // 100 requests of 1 KiB over 200 ms, with a 2 ms period: one request per period.
        assert_eq!(per_period(i(100 << 10, 100), 200_000, 2_000), i(1 << 10, 1));
        // A burst that woke the thread early is not scaled up.
        assert_eq!(per_period(i(50 << 10, 50), 500, 2_000), i(50 << 10, 50));
        // A rare request keeps its size (the pool learns its chunk length from the mean).
        assert_eq!(
            per_period(i(256 << 10, 1), 1_000_000, 2_000),
            i(256 << 10, 1)
        );
        assert_eq!(per_period(i(0, 0), 1_000_000, 2_000), i(0, 0));
    }

    #[test]
    fn buckets_are_linear_and_the_last_is_open() {
        assert_eq!(bucket(LARGE), 1);
        assert_eq!(bucket(2 * LARGE - 1), 1);
        assert_eq!(bucket(256 * 1024 + 4096), 2);
        assert_eq!(bucket(100 << 20), TABLE_SIZE);
        assert_eq!(chunk_len(256 * 1024, 16, P), Some(256 * 1024 + P));
        assert_eq!(chunk_len(usize::MAX, 16, P), None);
    }

    #[test]
    fn the_demand_rate_is_a_sliding_window() {
        // 2.5 GB/s whatever the interval's length.
        let r = 2.5e9;
        for e in [100, 500, 2_000, 10_000] {
            let bytes = (r * e as f64 / 1e6) as usize;
            let got = demand_rate(r, bytes, e, 2_000);
            assert!((got - r).abs() < 1e3, "{e} us: {got}");
        }
        // From nothing: a short interval counts over the whole window (learned within it).
        assert_eq!(
            demand_rate(0.0, 1 << 20, 500, 2_000),
            (1u64 << 20) as f64 * 500.0
        );
        // A quiet interval brings the estimate down in proportion.
        assert_eq!(demand_rate(1e9, 0, 1_000, 2_000), 0.5e9);
        assert_eq!(demand_rate(1e9, 0, 5_000, 2_000), 0.0);
    }

    #[test]
    fn the_pool_lasts_the_thread_s_reaction_time() {
        // 2.5 GB/s of 256 KiB requests, the thread reacting within the 2 ms period: twice 5 MB.
        assert_eq!(
            pool_target(2.5e9, horizon_us(2_000, 500), 64 << 20),
            10_000_000
        );
        // A thread that waited 4 ms for its CPU: twice 10 MB.
        assert_eq!(
            pool_target(2.5e9, horizon_us(2_000, 4_000), 64 << 20),
            20_000_000
        );
        // At least the minimum, at most the bound.
        assert_eq!(pool_target(0.0, 2_000, 64 << 20), MIN_RESERVE);
        assert_eq!(pool_target(1e12, 4_000, 48 << 20), 48 << 20);
        // The peak halves per second and a longer sample raises it at once.
        assert_eq!(reaction_peak(4_000, 0, Some(1_000)), 4_000);
        assert_eq!(reaction_peak(4_000, 1_000_000, None), 2_000);
        assert_eq!(reaction_peak(4_000, 2_500_000, Some(1_500)), 1_500);
        assert_eq!(reaction_peak(1_000, 10, Some(6_000)), 6_000);
        assert_eq!(reaction_peak(u64::MAX, u64::MAX, None), 0);
    }

    #[test]
    fn the_watermark_follows_the_allocation_rate() {
        assert_eq!(watermark(0.0, 1000, 64 << 20), 64 << 20);
        assert_eq!(watermark(100e6, 1000, 64 << 20), 200_000_000);
    }

    #[test]
    fn the_shortfall_overshoots_the_watermark_by_half() {
        assert_eq!(shortfall(100, 100), None);
        assert_eq!(shortfall(60, 100), Some(90));
        assert_eq!(shortfall(0, 100), Some(150));
    }

    #[test]
    fn files_go_largest_first_until_enough_is_freed() {
        let f = |key: &'static str, cached| CachedFile { key, cached };
        let files = [f("a", 10), f("b", 300), f("c", 0), f("d", 50)];
        assert_eq!(files_to_drop(&files, 1), vec![("b", 1)]);
        assert_eq!(files_to_drop(&files, 320), vec![("b", 300), ("d", 20)]);
        assert_eq!(
            files_to_drop(&files, 10_000),
            vec![("b", 300), ("d", 50), ("a", 10)]
        );
        assert!(files_to_drop(&files, 0).is_empty());
    }

    #[test]
    fn the_range_dropped_is_what_the_reader_just_read() {
        const M: u64 = 1 << 20;
        // Behind the reader.
        assert_eq!(
            range_behind(100 * M, Some(50 * M), 10 * M),
            vec![(40 * M, 10 * M)]
        );
        // Wrapping to the file's end.
        assert_eq!(
            range_behind(100 * M, Some(4 * M), 10 * M),
            vec![(0, 4 * M), (94 * M, 6 * M)]
        );
        assert_eq!(
            range_behind(100 * M, Some(0), 10 * M),
            vec![(90 * M, 10 * M)]
        );
        // Whole pages: a position within a page counts that page as read.
        assert_eq!(range_behind(100 * M, Some(M + 1), 4096), vec![(M, 4096)]);
        // The whole file: more asked than it holds, or no position known.
        assert_eq!(
            range_behind(100 * M, Some(50 * M), 100 * M),
            vec![(0, 100 * M)]
        );
        assert_eq!(range_behind(100 * M, None, M), vec![(0, 100 * M)]);
    }
}
