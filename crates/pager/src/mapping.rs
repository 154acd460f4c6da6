//! The reserved virtual range behind a region: one anonymous private mapping, never backed by
//! transparent huge pages, unmapped on drop.
//!
//! Every call here is a raw system call, not the C library's wrapper: under `LD_PRELOAD` the
//! `mmap`/`munmap`/`madvise` symbols are gleaner's own interposers, which call back into the
//! pager (a `madvise` from the evictor would re-enter `Region::discard`).

use std::io;

use crate::PAGE_SIZE;

/// An anonymous, private, `MAP_NORESERVE` mapping owned by a region.
#[derive(Debug)]
pub(crate) struct Mapping {
    addr: usize,
    len: usize,
}

impl Mapping {
    /// Reserves `len` bytes (a multiple of the page size) of address space.
    pub(crate) fn reserve(len: usize) -> io::Result<Mapping> {
        debug_assert_eq!(len % PAGE_SIZE, 0);
        // SAFETY: a fresh anonymous private mapping with no address hint; the kernel picks a free
        // range, so no existing memory is affected. Checked for MAP_FAILED below.
        let p = unsafe {
            libc::syscall(
                libc::SYS_mmap,
                std::ptr::null_mut::<libc::c_void>(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        } as *mut libc::c_void;
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let m = Mapping {
            addr: p as usize,
            len,
        };
        // Huge pages would make the kernel fault and evict 2 MiB at a time behind our back.
        m.madvise(0, len, libc::MADV_NOHUGEPAGE)?;
        Ok(m)
    }

    /// The first address.
    pub(crate) fn addr(&self) -> usize {
        self.addr
    }

    /// The length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// `madvise` on `[offset, offset+len)` of this mapping.
    pub(crate) fn madvise(&self, offset: usize, len: usize, advice: i32) -> io::Result<()> {
        assert!(offset + len <= self.len, "madvise outside the mapping");
        // SAFETY: the range lies inside a mapping this struct owns. The advice values used
        // (NOHUGEPAGE, DONTNEED) never touch memory outside the range; DONTNEED discards the
        // contents, which callers only do for pages whose data is safe elsewhere.
        let r = unsafe { libc::syscall(libc::SYS_madvise, self.addr + offset, len, advice) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the range mapped in `reserve`, once.
        unsafe { libc::syscall(libc::SYS_munmap, self.addr, self.len) };
    }
}
