//! The reserve's heap for small requests (under [`LARGE`](gleaner_policy::hermes::LARGE)):
//! Hermes's gradual heap reservation (Algorithm 1).
//!
//! A TLSF allocator over steps of the window that the management thread has pre-faulted. The
//! thread grows the heap one step at a time: it faults a step in *outside* the heap's lock and
//! then adds it in O(1) (appended to the pool it extends where the step follows it), so a
//! request never waits for a mapping to be built. A request the heap cannot serve is a miss: it
//! goes to the default allocator rather than wait.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::lock::SpinLock;

type Tlsf = rlsf::Tlsf<'static, u32, u32, 24, 32>;

/// The heap: the allocator, the end of its last step (to append the next one to), and the
/// bytes ready in it.
pub(crate) struct SmallHeap {
    tlsf: SpinLock<(Tlsf, usize)>,
    /// Bytes the heap holds that are not handed out (steps added, blocks freed, less blocks
    /// taken).
    free: AtomicUsize,
}

impl SmallHeap {
    pub(crate) const fn new() -> SmallHeap {
        SmallHeap {
            tlsf: SpinLock::new((Tlsf::new(), 0)),
            free: AtomicUsize::new(0),
        }
    }

    /// Bytes ready in the heap.
    pub(crate) fn free_bytes(&self) -> usize {
        self.free.load(Ordering::Relaxed)
    }

    /// A block of `total` bytes (16-byte aligned), if the heap has one.
    pub(crate) fn take(&self, total: usize) -> Option<usize> {
        let layout = Layout::from_size_align(total, 16).ok()?;
        let p = self.tlsf.with(|(t, _)| t.allocate(layout))?;
        self.free
            .fetch_sub(total.min(self.free_bytes()), Ordering::Relaxed);
        Some(p.as_ptr() as usize)
    }

    /// Returns a block [`take`](Self::take) gave out.
    ///
    /// # Safety
    /// `start` came from `take(total)` and is not used any more.
    pub(crate) unsafe fn give(&self, start: usize, total: usize) {
        self.tlsf.with(|(t, _)| {
            // SAFETY: the caller's contract; allocated with alignment 16.
            unsafe { t.deallocate(NonNull::new_unchecked(start as *mut u8), 16) }
        });
        self.free.fetch_add(total, Ordering::Relaxed);
    }

    /// Adds the pre-faulted step `[start, start+len)` to the heap.
    ///
    /// # Safety
    /// The range is the window's, pre-faulted, and referenced by nothing else.
    pub(crate) unsafe fn grow(&self, start: usize, len: usize) {
        let added = self.tlsf.with(|(t, end)| {
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
