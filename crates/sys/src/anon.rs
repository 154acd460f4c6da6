//! Anonymous private mappings owned by a value: mapped on creation, unmapped on drop.

use std::io;

/// `len` bytes of private anonymous memory at an address the kernel picks, readable and
/// writable, unmapped when dropped.
pub struct AnonMapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; moving the owner to another thread
// moves nothing that is tied to a thread.
unsafe impl Send for AnonMapping {}
// SAFETY: the value itself is never changed through `&self`; what the memory holds is the
// callers' to synchronise, as with any raw pointer they take from it.
unsafe impl Sync for AnonMapping {}

impl AnonMapping {
    /// Maps `len` bytes with `MAP_PRIVATE | MAP_ANONYMOUS | extra_flags` (for example
    /// `MAP_NORESERVE` or `MAP_POPULATE`; `MAP_FIXED` is ignored: the kernel picks the address).
    pub fn new(len: usize, extra_flags: i32) -> io::Result<AnonMapping> {
        // SAFETY: a fresh anonymous mapping at an address the kernel picks (MAP_FIXED is
        // masked out of the caller's flags), so no existing memory is affected. Checked for
        // MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | (extra_flags & !libc::MAP_FIXED),
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(AnonMapping {
            ptr: p as *mut u8,
            len,
        })
    }

    /// Advises the kernel about the whole mapping (`madvise(2)`).
    pub fn advise(&self, advice: i32) -> io::Result<()> {
        // SAFETY: advice on exactly the mapping this value owns.
        if unsafe { libc::madvise(self.ptr.cast(), self.len, advice) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The mapping's first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Its address, as a number.
    pub fn addr(&self) -> usize {
        self.ptr as usize
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never, for a mapping that was made).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for AnonMapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` created; its owner is going away, so nothing
        // that borrowed it remains.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapping_is_zeroed_writable_memory_that_is_gone_after_drop() {
        let m = AnonMapping::new(3 * 4096, libc::MAP_NORESERVE).unwrap();
        // SAFETY: the mapping is 3 pages of readable, writable memory owned by `m`.
        let bytes = unsafe { std::slice::from_raw_parts_mut(m.as_ptr(), m.len()) };
        assert!(bytes.iter().all(|&b| b == 0));
        bytes[5000] = 9;
        assert_eq!(bytes[5000], 9);
        m.advise(libc::MADV_NOHUGEPAGE).unwrap();
        let addr = m.addr();
        drop(m);
        let mut vec = [0u8; 1];
        // SAFETY: mincore on a page-aligned range; it only reports, and fails with ENOMEM
        // where nothing is mapped.
        let rc = unsafe { libc::mincore(addr as *mut _, 4096, vec.as_mut_ptr()) };
        assert_eq!(rc, -1, "the range is still mapped after drop");
    }

    #[test]
    fn an_impossible_size_is_an_error_not_a_crash() {
        assert!(AnonMapping::new(usize::MAX & !4095, 0).is_err());
    }
}
