//! The C library's stdio streams around `fork`: their records must be resident when the child
//! is made.
//!
//! Between the fork system call and the first fork handler of the child, the C library resets
//! the lock of every stdio stream (`fresetlockfiles`, walking the list of open `FILE`s), and a
//! stream opened with `fopen` lives in the program's heap. In the child no userfaultfd covers
//! managed memory yet at that point (its pager starts in the fork handler), so a stream whose
//! page was far read as zeros there and was written as such: the child's stream was destroyed
//! (it crashed on its next `fprintf`). So before the fork, while the fault handlers still
//! serve and with eviction about to pause until the fork is over, every open stream's record
//! and lock are touched: they are resident when the child is made, and the child inherits them
//! as they are.

use std::ffi::c_void;

/// The start of glibc's `struct _IO_FILE` (`bits/types/struct_FILE.h`), as far as the fields
/// read here: the layout is part of the C library's ABI.
#[repr(C)]
struct IoFile {
    flags: libc::c_int,
    pointers: [*mut c_void; 12],
    chain: *mut IoFile,
    fileno: libc::c_int,
    flags2: libc::c_int,
    old_offset: libc::off_t,
    cur_column: libc::c_ushort,
    vtable_offset: libc::c_schar,
    shortbuf: [libc::c_char; 1],
    lock: *mut c_void,
}

extern "C" {
    /// The head of the list of open streams.
    static mut _IO_list_all: *mut IoFile;
    fn _IO_list_lock();
    fn _IO_list_unlock();
}

/// Reads every open stream's record and lock (see the module documentation). Runs in the fork
/// prepare handler, on the thread that forks, before the fault handlers are held back.
pub(crate) fn touch_streams() {
    // SAFETY: the C library's own lock over its list of streams, taken and given back here;
    // each record on the list is a live `FILE` while the lock is held, read (never written)
    // through volatile reads; `lock` points into the same allocation or at a static lock.
    unsafe {
        _IO_list_lock();
        let mut fp = std::ptr::addr_of!(_IO_list_all).read();
        let mut seen = 0usize;
        while !fp.is_null() && seen < 1 << 20 {
            let _ = std::ptr::addr_of!((*fp).flags).read_volatile();
            let lock = std::ptr::addr_of!((*fp).lock).read_volatile();
            if !lock.is_null() {
                let _ = lock.cast::<u8>().read_volatile();
            }
            fp = std::ptr::addr_of!((*fp).chain).read_volatile();
            seen += 1;
        }
        _IO_list_unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_layout_matches_the_c_librarys() {
        // Offsets of `_chain` and `_lock` in glibc's x86-64 and AArch64 `struct _IO_FILE`.
        assert_eq!(std::mem::offset_of!(IoFile, chain), 104);
        assert_eq!(std::mem::offset_of!(IoFile, lock), 136);
        // stdout is on the list, with its fileno.
        touch_streams();
        // SAFETY: reading the list head and walking it under the C library's lock.
        let fds = unsafe {
            _IO_list_lock();
            let mut fds = Vec::new();
            let mut fp = std::ptr::addr_of!(_IO_list_all).read();
            while !fp.is_null() {
                fds.push((*fp).fileno);
                fp = (*fp).chain;
            }
            _IO_list_unlock();
            fds
        };
        assert!(fds.contains(&1) && fds.contains(&2), "{fds:?}");
    }
}
