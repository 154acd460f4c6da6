//! A tiny lock with explicit `lock`/`unlock`, so `fork` can take it in its prepare hook and release
//! it on both sides afterwards (a std `Mutex` cannot be released from another function). It spins
//! briefly, then yields: critical sections are short (allocator bookkeeping).
//!
//! [`SpinLock::try_with`] gives up after the same brief spin instead of yielding: for a caller
//! with somewhere else to go (the latency-critical reserve's requests fall back to the default
//! allocator), so that it never waits out a holder that was preempted inside its critical section.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Tries at taking the lock before [`SpinLock::lock`] yields and [`SpinLock::try_with`] gives up.
const BRIEF_SPINS: u32 = 64;

/// A value guarded by a spin-then-yield lock.
pub(crate) struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: access to `value` is serialised by `locked`.
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    /// A new unlocked lock.
    pub(crate) const fn new(value: T) -> Self {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Acquires the lock (without a guard; pair with [`SpinLock::unlock`]): a brief spin, then a
    /// yield between brief spins.
    pub(crate) fn lock(&self) {
        while !self.acquire_briefly() {
            std::thread::yield_now();
        }
    }

    /// Takes the lock if it is free or comes free within [`BRIEF_SPINS`] tries; whether it did.
    fn acquire_briefly(&self) -> bool {
        for _ in 0..BRIEF_SPINS {
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return true;
            }
            std::hint::spin_loop();
        }
        false
    }

    /// Releases the lock.
    ///
    /// # Safety
    /// The caller holds the lock (or, in a fork child handler, the parent held it at fork).
    pub(crate) unsafe fn unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }

    /// Runs `f` with the lock held if the lock is free or comes free within a brief spin (64
    /// tries, well under a microsecond); None otherwise, and `f` is not run.
    pub(crate) fn try_with<R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        if !self.acquire_briefly() {
            return None;
        }
        // SAFETY: taken just now.
        Some(unsafe { self.run_then_unlock(f) })
    }

    /// Runs `f` with the lock held.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        self.lock();
        // SAFETY: taken just now.
        unsafe { self.run_then_unlock(f) }
    }

    /// Runs `f` on the value, then releases the lock.
    ///
    /// # Safety
    /// The caller holds the lock.
    unsafe fn run_then_unlock<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        // SAFETY: the caller holds the lock, so this is the only reference to the value.
        let r = f(unsafe { &mut *self.value.get() });
        // SAFETY: the caller holds it.
        unsafe { self.unlock() };
        r
    }
}

#[cfg(test)]
mod tests {
    use super::SpinLock;

    #[test]
    fn try_with_gives_up_while_the_lock_is_held() {
        let l = SpinLock::new(1);
        l.lock();
        assert_eq!(l.try_with(|v| *v), None, "ran with the lock held elsewhere");
        // SAFETY: taken above.
        unsafe { l.unlock() };
        assert_eq!(l.try_with(|v| std::mem::replace(v, 2)), Some(1));
        assert_eq!(l.with(|v| *v), 2);
    }
}
