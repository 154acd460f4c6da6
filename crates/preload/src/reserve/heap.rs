//! The reserve's heap for small requests (under [`LARGE`](gleaner_policy::hermes::LARGE)):
//! Hermes's gradual heap reservation (Algorithm 1).
//!
//! A TLSF allocator over steps of the window that the management thread has pre-faulted. The
//! thread grows the heap one step at a time: it faults a step in *outside* the heap's lock and
//! then adds it in O(1) (appended to the pool it extends where the step follows it), so a
//! request never waits for a mapping to be built. A request the heap cannot serve is a miss: it
//! goes to the default allocator rather than wait, and so does one that finds the heap's lock
//! held past a brief spin; a `free` that finds it held leaves its block on a lock-free list that
//! the lock's next holder takes in (`deferred.rs`: no request waits out a preempted holder).

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::deferred::Deferred;
use crate::lock::SpinLock;

type Tlsf = rlsf::Tlsf<'static, u32, u32, 24, 32>;

/// The heap: the allocator, the end of its last step (to append the next one to), and the
/// bytes ready in it.
pub(crate) struct SmallHeap {
    tlsf: SpinLock<(Tlsf, usize)>,
    /// Bytes the heap holds that are not handed out (steps added, blocks freed, less blocks
    /// taken; blocks on `deferred` count once taken in).
    free: AtomicUsize,
    /// Blocks freed while the lock was held, `(start, total)`, not yet given back to the TLSF.
    deferred: Deferred,
}

/// What [`SmallHeap::take`] found.
pub(crate) enum Taken {
    /// A block at this address.
    Block(usize),
    /// No block of that size: the heap is short (or fragmented).
    Empty,
    /// The heap's lock stayed held through a brief spin: the request goes elsewhere.
    Busy,
}

impl SmallHeap {
    pub(crate) const fn new() -> SmallHeap {
        SmallHeap {
            tlsf: SpinLock::new((Tlsf::new(), 0)),
            free: AtomicUsize::new(0),
            deferred: Deferred::new(),
        }
    }

    /// Bytes ready in the heap.
    pub(crate) fn free_bytes(&self) -> usize {
        self.free.load(Ordering::Relaxed)
    }

    /// A block of `total` bytes (16-byte aligned), if the heap has one and its lock is free.
    pub(crate) fn take(&self, total: usize) -> Taken {
        let Ok(layout) = Layout::from_size_align(total, 16) else {
            return Taken::Empty;
        };
        let Some(p) = self.tlsf.try_with(|(t, _)| {
            self.take_in_deferred(t);
            t.allocate(layout)
        }) else {
            return Taken::Busy;
        };
        let Some(p) = p else {
            return Taken::Empty;
        };
        self.free
            .fetch_sub(total.min(self.free_bytes()), Ordering::Relaxed);
        Taken::Block(p.as_ptr() as usize)
    }

    /// Returns a block [`take`](Self::take) gave out: to the TLSF if its lock is free, else to
    /// the deferred list (the lock's next holder takes it in).
    ///
    /// # Safety
    /// `start` came from `take(total)` and is not used any more.
    pub(crate) unsafe fn give(&self, start: usize, total: usize) {
        let given = self.tlsf.try_with(|(t, _)| {
            // SAFETY: the caller's contract; allocated with alignment 16.
            unsafe { t.deallocate(NonNull::new_unchecked(start as *mut u8), 16) }
        });
        if given.is_some() {
            self.free.fetch_add(total, Ordering::Relaxed);
        } else {
            // SAFETY: the caller's contract: the block (at least the 16-byte header, 16-byte
            // aligned) is unused; it stays the list's until taken in.
            unsafe { self.deferred.push(start, total) };
        }
    }

    /// Gives the blocks freed while the lock was held back to the TLSF (the lock is held).
    fn take_in_deferred(&self, t: &mut Tlsf) {
        for (start, total) in self.deferred.take_all() {
            // SAFETY: a block `take` gave out and `give` deferred: unused, allocated with
            // alignment 16.
            unsafe { t.deallocate(NonNull::new_unchecked(start as *mut u8), 16) };
            self.free.fetch_add(total, Ordering::Relaxed);
        }
    }

    /// The thread: takes in the blocks freed while the lock was held, so that the heap's ready
    /// bytes (which its refill plan reads) count them.
    pub(crate) fn settle(&self) {
        if !self.deferred.is_empty() {
            self.tlsf.with(|(t, _)| self.take_in_deferred(t));
        }
    }

    /// Adds the pre-faulted step `[start, start+len)` to the heap.
    ///
    /// # Safety
    /// The range is the window's, pre-faulted, and referenced by nothing else.
    pub(crate) unsafe fn grow(&self, start: usize, len: usize) {
        let added = self.tlsf.with(|(t, end)| {
            self.take_in_deferred(t);
            let slice = std::ptr::slice_from_raw_parts_mut(start as *mut u8, len);
            let block = NonNull::new(slice).expect("the window is never at address 0");
            let n = if *end == start {
                // SAFETY: the caller hands over the step; appending needs it to follow the last
                // pool exactly, which `end` records.
                unsafe { t.append_free_block_ptr(block) }
            } else {
                0
            };
            let n = if n == 0 {
                // SAFETY: as above, a new pool.
                unsafe { t.insert_free_block_ptr(block) }.map_or(0, |n| n.get())
            } else {
                n
            };
            *end = start + len;
            n
        });
        self.free.fetch_add(added, Ordering::Relaxed);
    }

    /// Takes the heap's lock before `fork`.
    pub(crate) fn lock(&self) {
        self.tlsf.lock();
    }

    /// Releases it after `fork`.
    ///
    /// # Safety
    /// Only after [`lock`](Self::lock).
    pub(crate) unsafe fn unlock(&self) {
        // SAFETY: forwarded contract.
        unsafe { self.tlsf.unlock() }
    }
}
