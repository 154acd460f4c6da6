//! A shared mapping of (part of) a soft pool's memfd, and the one place that turns it into
//! references. Everything unsafe about shared memory in this crate is in this module.
//!
//! The memfd is sealed against shrinking (`F_SEAL_SHRINK`, checked at registration), so no
//! offset inside its size can ever raise `SIGBUS`; a punched range reads as zeros.

use std::io;
use std::os::fd::AsFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};

/// A `MAP_SHARED` read-write mapping of the first `len` bytes of a file.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access that may race with another thread or
// process goes through atomics or through copies whose result is validated afterwards.
unsafe impl Send for Mapping {}
// SAFETY: as above: `&Mapping` only hands out atomics and raw copies.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `fd` shared, read and write.
    pub fn new(fd: impl AsFd, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping at an address of the kernel's choosing cannot alias any Rust
        // object; `fd` is a valid descriptor for the call's duration.
        let p = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }?;
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Mapping { ptr, len })
    }

    /// The mapping's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: a zero-length mmap fails).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The atomic `u64` at byte offset `off` (8-aligned, inside the mapping).
    #[inline]
    pub fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(
            off.is_multiple_of(8) && off + 8 <= self.len,
            "u64 at {off} out of bounds"
        );
        // SAFETY: in bounds and aligned (checked), the mapping lives as long as `&self`, and
        // AtomicU64 has the layout of u64 and tolerates concurrent writers (other processes).
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU64>() }
    }

    /// The atomic `u32` at byte offset `off` (4-aligned, inside the mapping).
    #[inline]
    pub fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert!(
            off.is_multiple_of(4) && off + 4 <= self.len,
            "u32 at {off} out of bounds"
        );
        // SAFETY: as for `u64_at`.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU32>() }
    }

    /// Copies `dst.len()` bytes from offset `off` out of the mapping. The bytes may be changing
    /// under the copy (another process punching or writing): the caller must validate them
    /// afterwards (a seqlock-style re-check) before trusting them.
    #[inline]
    pub fn copy_out(&self, off: usize, dst: &mut [u8]) {
        assert!(off.checked_add(dst.len()).is_some_and(|e| e <= self.len));
        // SAFETY: the source range is inside the mapping (checked) and cannot overlap `dst`, a
        // Rust buffer. Concurrent changes can only make the copied bytes stale or mixed, never
        // invalid: `u8` has no invalid values, and callers validate before use.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), dst.as_mut_ptr(), dst.len())
        }
    }

    /// Appends `len` bytes of the mapping at offset `off` to `out` (its spare room is written
    /// directly: unlike [`Mapping::copy_out`] into a resized buffer, the output is not zeroed
    /// first, which for a large read costs as much as the copy).
    #[inline]
    pub fn append_to(&self, off: usize, len: usize, out: &mut Vec<u8>) {
        assert!(off.checked_add(len).is_some_and(|e| e <= self.len));
        out.reserve(len);
        let at = out.len();
        // SAFETY: the source range is inside the mapping (checked); the destination is the
        // vector's spare room, at least `len` bytes after `reserve`, which cannot overlap the
        // mapping. The copy initialises those `len` bytes, so the new length covers only
        // initialised bytes. Concurrent changes to the source can only make the bytes stale or
        // mixed, never invalid (`u8`), and callers validate before use.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(off),
                out.as_mut_ptr().add(at),
                len,
            );
            out.set_len(at + len);
        }
    }

    /// Copies `src` into the mapping at offset `off`.
    #[inline]
    pub fn copy_in(&self, off: usize, src: &[u8]) {
        assert!(off.checked_add(src.len()).is_some_and(|e| e <= self.len));
        // SAFETY: the destination range is inside the mapping (checked) and cannot overlap
        // `src`, a Rust slice; nobody holds a Rust reference into the mapping's bytes (only
        // atomics, at offsets the callers keep apart from object data).
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(off), src.len())
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned, and no reference into the mapping
        // outlives `self` (they all borrow it).
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_to_adds_the_bytes_after_what_the_buffer_holds() {
        let fd = rustix::fs::memfd_create("map-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 8192).unwrap();
        let map = Mapping::new(&fd, 8192).unwrap();
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        map.copy_in(100, &data);
        let mut out = b"head".to_vec();
        map.append_to(100, data.len(), &mut out);
        assert_eq!(&out[..4], b"head");
        assert_eq!(&out[4..], &data[..]);
        // Reused with room to spare: the length follows what was appended, nothing more.
        out.clear();
        map.append_to(100, 32, &mut out);
        assert_eq!(out, data[..32]);
    }
}
