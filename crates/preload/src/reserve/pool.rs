//! The reserve's pool for large requests: Hermes's segregated pool of pre-faulted chunks
//! (Algorithm 2).
//!
//! Bucket `b` holds chunks of `[b, b+1)` times 128 KiB, the last bucket every chunk from 1 MiB
//! up. A request takes a chunk of its own bucket that fits, else one of the next buckets up
//! (every chunk there is larger). A freed chunk goes back to its bucket while the pool stays
//! within its bound (a latency-critical service repeats its sizes, so chunks refit); beyond the
//! bound it is left to the management thread to release (off the request path).
//!
//! A request never waits on the pool's lock (`deferred.rs`): a `take` that finds it held past a
//! brief spin is answered "busy" (the request falls back), and a `put` that finds it held leaves
//! the chunk on a lock-free list that the lock's next holder files into its bucket.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};

use gleaner_policy::hermes::{bucket, TABLE_SIZE};

use super::deferred::Deferred;
use crate::lock::SpinLock;

/// A chunk: where it starts, its length, whether it is `mlock`ed, and whether it is fresh
/// (pre-faulted by the thread and never handed out: the program has not touched it).
#[derive(Clone, Copy)]
pub(crate) struct Chunk {
    pub(crate) start: usize,
    pub(crate) len: usize,
    pub(crate) locked: bool,
    pub(crate) fresh: bool,
}

/// The flags a chunk on the deferred list carries in its length's low bits (a multiple of the
/// page size).
const LOCKED: usize = 1;
const FRESH: usize = 2;

/// The pool's buckets and the bytes they hold.
pub(crate) struct Pool {
    buckets: SpinLock<Buckets>,
    /// Bytes of chunks in the pool, those on `deferred` included.
    pooled: AtomicUsize,
    /// Chunks put while the lock was held, not yet in their buckets (`len | flags`: [`LOCKED`],
    /// [`FRESH`]).
    deferred: Deferred,
}

/// Each bucket's chunks: fresh ones at the front (the last pre-faulted frontmost), freed ones at
/// the back (the last freed backmost).
type Buckets = [VecDeque<Chunk>; TABLE_SIZE + 1];

/// Files `c` into its bucket: a freed chunk at the back (taken first), a fresh one at the front
/// (taken when no freed one fits).
fn file(b: &mut Buckets, c: Chunk) {
    let chunks = &mut b[bucket(c.len)];
    if c.fresh {
        chunks.push_front(c);
    } else {
        chunks.push_back(c);
    }
}

/// Files the chunks on `deferred` into their buckets (the lock is held).
fn take_in(deferred: &Deferred, b: &mut Buckets) {
    for (start, tagged) in deferred.take_all() {
        file(
            b,
            Chunk {
                start,
                len: tagged & !(LOCKED | FRESH),
                locked: tagged & LOCKED != 0,
                fresh: tagged & FRESH != 0,
            },
        );
    }
}

/// Takes the chunk for a request of `len` bytes out of `b`: in the smallest bucket that has one
/// that fits, the one nearest the back (the last freed, else the first pre-faulted fresh one),
/// the others kept in their order.
fn take_from(b: &mut Buckets, len: usize) -> Option<Chunk> {
    for chunks in b.iter_mut().skip(bucket(len)) {
        if let Some(i) = chunks.iter().rposition(|c| c.len >= len) {
            return chunks.remove(i);
        }
    }
    None
}

impl Pool {
    pub(crate) const fn new() -> Pool {
        Pool {
            buckets: SpinLock::new([const { VecDeque::new() }; TABLE_SIZE + 1]),
            pooled: AtomicUsize::new(0),
            deferred: Deferred::new(),
        }
    }

    /// Bytes of chunks in the pool.
    pub(crate) fn pooled(&self) -> usize {
        self.pooled.load(Ordering::Relaxed)
    }

    /// A chunk of at least `len` bytes: the smallest bucket that can hold one first, and in it
    /// the chunk freed last (a fresh one if none fits). `Err(())` when the lock stayed held
    /// through a brief spin (the request goes elsewhere).
    #[allow(clippy::result_unit_err)]
    pub(crate) fn take(&self, len: usize) -> Result<Option<Chunk>, ()> {
        let c = self
            .buckets
            .try_with(|b| {
                take_in(&self.deferred, b);
                take_from(b, len)
            })
            .ok_or(())?;
        if let Some(c) = c {
            self.pooled.fetch_sub(c.len, Ordering::Relaxed);
        }
        Ok(c)
    }

    /// Puts `c` in the pool if the pool stays within `bound` bytes; gives it back otherwise. A
    /// chunk put while the lock is held waits on the deferred list for the next holder. A fresh
    /// chunk (`c.fresh`) goes behind every freed one.
    pub(crate) fn put(&self, c: Chunk, bound: usize) -> Result<(), Chunk> {
        if self.pooled.fetch_add(c.len, Ordering::Relaxed) + c.len > bound {
            self.pooled.fetch_sub(c.len, Ordering::Relaxed);
            return Err(c);
        }
        if self.buckets.try_with(|b| file(b, c)).is_none() {
            let flags = if c.locked { LOCKED } else { 0 } | if c.fresh { FRESH } else { 0 };
            // SAFETY: the chunk (pages, page-aligned) is the pool's now and used by nobody; its
            // length is a multiple of the page size, so bits 0 and 1 are free for the flags.
            unsafe { self.deferred.push(c.start, c.len | flags) };
        }
        Ok(())
    }

    /// Takes the pool's lock before `fork`.
    pub(crate) fn lock(&self) {
        self.buckets.lock();
    }

    /// Releases it after `fork`.
    ///
    /// # Safety
    /// Only after [`lock`](Self::lock).
    pub(crate) unsafe fn unlock(&self) {
        // SAFETY: forwarded contract.
        unsafe { self.buckets.unlock() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: usize = 1024;

    fn chunk(start: usize, len: usize, fresh: bool) -> Chunk {
        Chunk {
            start,
            len,
            locked: false,
            fresh,
        }
    }

    fn take(b: &mut Buckets, len: usize) -> Option<usize> {
        take_from(b, len).map(|c| c.start)
    }

    #[test]
    fn a_request_gets_the_chunk_freed_last_before_any_fresh_one() {
        let mut b: Buckets = [const { VecDeque::new() }; TABLE_SIZE + 1];
        // Freed 1 and 2, then the thread refills with 3 and 4, then 5 is freed.
        file(&mut b, chunk(1, 204 * K, false));
        file(&mut b, chunk(2, 204 * K, false));
        file(&mut b, chunk(3, 204 * K, true));
        file(&mut b, chunk(4, 204 * K, true));
        file(&mut b, chunk(5, 204 * K, false));
        // The freed ones, last freed first, then the fresh ones, first pre-faulted first.
        let order: Vec<_> = (0..5).filter_map(|_| take(&mut b, 200 * K)).collect();
        assert_eq!(order, [5, 2, 1, 3, 4]);
        assert_eq!(take(&mut b, 200 * K), None);
    }

    #[test]
    fn a_take_that_skips_chunks_too_small_keeps_the_order_of_the_rest() {
        let mut b: Buckets = [const { VecDeque::new() }; TABLE_SIZE + 1];
        file(&mut b, chunk(1, 204 * K, true));
        file(&mut b, chunk(2, 204 * K, false));
        file(&mut b, chunk(3, 240 * K, false));
        file(&mut b, chunk(4, 204 * K, false));
        // 4 is too small for 220 KiB: 3 is taken, and 4 stays the next taken after it.
        assert_eq!(take(&mut b, 220 * K), Some(3));
        assert_eq!(take(&mut b, 200 * K), Some(4));
        assert_eq!(take(&mut b, 200 * K), Some(2));
        assert_eq!(take(&mut b, 200 * K), Some(1));
    }

    #[test]
    fn the_pool_hands_out_freed_chunks_before_the_threads_fresh_ones() {
        let pool = Pool::new();
        let page = 4096;
        // Uncontended, `put` files each chunk at once (the chunks' memory is never touched).
        for (start, fresh) in [(page, false), (2 * page, true), (3 * page, false)] {
            assert!(pool.put(chunk(start, 204 * K, fresh), usize::MAX).is_ok());
        }
        let mut order = vec![];
        while let Ok(Some(c)) = pool.take(200 * K) {
            order.push((c.start / page, c.fresh));
        }
        assert_eq!(order, [(3, false), (1, false), (2, true)]);
        assert_eq!(pool.pooled(), 0);
    }

    #[test]
    fn a_request_too_large_for_its_bucket_takes_from_the_next() {
        let mut b: Buckets = [const { VecDeque::new() }; TABLE_SIZE + 1];
        file(&mut b, chunk(1, 200 * K, false));
        file(&mut b, chunk(2, 300 * K, true));
        assert_eq!(take(&mut b, 240 * K), Some(2));
        assert_eq!(take(&mut b, 240 * K), None);
    }
}
