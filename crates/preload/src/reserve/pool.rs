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

use std::sync::atomic::{AtomicUsize, Ordering};

use gleaner_policy::hermes::{bucket, TABLE_SIZE};

use super::deferred::Deferred;
use crate::lock::SpinLock;

/// A chunk: where it starts, its length, and whether it is `mlock`ed.
#[derive(Clone, Copy)]
pub(crate) struct Chunk {
    pub(crate) start: usize,
    pub(crate) len: usize,
    pub(crate) locked: bool,
}

/// The pool's buckets and the bytes they hold.
pub(crate) struct Pool {
    buckets: SpinLock<[Vec<Chunk>; TABLE_SIZE + 1]>,
    /// Bytes of chunks in the pool, those on `deferred` included.
    pooled: AtomicUsize,
    /// Chunks put while the lock was held, not yet in their buckets (`len | locked`).
    deferred: Deferred,
}

type Buckets = [Vec<Chunk>; TABLE_SIZE + 1];

/// Files the chunks on `deferred` into their buckets (the lock is held).
fn take_in(deferred: &Deferred, b: &mut Buckets) {
    for (start, tagged) in deferred.take_all() {
        let c = Chunk {
            start,
            len: tagged & !1,
            locked: tagged & 1 == 1,
        };
        b[bucket(c.len)].push(c);
    }
}

impl Pool {
    pub(crate) const fn new() -> Pool {
        Pool {
            buckets: SpinLock::new([const { Vec::new() }; TABLE_SIZE + 1]),
            pooled: AtomicUsize::new(0),
            deferred: Deferred::new(),
        }
    }

    /// Bytes of chunks in the pool.
    pub(crate) fn pooled(&self) -> usize {
        self.pooled.load(Ordering::Relaxed)
    }

    /// A chunk of at least `len` bytes: the smallest bucket that can hold one first. `Err(())`
    /// when the lock stayed held through a brief spin (the request goes elsewhere).
    #[allow(clippy::result_unit_err)]
    pub(crate) fn take(&self, len: usize) -> Result<Option<Chunk>, ()> {
        let c = self
            .buckets
            .try_with(|b| {
                take_in(&self.deferred, b);
                for chunks in b.iter_mut().skip(bucket(len)) {
                    if let Some(i) = chunks.iter().rposition(|c| c.len >= len) {
                        return Some(chunks.swap_remove(i));
                    }
                }
                None
            })
            .ok_or(())?;
        if let Some(c) = c {
            self.pooled.fetch_sub(c.len, Ordering::Relaxed);
        }
        Ok(c)
    }

    /// Puts `c` in the pool if the pool stays within `bound` bytes; gives it back otherwise. A
    /// chunk put while the lock is held waits on the deferred list for the next holder.
    pub(crate) fn put(&self, c: Chunk, bound: usize) -> Result<(), Chunk> {
        if self.pooled.fetch_add(c.len, Ordering::Relaxed) + c.len > bound {
            self.pooled.fetch_sub(c.len, Ordering::Relaxed);
            return Err(c);
        }
        if self
            .buckets
            .try_with(|b| b[bucket(c.len)].push(c))
            .is_none()
        {
            // SAFETY: the chunk (pages, page-aligned) is the pool's now and used by nobody; its
            // length is a multiple of the page size, so bit 0 is free for the lock flag.
            unsafe { self.deferred.push(c.start, c.len | c.locked as usize) };
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
