//! The exported `fstat`, `fstatat`, `statx` and `fcntl` (and their 64-bit and versioned-stat
//! names): to the program, a descriptor gleaner holds looks like a number it never opened.
//!
//! The pager's descriptors are the program's to see in `/proc/self/fd`, but a program that
//! checks which numbers are open, one by one up to its limit, as a test of its own descriptor
//! handling does (CPython's `test_subprocess.test_pass_fds_redirected` runs a child with
//! `close_fds=True` that `fstat`s every number and expects only the ones passed), found
//! gleaner's and failed. `close` already answers `EBADF` for them (`descriptors.rs`); these
//! answer the same, as for a number the program never opened. gleaner's own code (on its
//! threads, or marked as in the runtime on the program's) sees them as they are.
//!
//! `fcntl` is variadic in C; it is defined here with its third argument as a machine word,
//! which is how every variadic call passes it on x86-64 and AArch64, and forwarded as such.

// The exported functions replace C library calls: their contract is the C library's (its manual
// pages), the same for every caller, so no `# Safety` section is repeated on each.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::AtomicUsize;

use crate::real::next;

/// Whether the program (not gleaner's code) asks about a descriptor gleaner holds.
fn hidden(fd: c_int) -> bool {
    gleaner_fds::is_held(fd) && !crate::in_runtime()
}

/// Whether a `*at` call names a file through `dirfd` (an empty path with `AT_EMPTY_PATH`, or a
/// relative one), where `dirfd` is hidden.
fn hidden_at(dirfd: c_int, path: *const c_char, flags: c_int) -> bool {
    if dirfd == libc::AT_FDCWD || !hidden(dirfd) {
        return false;
    }
    if path.is_null() {
        return true;
    }
    // SAFETY: the caller passes a NUL-terminated path; only its first byte is read.
    let first = unsafe { *path };
    (first == 0 && flags & libc::AT_EMPTY_PATH != 0) || (first != 0 && first != b'/' as c_char)
}

fn ebadf() -> c_int {
    crate::interpose::set_errno(libc::EBADF);
    -1
}

/// Defines an interposed function that answers `EBADF` when `$hide` holds, and otherwise calls
/// the C library's definition of `$name` with the same arguments.
macro_rules! hiding {
    ($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) hide if $hide:expr) => {
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            if $hide {
                return ebadf();
            }
            static SLOT: AtomicUsize = AtomicUsize::new(0);
            let real = next(&SLOT, concat!(stringify!($name), "\0").as_bytes());
            // SAFETY: the C library's function of this name has this type; the arguments are
            // the caller's.
            unsafe {
                std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) -> c_int>(real)(
                    $($arg),*
                )
            }
        }
    };
}

hiding! {
    /// `fstat(2)`.
    fn fstat(fd: c_int, buf: *mut c_void) hide if hidden(fd)
}
hiding! {
    /// `fstat64(2)`.
    fn fstat64(fd: c_int, buf: *mut c_void) hide if hidden(fd)
}
hiding! {
    /// `__fxstat`, what programs built against a C library before 2.33 call for `fstat`.
    fn __fxstat(ver: c_int, fd: c_int, buf: *mut c_void) hide if hidden(fd)
}
hiding! {
    /// `__fxstat64`, as `__fxstat`.
    fn __fxstat64(ver: c_int, fd: c_int, buf: *mut c_void) hide if hidden(fd)
}
hiding! {
    /// `fstatat(2)`.
    fn fstatat(dirfd: c_int, path: *const c_char, buf: *mut c_void, flags: c_int)
        hide if hidden_at(dirfd, path, flags)
}
hiding! {
    /// `fstatat64(2)`.
    fn fstatat64(dirfd: c_int, path: *const c_char, buf: *mut c_void, flags: c_int)
        hide if hidden_at(dirfd, path, flags)
}
hiding! {
    /// `__fxstatat`, what older programs call for `fstatat`.
    fn __fxstatat(ver: c_int, dirfd: c_int, path: *const c_char, buf: *mut c_void, flags: c_int)
        hide if hidden_at(dirfd, path, flags)
}
hiding! {
    /// `__fxstatat64`, as `__fxstatat`.
    fn __fxstatat64(ver: c_int, dirfd: c_int, path: *const c_char, buf: *mut c_void, flags: c_int)
        hide if hidden_at(dirfd, path, flags)
}
hiding! {
    /// `statx(2)`.
    fn statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: c_uint, buf: *mut c_void)
        hide if hidden_at(dirfd, path, flags)
}
hiding! {
    /// `fcntl(2)`.
    fn fcntl(fd: c_int, cmd: c_int, arg: usize) hide if hidden(fd)
}
hiding! {
    /// `fcntl64(2)`, the name programs built against a C library since 2.28 call.
    fn fcntl64(fd: c_int, cmd: c_int, arg: usize) hide if hidden(fd)
}
