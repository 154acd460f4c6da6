//! The chunk the management thread is faulting in, published so that a large request that finds
//! the pool empty can take it as it is rather than a fresh range of the window.
//!
//! Where the thread cannot fault pages in faster than the program asks for them (on this VM a
//! page costs the thread about as much as the program's own first touch, 1.5-2 us), the pool
//! runs dry and every request past it would fault a whole chunk itself (a miss, as slow as the
//! C library). Taking the chunk being formed, the request faults only the pages the thread has
//! not reached yet: the shortfall is shared out over the requests instead of falling whole on
//! some of them.
//!
//! One word holds the chunk's start (0: none); its length is stored before the start is
//! published. The thread and a request race for the word with a compare-and-swap: whichever
//! clears it first owns the chunk. The thread faults the chunk in pieces and checks the word
//! between them; a piece it has begun when a request takes the chunk only faults in pages that
//! read as zeros (`MADV_POPULATE_WRITE` never changes a page that is present), so the request's
//! data is safe. If the request frees the chunk and the pool, at its bound, gives it back before
//! that piece ends, up to one piece of the freed range stays resident until the window reuses it.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The forming chunk's start (0: none) and length.
pub(crate) struct Forming {
    start: AtomicUsize,
    len: AtomicUsize,
}

impl Forming {
    pub(crate) const fn new() -> Forming {
        Forming {
            start: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
        }
    }

    /// The thread: `[start, start+len)` is being faulted in from now on.
    pub(crate) fn publish(&self, start: usize, len: usize) {
        self.len.store(len, Ordering::Relaxed);
        self.start.store(start, Ordering::Release);
    }

    /// The thread: whether the chunk at `start` is still its own.
    pub(crate) fn is(&self, start: usize) -> bool {
        self.start.load(Ordering::Acquire) == start
    }

    /// The thread: takes the chunk at `start` back; false if a request took it first.
    pub(crate) fn withdraw(&self, start: usize) -> bool {
        self.start
            .compare_exchange(start, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// A request: the forming chunk, `(start, len)`, if there is one that looked at least `len`
    /// bytes long. The length returned is read after the chunk was won (the one published with
    /// it): the caller checks it again, in case the thread withdrew that chunk and published
    /// another at the same address in between.
    pub(crate) fn take(&self, len: usize) -> Option<(usize, usize)> {
        let start = self.start.load(Ordering::Acquire);
        if start == 0 || self.len.load(Ordering::Relaxed) < len {
            return None;
        }
        self.start
            .compare_exchange(start, 0, Ordering::AcqRel, Ordering::Relaxed)
            .ok()
            .map(|s| (s, self.len.load(Ordering::Relaxed)))
    }
}
