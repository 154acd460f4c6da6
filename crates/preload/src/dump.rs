//! Core dumps of a program on far memory: the part of the managed reservation that was never
//! carved is left out of them.
//!
//! The reservation is tens of GiB of address space (`MAP_NORESERVE`), and a core dump includes
//! every private anonymous mapping whole: a crash wrote a 64 GiB core file (sparse, 75 MiB on
//! disk, but a crash handler reading a pipe, as `systemd-coredump` does, is sent every zero).
//! So the reservation is marked `MADV_DONTDUMP` at start-up, and the part the arena has carved
//! (it carves first fit, from the start) is marked back `MADV_DODUMP` in steps of
//! [`STEP_PAGES`] as it grows; it never shrinks. Pages held far at the crash are in the dump as
//! zeros all the same (docs/compatibility.md).

use std::sync::atomic::{AtomicUsize, Ordering};

use gleaner_pager::PAGE_SIZE;

/// Pages marked dumpable at a time (64 MiB).
pub(crate) const STEP_PAGES: usize = 16 * 1024;

/// Pages from the reservation's start that core dumps include.
static INCLUDED: AtomicUsize = AtomicUsize::new(0);

/// `madvise(2)` through `real.rs`: the C library's symbol is the interposer, which takes
/// managed memory's advice as the program's.
fn advise(addr: usize, len: usize, advice: i32) {
    // SAFETY: DONTDUMP and DODUMP change only whether a core dump includes the range; they
    // touch no contents.
    let r = unsafe { crate::real::madvise(addr as *mut libc::c_void, len, advice) };
    if r != 0 {
        let _in = crate::InPager::enter();
        log::debug!(
            "marking far memory for core dumps: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Leaves the reservation `[base, base+len)` out of core dumps (at start-up).
pub(crate) fn exclude(base: usize, len: usize) {
    advise(base, len, libc::MADV_DONTDUMP);
}

/// Pages up to `end` (from the reservation's start, of `total` pages) have been carved: core
/// dumps include them from now on.
pub(crate) fn include_up_to(base: usize, total: usize, end: usize) {
    // Most carves fall below the mark: a load, not a write every thread's carve would share.
    if end <= INCLUDED.load(Ordering::Acquire) {
        return;
    }
    let want = end.next_multiple_of(STEP_PAGES).min(total);
    let had = INCLUDED.fetch_max(want, Ordering::AcqRel);
    if had < want {
        advise(
            base + had * PAGE_SIZE,
            (want - had) * PAGE_SIZE,
            libc::MADV_DODUMP,
        );
    }
}
