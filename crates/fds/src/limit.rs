//! Room above the program's descriptor limit for gleaner's own descriptors.
//!
//! The kernel hands out the lowest free number below the soft `RLIMIT_NOFILE`, and a descriptor
//! keeps working when the limit is later below its number. A program started with a low limit
//! (a shell's `ulimit -n 64`, or CPython's `test_close_fds_when_max_fd_is_lowered`, which execs
//! a new interpreter under a limit of 29 with most numbers below it taken) would otherwise see
//! the pager's descriptors take its last numbers: it then failed to open its own files ("Too
//! many open files") before `main`. So while gleaner makes a descriptor, [`headroom`] raises the
//! soft limit (and, for a process allowed to, the hard one) far enough for [`crate::adopt`] to
//! move it to [`crate::PREFERRED_FLOOR`] or above, and puts the limit back when the last
//! holder is done. The pager starts inside such a window, before the program runs; mid-run a
//! window lasts the few microseconds of making one descriptor (a thread's first evictor, a
//! grant, a reconnection). The program's own `open` during one still finds its numbers, and at
//! its limit it even gets one more rather than `EMFILE`; a `getrlimit` in another thread at
//! that instant sees the raised value (as would a program another thread `exec`s then), and a
//! `setrlimit` there is kept (the limit is put back only if it is still the raised one).
//!
//! Where the limit cannot be raised (a hard limit below the floor and no privilege to raise
//! it), [`confined`] says so, and descriptors go to the upper half of the program's range, as
//! they did before this module.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};

use crate::PREFERRED_FLOOR;

/// How far above the floor the raised limit reaches: room for every descriptor a pager holds
/// (a few dozen) many times over.
const ROOM: u64 = 1024;

/// The pid of the process one of whose threads is changing the limit (0: nobody). As with
/// `with_room`'s turn, a fork child takes over a holder that is not itself.
static LOCK: AtomicI32 = AtomicI32::new(0);
/// Holders of the raised limit in the process [`DEPTH_PID`].
static DEPTH: AtomicUsize = AtomicUsize::new(0);
/// The process whose holders [`DEPTH`] counts: a fork child inherits its parent's count, and
/// the raise with it, but none of the threads that would drop it.
static DEPTH_PID: AtomicI32 = AtomicI32::new(0);
/// The limit before it was raised, and the limit it was raised to (0 in `RAISED_SOFT`: not
/// raised, it was high enough).
static SAVED_SOFT: AtomicU64 = AtomicU64::new(0);
static SAVED_HARD: AtomicU64 = AtomicU64::new(0);
static RAISED_SOFT: AtomicU64 = AtomicU64::new(0);
static RAISED_HARD: AtomicU64 = AtomicU64::new(0);
/// Set once a raise was refused: the floor then stays within the program's limit.
static CONFINED: AtomicBool = AtomicBool::new(false);

fn pid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

fn get() -> Option<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the live local.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0)
        .then_some((lim.rlim_cur, lim.rlim_max))
}

fn set(soft: u64, hard: u64) -> bool {
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: setrlimit reads one rlimit from the live local.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 }
}

struct Locked;

impl Locked {
    fn take() -> Locked {
        let me = pid();
        loop {
            match LOCK.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Locked,
                Err(holder)
                    if holder != me
                        && LOCK
                            .compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed)
                            .is_ok() =>
                {
                    return Locked;
                }
                Err(_) => std::thread::yield_now(),
            }
        }
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        LOCK.store(0, Ordering::Release);
    }
}

/// Whether descriptors can sit at the preferred floor under this process's limits: the soft
/// limit already leaves room there, or it could be raised (see the module documentation).
/// Probed once, by raising and putting back.
pub(crate) fn floor_reachable() -> bool {
    let Some((soft, hard)) = get() else {
        return false;
    };
    let needed = PREFERRED_FLOOR as u64 + ROOM;
    if soft >= needed || hard >= needed {
        return true;
    }
    // A hard limit below it: raising that needs privilege. Try, and put it back at once.
    let _lock = Locked::take();
    if set(soft, needed) {
        set(soft, hard);
        return true;
    }
    CONFINED.store(true, Ordering::Relaxed);
    false
}

/// Whether this process's descriptor limit left no room above it for gleaner's descriptors
/// (see the module documentation): they then take numbers from the upper half of the
/// program's range.
pub fn confined() -> bool {
    crate::floor();
    CONFINED.load(Ordering::Relaxed)
}

/// The soft descriptor limit raised above [`crate::floor`] until this is dropped (see the
/// module documentation); nothing where it already is, or where it cannot be.
#[must_use = "the limit is put back when the headroom is dropped"]
pub struct Headroom(());

/// In a fork child, the parent's holders are not this process's: a limit raised for them at
/// the fork is put back (a program that execs next must not inherit it) and the count starts
/// over. Call with the lock held.
fn settle_inherited() {
    let me = pid();
    if DEPTH_PID.swap(me, Ordering::Relaxed) == me {
        return;
    }
    DEPTH.store(0, Ordering::Relaxed);
    put_back();
}

/// Puts the limit back if it was raised and is still the raised one. Call with the lock held.
fn put_back() {
    let raised = RAISED_SOFT.swap(0, Ordering::Relaxed);
    // Only what is still ours: a program thread that set a limit meanwhile keeps its own.
    if raised != 0 && get() == Some((raised, RAISED_HARD.load(Ordering::Relaxed))) {
        set(
            SAVED_SOFT.load(Ordering::Relaxed),
            SAVED_HARD.load(Ordering::Relaxed),
        );
    }
}

/// For a fork child's first moments (the preload library's fork handler): a limit its parent
/// had raised at the fork goes back to the program's.
pub fn after_fork_in_child() {
    let _lock = Locked::take();
    settle_inherited();
}

/// Raises the limit for gleaner's descriptors (see [`Headroom`]). Holders nest and may be on
/// several threads; the last one to drop puts the limit back.
pub fn headroom() -> Headroom {
    let floor = crate::floor() as u64;
    let _lock = Locked::take();
    settle_inherited();
    if DEPTH.fetch_add(1, Ordering::Relaxed) == 0 {
        RAISED_SOFT.store(0, Ordering::Relaxed);
        if let Some((soft, hard)) = get() {
            let needed = floor + ROOM;
            if soft < needed {
                let new_hard = hard.max(needed);
                if set(needed, new_hard) {
                    SAVED_SOFT.store(soft, Ordering::Relaxed);
                    SAVED_HARD.store(hard, Ordering::Relaxed);
                    RAISED_SOFT.store(needed, Ordering::Relaxed);
                    RAISED_HARD.store(new_hard, Ordering::Relaxed);
                }
            }
        }
    }
    Headroom(())
}

impl Drop for Headroom {
    fn drop(&mut self) {
        let _lock = Locked::take();
        settle_inherited();
        // A fork child's count started over (`settle_inherited`): a holder from before the
        // fork finds nothing to drop.
        let dropped =
            DEPTH.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |d| d.checked_sub(1));
        if dropped == Ok(1) {
            put_back();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    /// Runs `f` in a fork child (the descriptor limit is the process's) and returns its exit
    /// status: 0 means every check in `f` passed.
    fn in_child(f: impl FnOnce() -> bool) -> i32 {
        // SAFETY: fork in a test binary; the child only runs `f` (system calls and atomics,
        // no locks another thread could hold) and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // The child computes its floor afresh, under the limits it sets.
            crate::FLOOR.store(0, Ordering::Relaxed);
            CONFINED.store(false, Ordering::Relaxed);
            let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(false);
            // SAFETY: leaving the child without running the parent's exit handlers.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut st = 0;
        // SAFETY: waiting for the child just made.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        assert!(libc::WIFEXITED(st), "child status {st}");
        libc::WEXITSTATUS(st)
    }

    #[test]
    fn a_descriptor_made_at_a_low_limit_lands_above_it_and_the_limit_comes_back() {
        let status = in_child(|| {
            // The program's limit: 29, with every number below it taken (the hard limit as
            // it is: raising it needs a privilege root may not have in a container).
            let Some((_, hard)) = get() else { return false };
            if hard < 4096 || !set(29, hard) {
                return false;
            }
            // SAFETY: opening /dev/null until the limit refuses; the descriptors stay open.
            while unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY) } >= 0 {}
            let fd = {
                let _room = headroom();
                // SAFETY: eventfd returns a new descriptor or -1.
                let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
                if fd < 0 {
                    return false;
                }
                // SAFETY: just made, owned by nothing else.
                crate::adopt(unsafe { OwnedFd::from_raw_fd(fd) })
            };
            let back = get() == Some((29, hard));
            // The program's numbers are all still its own: none was freed or taken.
            // SAFETY: F_GETFD reads flags of a number; no memory is touched.
            let ours_low = (3..29).all(|n| unsafe { libc::fcntl(n, libc::F_GETFD) } >= 0);
            fd.as_raw_fd() >= PREFERRED_FLOOR && back && ours_low && !confined()
        });
        assert_eq!(status, 0);
    }

    #[test]
    fn a_limit_the_program_sets_meanwhile_is_kept() {
        let status = in_child(|| {
            let Some((_, hard)) = get() else { return false };
            if hard < 4096 || !set(29, hard) {
                return false;
            }
            let room = headroom();
            let raised = get().map(|(soft, _)| soft).unwrap_or(0);
            let nested = headroom();
            drop(nested);
            let still = get().map(|(soft, _)| soft) == Some(raised);
            // The program changes its limit while gleaner holds the headroom.
            set(40, hard);
            drop(room);
            raised > PREFERRED_FLOOR as u64 && still && get() == Some((40, hard))
        });
        assert_eq!(status, 0);
    }

    #[test]
    fn a_fork_child_does_not_keep_the_limit_raised_for_its_parent() {
        let status = in_child(|| {
            let Some((_, hard)) = get() else { return false };
            if hard < 4096 || !set(29, hard) {
                return false;
            }
            let _room = headroom();
            let raised = get();
            // The parent holds the headroom across a fork; its child puts its limit back.
            let grandchild_ok = in_child(|| {
                after_fork_in_child();
                get() == Some((29, hard))
            }) == 0;
            grandchild_ok && get() == raised
        });
        assert_eq!(status, 0);
    }

    #[test]
    fn a_hard_limit_that_cannot_be_raised_confines_the_floor_to_the_programs_range() {
        let status = in_child(|| {
            if !set(64, 64) {
                return false;
            }
            // Root could raise its hard limit: the child becomes `nobody` (65534) first.
            // SAFETY: setuid changes this process's ids only.
            if unsafe { libc::geteuid() } == 0 && unsafe { libc::setuid(65534) } != 0 {
                return false;
            }
            let floor = crate::floor();
            confined() && floor == 32 && {
                let _room = headroom();
                get() == Some((64, 64))
            }
        });
        assert_eq!(status, 0);
    }
}
