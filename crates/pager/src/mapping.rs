//! The reserved virtual range behind a region: one anonymous private mapping, never backed by
//! transparent huge pages, unmapped on drop.

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
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
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
        let r = unsafe { libc::madvise((self.addr + offset) as *mut _, len, advice) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the range mapped in `reserve`, once.
        unsafe { libc::munmap(self.addr as *mut _, self.len) };
    }
}
