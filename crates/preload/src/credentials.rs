//! The exported `setgroups` and `initgroups`: the group list they hand the kernel stays out of
//! managed memory.
//!
//! Credentials are per thread in Linux; the C library makes a change process-wide by having
//! every other thread repeat the system call (it signals each with `SIGSETXID`, which no thread
//! can block, and waits for all), with the caller's arguments. `setgroups` passes a pointer to
//! the list, so each pager thread's system call read the list from the program's memory, most
//! often its heap (Python's `subprocess` builds the list of `extra_groups` there, and
//! `initgroups` allocates one). Once that page was far, every pager thread waited in the kernel
//! for a page that only the pager's threads can fetch, and the process hung
//! (`test_subprocess.test_extra_groups` of CPython's suite). So `setgroups` hands the C library
//! a copy of the list made in gleaner's own memory, and `initgroups`, whose call to `setgroups`
//! stays inside the C library, runs as gleaner's own code, so that the list it allocates is
//! not managed. The other credential calls pass only numbers.

// The exported functions replace C library calls: their contract is the C library's (its manual
// pages), the same for every caller, so no `# Safety` section is repeated on each.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::AtomicUsize;

use crate::real::next;

type SetgroupsFn = unsafe extern "C" fn(usize, *const libc::gid_t) -> c_int;
type InitgroupsFn = unsafe extern "C" fn(*const c_char, libc::gid_t) -> c_int;

fn real_setgroups() -> SetgroupsFn {
    static SLOT: AtomicUsize = AtomicUsize::new(0);
    // SAFETY: the C library's setgroups has this type.
    unsafe { std::mem::transmute::<*mut c_void, SetgroupsFn>(next(&SLOT, b"setgroups\0")) }
}

fn real_initgroups() -> InitgroupsFn {
    static SLOT: AtomicUsize = AtomicUsize::new(0);
    // SAFETY: the C library's initgroups has this type.
    unsafe { std::mem::transmute::<*mut c_void, InitgroupsFn>(next(&SLOT, b"initgroups\0")) }
}

/// The most groups the kernel takes (`NGROUPS_MAX`); it refuses a longer list without reading it.
const NGROUPS_MAX: usize = 1 << 16;

/// `setgroups(2)`.
#[no_mangle]
pub unsafe extern "C" fn setgroups(size: usize, list: *const libc::gid_t) -> c_int {
    if size == 0 || size > NGROUPS_MAX || !crate::arena::contains(list as usize) {
        // SAFETY: forwarding the caller's arguments: the list is not managed, or not read.
        return unsafe { real_setgroups()(size, list) };
    }
    // Read on the program's own thread, where a far page is fetched as usual.
    let copy: Vec<libc::gid_t> = {
        let _in = crate::InPager::enter();
        // SAFETY: the caller passes `size` readable entries at `list`.
        unsafe { std::slice::from_raw_parts(list, size) }.to_vec()
    };
    // SAFETY: forwarding a copy in gleaner's memory, alive until the call returns (after every
    // thread has made it).
    unsafe { real_setgroups()(size, copy.as_ptr()) }
}

/// `initgroups(3)`.
#[no_mangle]
pub unsafe extern "C" fn initgroups(user: *const c_char, group: libc::gid_t) -> c_int {
    // As gleaner's code: the list it allocates comes from the C library's heap.
    let _in = crate::InPager::enter();
    // SAFETY: forwarding the caller's arguments.
    unsafe { real_initgroups()(user, group) }
}
