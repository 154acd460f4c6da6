//! How the management thread sleeps and is woken: a futex word, so that the thread sleeps while
//! the reserve is stocked and an allocating thread that takes it under its low watermark wakes
//! it, with one system call per sleep at most (the first waker clears the word; every later
//! one sees it clear and returns after one load).
//!
//! The thread publishes "asleep" before it re-checks the reserve and waits on the word; a waker
//! clears the word before it calls `FUTEX_WAKE`. Either the thread's re-check sees the need, or
//! the waker sees "asleep" and the kernel's wait, which compares the word first, returns at once:
//! no wake-up is lost.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

const AWAKE: u32 = 0;
const ASLEEP: u32 = 1;

/// The management thread's sleep word.
pub(crate) struct Waker {
    state: AtomicU32,
    /// When the last wake-up's system call was made (the caller's clock, 0: none since the
    /// thread last looked): the thread's scheduling delay is measured from it.
    woken_at: AtomicU64,
}

impl Waker {
    pub(crate) const fn new() -> Waker {
        Waker {
            state: AtomicU32::new(AWAKE),
            woken_at: AtomicU64::new(0),
        }
    }

    /// Wakes the thread if it sleeps; returns whether this call woke it (made the system call).
    /// An allocating thread's cost when the thread is awake already: one load. `now` (a
    /// monotonic clock in nanoseconds, never 0) is read only when the system call is made,
    /// before it, and kept for [`take_woken_at`](Self::take_woken_at).
    pub(crate) fn wake(&self, now: impl FnOnce() -> u64) -> bool {
        // Orders the caller's taking from the reserve before the load of the word (the thread
        // stores the word, then reads the reserve): a store-load pair on each side.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.state.load(Ordering::Relaxed) != ASLEEP
            || self.state.swap(AWAKE, Ordering::AcqRel) != ASLEEP
        {
            return false;
        }
        self.woken_at.store(now(), Ordering::Relaxed);
        // SAFETY: FUTEX_WAKE on a live, aligned u32 that outlives the call; no memory is
        // written by the kernel.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.state.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                1,
            )
        };
        true
    }

    /// When a request last woke the thread (the clock given to [`wake`](Self::wake)), if one did
    /// since the last call.
    pub(crate) fn take_woken_at(&self) -> Option<u64> {
        Some(self.woken_at.swap(0, Ordering::Relaxed)).filter(|&t| t != 0)
    }

    /// Sleeps up to `timeout` unless `needed()` says there is work already (checked after the
    /// thread announced its sleep, so a waker cannot slip between). Returns whether a program
    /// thread woke it (or there was work before it slept), false when the timeout passed.
    pub(crate) fn sleep(&self, timeout: Duration, needed: impl Fn() -> bool) -> bool {
        self.state.store(ASLEEP, Ordering::SeqCst);
        if needed() {
            self.state.store(AWAKE, Ordering::Relaxed);
            return true;
        }
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: FUTEX_WAIT on a live, aligned u32 with a relative timeout in a live local; it
        // returns at once if the word is no longer ASLEEP (a waker came first).
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.state.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                ASLEEP,
                &ts as *const libc::timespec,
            )
        };
        // A waker cleared the word (woken, or it came before the wait); else the timeout (or a
        // signal) ended the sleep.
        self.state.swap(AWAKE, Ordering::AcqRel) == AWAKE
    }
}
