//! The exported `mlockall`: a program that locks all its memory (`memcached -k`, daemons that
//! guard secrets, real-time programs) keeps it locked, but as it is touched, never all at once.
//!
//! The managed heap is one large reservation (`MAP_NORESERVE`, tens of GiB), and `MCL_CURRENT`
//! makes the kernel fault in every page of every mapping before the call returns: through the
//! userfaultfd that is millions of zero-fills, and a heap far larger than the machine's memory.
//! `MCL_FUTURE` would do the same to every mapping made afterwards, the shared-memory slabs of
//! the pager's memnode included. So the call reaches the kernel with `MCL_ONFAULT` added: every
//! mapping is locked, and each page is locked when it is first touched. Managed pages stay out
//! of the kernel's swap while resident, and gleaner still evicts them (sealed) to keep within
//! the budget: the pager drops them with `MADV_DONTNEED_LOCKED` (`gleaner_pager`'s mapping),
//! and unlocks its slabs where it must punch freed pages out of them. Before this, the first
//! eviction of a locked page stopped the program (exit 86: "dropping evicted pages: Invalid
//! argument").
//!
//! `mlock` and `mlock2` on a range go to the kernel as they are: it faults the range in through
//! the userfaultfd, and locks it.

// The exported functions replace C library calls: their contract is the C library's (its manual
// pages), the same for every caller, so no `# Safety` section is repeated on each.
#![allow(clippy::missing_safety_doc)]

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the program's `mlockall` was already reported.
static NOTED: AtomicBool = AtomicBool::new(false);

/// The `mlockall` flags as they reach the kernel: `MCL_ONFAULT` added where the process has
/// managed memory and asks to lock current or future mappings.
pub(crate) fn kernel_flags(flags: i32, has_managed_memory: bool) -> i32 {
    if has_managed_memory && flags & (libc::MCL_CURRENT | libc::MCL_FUTURE) != 0 {
        flags | libc::MCL_ONFAULT
    } else {
        flags
    }
}

/// `mlockall(2)`.
#[no_mangle]
pub unsafe extern "C" fn mlockall(flags: i32) -> i32 {
    let managed = crate::arena::get().is_some();
    let given = kernel_flags(flags, managed);
    if given != flags && !NOTED.swap(true, Ordering::Relaxed) {
        let _in = crate::InPager::enter();
        log::warn!(
            "the program locks its memory (mlockall): pages are locked as they are touched, and \
             its heap still goes to far memory (sealed) beyond the local budget"
        );
    }
    // SAFETY: mlockall(2) takes flags by value; no memory is passed.
    let r = unsafe { libc::syscall(libc::SYS_mlockall, given) };
    r as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locking_current_or_future_memory_is_done_on_fault_where_memory_is_managed() {
        let (current, future, onfault) = (libc::MCL_CURRENT, libc::MCL_FUTURE, libc::MCL_ONFAULT);
        assert_eq!(kernel_flags(current, true), current | onfault);
        assert_eq!(kernel_flags(future, true), future | onfault);
        assert_eq!(
            kernel_flags(current | future, true),
            current | future | onfault
        );
        assert_eq!(kernel_flags(current | onfault, true), current | onfault);
        // Without managed memory the program's call is the kernel's.
        assert_eq!(kernel_flags(current | future, false), current | future);
        // Bad flags get the kernel's own error.
        assert_eq!(kernel_flags(onfault, true), onfault);
        assert_eq!(kernel_flags(0, true), 0);
    }
}
