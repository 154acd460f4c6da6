//! Stopping the program when its data can no longer be served.
//!
//! A fault on a page whose only copy is unreachable cannot be answered with anything but the data:
//! handing the thread a zero page would silently corrupt the program. So the process stops with a
//! message saying what was lost and [`FATAL_EXIT_CODE`].

use std::io::Write;
use std::sync::OnceLock;

/// Called with the message before a fatal stop ([`on_fatal`]).
static ON_FATAL: OnceLock<fn(&str)> = OnceLock::new();

/// Has `hook` called with the message when far memory fails and the process is about to stop
/// (the preload library reports it to `gleaner run`, which counts the processes so stopped).
/// The first hook set stays. It runs on the thread that found the failure, which may be any of
/// the pager's threads, and must not touch managed memory.
pub fn on_fatal(hook: fn(&str)) {
    let _ = ON_FATAL.set(hook);
}

/// The exit status of a process stopped because far memory failed (memnode lost, memnode full
/// beyond what can be kept locally, or a page missing on the memnode).
pub const FATAL_EXIT_CODE: i32 = 86;

/// Prints `message` to stderr and ends the process at once with [`FATAL_EXIT_CODE`].
///
/// `_exit` rather than `exit`: atexit handlers and destructors could touch far memory that no
/// thread will ever serve again, and would then hang instead of exiting.
pub(crate) fn fatal(message: &str) -> ! {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "gleaner: FATAL: {message}");
    let _ = writeln!(
        err,
        "gleaner: stopping the program (exit status {FATAL_EXIT_CODE}) rather than letting it \
         continue on zero-filled pages in place of its data"
    );
    let _ = err.flush();
    drop(err);
    if let Some(hook) = ON_FATAL.get() {
        hook(message);
    }
    exit_now(FATAL_EXIT_CODE)
}

/// Ends the process at once with `code`, running nothing: the `exit_group` system call that
/// `_exit` makes, called directly, so that no `_exit` an `LD_PRELOAD`'ed library puts in front
/// of the C library's runs (gleaner's own writes the process's stats there, which a process
/// whose far memory failed must not try).
pub fn exit_now(code: i32) -> ! {
    loop {
        // SAFETY: exit_group ends every thread of the process; it has no preconditions and
        // does not return.
        unsafe { libc::syscall(libc::SYS_exit_group, code) };
    }
}
