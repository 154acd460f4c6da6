//! A lock-free list of ranges handed back to the reserve, for the paths that must not wait on a
//! lock: a `free` that finds the heap's or the pool's lock held, and chunks freed past the pool's
//! bound (which the management thread releases, off the request path).
//!
//! The reserve's locks are spin locks, and the management thread takes them too. The thread runs
//! at `SCHED_BATCH` beside a busy program; preempted inside a critical section (or stalled by the
//! kernel there), it would leave a request spinning and yielding until the scheduler gave it its
//! CPU back: milliseconds on a shared machine (lock-holder preemption). So requests never wait for
//! a lock: an allocation that finds one held falls back to the default allocator, and a `free`
//! pushes its range here, where the next holder of the lock (or the thread) takes it in.
//!
//! The list is intrusive: each range's first 16 bytes (its own memory, the reserve's until the
//! range is taken from the list) hold the next range's start and the range's length. Pushing is
//! a compare-and-swap of the head; taking swaps the whole list out at once, so no node is ever
//! popped while another thread reads it (no ABA problem), and any number of threads may push and
//! take.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The list's head: the first range's start (0: empty).
pub(crate) struct Deferred {
    head: AtomicUsize,
}

impl Deferred {
    pub(crate) const fn new() -> Deferred {
        Deferred {
            head: AtomicUsize::new(0),
        }
    }

    /// Whether the list is empty (a hint: a push may follow at once).
    pub(crate) fn is_empty(&self) -> bool {
        self.head.load(Ordering::Relaxed) == 0
    }

    /// Hands `[start, start+len)` to the list; `len` may carry flags in its low bits (it comes
    /// back as given).
    ///
    /// # Safety
    /// `start` is non-zero, 8-byte aligned, its first 16 bytes are writable, and nothing uses
    /// the range until it comes back from [`take_all`](Self::take_all).
    pub(crate) unsafe fn push(&self, start: usize, len: usize) {
        let node = start as *mut usize;
        // SAFETY: the caller's contract: the range's first 16 bytes are the list's now.
        unsafe { node.add(1).write(len) };
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            // SAFETY: as above.
            unsafe { node.write(head) };
            match self
                .head
                .compare_exchange_weak(head, start, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }

    /// Takes every range off the list: `(start, len)` each, the caller's from now on.
    pub(crate) fn take_all(&self) -> Drain {
        if self.is_empty() {
            return Drain { next: 0 };
        }
        Drain {
            next: self.head.swap(0, Ordering::Acquire),
        }
    }
}

/// The ranges taken off a [`Deferred`] list.
pub(crate) struct Drain {
    next: usize,
}

impl Iterator for Drain {
    type Item = (usize, usize);

    fn next(&mut self) -> Option<(usize, usize)> {
        if self.next == 0 {
            return None;
        }
        let start = self.next;
        let node = start as *const usize;
        // SAFETY: a range pushed with its link and length in its first 16 bytes (push's
        // contract), taken off the list whole by this drain alone (the swap in take_all, whose
        // Acquire pairs with the pushes' Release).
        let (next, len) = unsafe { (node.read(), node.add(1).read()) };
        self.next = next;
        Some((start, len))
    }
}

#[cfg(test)]
mod tests {
    use super::Deferred;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Four threads push 2,000 ranges each while another takes the list again and again: every
    /// range comes out exactly once, with its length.
    #[test]
    fn every_range_pushed_comes_out_once() {
        const PER: usize = 2000;
        let mut mem = vec![[0usize; 2]; 4 * PER];
        let base = mem.as_mut_ptr() as usize;
        let list = Deferred::new();
        let done = AtomicBool::new(false);
        let mut seen = vec![0u32; 4 * PER];
        std::thread::scope(|s| {
            let pushers: Vec<_> = (0..4)
                .map(|t| {
                    let list = &list;
                    s.spawn(move || {
                        for i in t * PER..(t + 1) * PER {
                            // SAFETY: element i of `mem`, 16 bytes, pushed once, read only
                            // through the list until the test ends.
                            unsafe { list.push(base + i * 16, i * 3 + 1) };
                        }
                    })
                })
                .collect();
            let drainer = s.spawn(|| {
                let mut got = Vec::new();
                loop {
                    let finished = done.load(Ordering::Acquire);
                    got.extend(list.take_all());
                    if finished {
                        return got;
                    }
                }
            });
            for p in pushers {
                p.join().unwrap();
            }
            done.store(true, Ordering::Release);
            for (start, len) in drainer.join().unwrap() {
                let i = (start - base) / 16;
                assert_eq!(len, i * 3 + 1, "range {i} came back with another length");
                seen[i] += 1;
            }
        });
        assert!(list.is_empty());
        let wrong: Vec<_> = seen.iter().enumerate().filter(|(_, &n)| n != 1).collect();
        assert!(wrong.is_empty(), "ranges not seen exactly once: {wrong:?}");
        drop(mem);
    }
}
