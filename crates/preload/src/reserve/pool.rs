//! The reserve's pool for large requests: Hermes's segregated pool of pre-faulted chunks
//! (Algorithm 2).
//!
//! Bucket `b` holds chunks of `[b, b+1)` times 128 KiB, the last bucket every chunk from 1 MiB
//! up. A request takes a chunk of its own bucket that fits, else one of the next buckets up
//! (every chunk there is larger). A freed chunk goes back to its bucket while the pool stays
//! within its bound (a latency-critical service repeats its sizes, so chunks refit); beyond the
//! bound it is released.

use std::sync::atomic::{AtomicUsize, Ordering};

use gleaner_policy::hermes::{bucket, TABLE_SIZE};

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
    pooled: AtomicUsize,
}

impl Pool {
    pub(crate) const fn new() -> Pool {
        Pool {
            buckets: SpinLock::new([const { Vec::new() }; TABLE_SIZE + 1]),
            pooled: AtomicUsize::new(0),
        }
    }

    /// Bytes of chunks in the pool.
    pub(crate) fn pooled(&self) -> usize {
        self.pooled.load(Ordering::Relaxed)
    }

    /// A chunk of at least `len` bytes: the smallest bucket that can hold one first.
    pub(crate) fn take(&self, len: usize) -> Option<Chunk> {
        let c = self.buckets.with(|b| {
            for chunks in b.iter_mut().skip(bucket(len)) {
                if let Some(i) = chunks.iter().rposition(|c| c.len >= len) {
                    return Some(chunks.swap_remove(i));
                }
            }
            None
        })?;
        self.pooled.fetch_sub(c.len, Ordering::Relaxed);
        Some(c)
    }

    /// Puts `c` in the pool if the pool stays within `bound` bytes; gives it back otherwise.
    pub(crate) fn put(&self, c: Chunk, bound: usize) -> Result<(), Chunk> {
        if self.pooled.fetch_add(c.len, Ordering::Relaxed) + c.len > bound {
            self.pooled.fetch_sub(c.len, Ordering::Relaxed);
            return Err(c);
        }
        self.buckets.with(|b| b[bucket(c.len)].push(c));
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
