//! The exported `close`, `close_range`, `closefrom`, `dup2` and `dup3`: the program's calls leave
//! the descriptors the pager holds alone (`gleaner_fds` says which, and why it matters: closing
//! the userfaultfd would let the kernel hand the program zeros for its evicted pages).
//!
//! * Closing a held descriptor fails with `EBADF`, what the program would get without gleaner
//!   (it never opened that number); a range closes everything in it but them.
//! * Making a held number a copy of another descriptor (`dup2`, `dup3`) fails with `EBUSY`, with
//!   a warning naming the number: the program asked for that exact number, and it is not free.
//!   The held ones sit at 1024 and above (`gleaner_fds::floor`), where programs seldom ask.
//! * gleaner's own code (the pager's threads, and its code on the program's threads) closes
//!   them as usual, forgetting each first.
//!
//! * The program's calls take turns with gleaner's code making a descriptor
//!   (`gleaner_fds::program_call`): until gleaner has moved a new descriptor out of the way, it
//!   may sit at a number the program just closed, and a `dup2` onto that number would replace it.
//!
//! The calls go to the kernel directly, as the mapping calls do (`real.rs`); so `close` here is
//! not a thread-cancellation point, where the C library's is. Raw `close_range` system calls
//! (not through the C library) are not seen.

// The exported functions replace C library calls: their contract is the C library's (its manual
// pages), the same for every caller, so no `# Safety` section is repeated on each.
#![allow(clippy::missing_safety_doc)]

use std::sync::atomic::{AtomicBool, Ordering};

/// `CLOSE_RANGE_UNSHARE` (`linux/close_range.h`).
const CLOSE_RANGE_UNSHARE: u32 = 1 << 1;
/// `CLOSE_RANGE_CLOEXEC` (`linux/close_range.h`).
const CLOSE_RANGE_CLOEXEC: u32 = 1 << 2;

/// Whether a refused close was already noted in the log.
static CLOSE_NOTED: AtomicBool = AtomicBool::new(false);
/// Whether a refused `dup2`/`dup3` was already reported.
static DUP_WARNED: AtomicBool = AtomicBool::new(false);

/// A system call's result as the C library returns it: -1 with `errno` set on failure.
fn libc_result(r: libc::c_long) -> i32 {
    r as i32
}

fn fail(errno: i32) -> i32 {
    crate::interpose::set_errno(errno);
    -1
}

fn raw_close(fd: i32) -> i32 {
    // SAFETY: close(2) takes a descriptor number by value; no memory is passed.
    libc_result(unsafe { libc::syscall(libc::SYS_close, fd) })
}

fn raw_close_range(first: u32, last: u32, flags: u32) -> i32 {
    // SAFETY: close_range(2) takes three integers by value; no memory is passed.
    libc_result(unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) })
}

fn note_refused_close(fd: i32) {
    if !CLOSE_NOTED.swap(true, Ordering::Relaxed) {
        let _in = crate::InPager::enter();
        log::debug!(
            "the program closed descriptor {fd}, which gleaner holds for its far memory: left \
             open (EBADF; said once)"
        );
    }
}

/// `close(2)`.
#[no_mangle]
pub unsafe extern "C" fn close(fd: i32) -> i32 {
    if crate::in_runtime() {
        gleaner_fds::forget(fd);
        return raw_close(fd);
    }
    let turn = gleaner_fds::program_call();
    if gleaner_fds::is_held(fd) {
        drop(turn); // Nothing of gleaner's is made while the program's turn is held.
        note_refused_close(fd);
        return fail(libc::EBADF);
    }
    raw_close(fd)
}

/// `close_range(2)`: closes (or marks close-on-exec) the range but the held descriptors in it.
#[no_mangle]
pub unsafe extern "C" fn close_range(first: u32, last: u32, flags: i32) -> i32 {
    let flags = flags as u32;
    let known = CLOSE_RANGE_UNSHARE | CLOSE_RANGE_CLOEXEC;
    // Close-on-exec changes nothing for the held ones (they are); bad arguments get the
    // kernel's own error, and nothing is closed.
    if flags & CLOSE_RANGE_CLOEXEC != 0 || flags & !known != 0 || first > last {
        return raw_close_range(first, last, flags);
    }
    if crate::in_runtime() {
        gleaner_fds::held_in(first, last, gleaner_fds::forget);
        return raw_close_range(first, last, flags);
    }
    let turn = gleaner_fds::program_call();
    if flags & CLOSE_RANGE_UNSHARE != 0 {
        // SAFETY: unshare(2) with CLONE_FILES gives this thread a copy of the descriptor table,
        // as the flag asks, before anything in it is closed.
        if unsafe { libc::unshare(libc::CLONE_FILES) } != 0 {
            return -1;
        }
    }
    let mut from = first;
    let mut result = 0;
    let mut refused = None;
    gleaner_fds::held_in(first, last, |held| {
        let held = held as u32;
        refused.get_or_insert(held as i32);
        if held > from && raw_close_range(from, held - 1, 0) != 0 {
            result = -1;
        }
        from = held + 1;
    });
    // What is left above the last held one.
    if from <= last && raw_close_range(from, last, 0) != 0 {
        result = -1;
    }
    drop(turn);
    if let Some(fd) = refused {
        note_refused_close(fd);
    }
    result
}

/// `closefrom(3)`: closes every descriptor from `lowfd` up but the held ones.
#[no_mangle]
pub unsafe extern "C" fn closefrom(lowfd: i32) {
    let first = lowfd.max(0) as u32;
    // SAFETY: forwarding to the interposed close_range above.
    if unsafe { close_range(first, u32::MAX, 0) } == 0 {
        return;
    }
    // A kernel without close_range (before 5.9): one at a time, up to the descriptor limit.
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the live local.
    let end = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur.min(1 << 20) as i32
    } else {
        1 << 16
    };
    for fd in lowfd.max(0)..end {
        // SAFETY: forwarding to the interposed close above.
        unsafe { close(fd) };
    }
}

fn refuse_dup(call: &str, newfd: i32) -> i32 {
    if !DUP_WARNED.swap(true, Ordering::Relaxed) {
        let _in = crate::InPager::enter();
        log::warn!(
            "the program asked {call} for descriptor {newfd}, which gleaner holds for its far \
             memory: refused with EBUSY (said once)"
        );
    }
    fail(libc::EBUSY)
}

/// `dup2(2)`.
#[no_mangle]
pub unsafe extern "C" fn dup2(oldfd: i32, newfd: i32) -> i32 {
    let turn = (!crate::in_runtime()).then(gleaner_fds::program_call);
    if oldfd != newfd && gleaner_fds::is_held(newfd) && turn.is_some() {
        drop(turn);
        return refuse_dup("dup2", newfd);
    }
    if oldfd == newfd {
        // dup2 of a descriptor onto itself only checks that it is open.
        // SAFETY: fcntl(2) F_GETFD takes the descriptor by value; no memory is passed.
        let open = unsafe { libc::syscall(libc::SYS_fcntl, oldfd, libc::F_GETFD) } >= 0;
        return if open { newfd } else { -1 };
    }
    // SAFETY: dup3(2) (dup2 without its equal-descriptor case) takes integers by value.
    libc_result(unsafe { libc::syscall(libc::SYS_dup3, oldfd, newfd, 0) })
}

/// `dup3(2)`.
#[no_mangle]
pub unsafe extern "C" fn dup3(oldfd: i32, newfd: i32, flags: i32) -> i32 {
    let turn = (!crate::in_runtime()).then(gleaner_fds::program_call);
    if oldfd != newfd && gleaner_fds::is_held(newfd) && turn.is_some() {
        drop(turn);
        return refuse_dup("dup3", newfd);
    }
    // SAFETY: dup3(2) takes integers by value; the kernel checks them.
    libc_result(unsafe { libc::syscall(libc::SYS_dup3, oldfd, newfd, flags) })
}
