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

    /// The `N` atomic `u64`s from byte offset `off` (8-aligned, inside the mapping), as an
    /// array: indexing it needs no check against the mapping's length.
    #[inline]
    pub fn u64_array_at<const N: usize>(&self, off: usize) -> &[AtomicU64; N] {
        assert!(
            off.is_multiple_of(8)
                && N.checked_mul(8)
                    .and_then(|n| n.checked_add(off))
                    .is_some_and(|e| e <= self.len),
            "{N} u64s at {off} out of bounds"
        );
        // SAFETY: in bounds and aligned (checked), the mapping lives as long as `&self`, and
        // AtomicU64 has the layout of u64 and tolerates concurrent writers (other processes).
        unsafe { &*self.ptr.as_ptr().add(off).cast::<[AtomicU64; N]>() }
    }

    /// As [`Mapping::u64_array_at`], without the check, for a range its caller knows lies
    /// inside every mapping it is used on.
    ///
    /// # Safety
    ///
    /// `off` is 8-aligned and `off + 8 * N <= self.len()`.
    #[inline(always)]
    pub unsafe fn u64_array_at_unchecked<const N: usize>(&self, off: usize) -> &[AtomicU64; N] {
        debug_assert!(off.is_multiple_of(8) && off + 8 * N <= self.len);
        // SAFETY: in bounds and aligned (the caller's contract), the mapping lives as long as
        // `&self`, and AtomicU64 has the layout of u64 and tolerates concurrent writers.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<[AtomicU64; N]>() }
    }

    /// A piece of a soft pool's segment: a 16-byte header (16-aligned) at `off` and the `len`
    /// bytes after it, checked once to lie inside the mapping; `None` if they do not.
    #[inline]
    pub fn piece(&self, off: usize, len: usize) -> Option<Piece<'_>> {
        let fits = off.is_multiple_of(16)
            && off
                .checked_add(16)
                .and_then(|e| e.checked_add(len))
                .is_some_and(|e| e <= self.len);
        if !fits {
            return None;
        }
        // SAFETY: `off` is inside the mapping (checked just above), so the pointer stays in
        // the same allocation and is not null.
        let at = unsafe { self.ptr.add(off) };
        Some(Piece {
            at,
            len,
            _map: std::marker::PhantomData,
        })
    }

    /// As [`Mapping::piece`], without the check, for a piece its caller checked once when it
    /// recorded it (a soft read's hit path, which copies from a place checked when it was
    /// published).
    ///
    /// # Safety
    ///
    /// `off` is 16-aligned and `off + 16 + len <= self.len()`.
    #[inline(always)]
    pub unsafe fn piece_unchecked(&self, off: usize, len: usize) -> Piece<'_> {
        debug_assert!(off.is_multiple_of(16) && off + 16 + len <= self.len);
        Piece {
            // SAFETY: `off` is inside the mapping (the caller's contract), so the pointer stays
            // in the same allocation and is not null.
            at: unsafe { self.ptr.add(off) },
            len,
            _map: std::marker::PhantomData,
        }
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

/// A piece of a soft pool's segment, its bounds checked by [`Mapping::piece`] (or, under
/// [`Mapping::piece_unchecked`]'s contract, by its caller beforehand): what a read without the
/// pool's lock needs, with no further check.
pub struct Piece<'a> {
    /// The header's first byte (16-aligned).
    at: NonNull<u8>,
    /// Payload bytes after the header.
    len: usize,
    _map: std::marker::PhantomData<&'a Mapping>,
}

impl Piece<'_> {
    /// The header as two words, each loaded relaxed (another thread or process may be
    /// changing them: the caller validates before trusting).
    #[inline]
    pub fn header(&self) -> [u64; 2] {
        // SAFETY: the 16 header bytes are inside the mapping (checked when the piece was made)
        // and 16-aligned; the mapping outlives `'_`; AtomicU64 has the layout of u64 and tolerates
        // concurrent writers.
        let words = unsafe { &*self.at.as_ptr().cast::<[AtomicU64; 2]>() };
        [
            words[0].load(std::sync::atomic::Ordering::Relaxed),
            words[1].load(std::sync::atomic::Ordering::Relaxed),
        ]
    }

    /// Appends the payload to `out` (its spare room written directly, as
    /// [`Mapping::append_to`]). A payload of 8 to 32 bytes is copied inline, as two pairs of
    /// overlapping unaligned words, rather than through a call to the C library's `memcpy`:
    /// for the small objects soft memory holds most, the call was a third of a hit's cost.
    #[inline]
    pub fn append_payload_to(&self, out: &mut Vec<u8>) {
        out.reserve(self.len);
        let at = out.len();
        let len = self.len;
        // SAFETY: the payload, `len` bytes after the header, is inside the mapping
        // (checked when the piece was made); the destination is the vector's spare room, at least
        // `len` bytes after `reserve`, which cannot overlap the mapping. Each copy below reads
        // and writes only within those `len` bytes (the small cases' words start at 0 and end at
        // `len`), and together they initialise all of them. Concurrent changes to the source can
        // only make the bytes stale or mixed, never invalid (`u8`), and callers validate before
        // use.
        unsafe {
            let src = self.at.as_ptr().add(16);
            let dst = out.as_mut_ptr().add(at);
            if (16..=32).contains(&len) {
                let head = std::ptr::read_unaligned(src.cast::<u128>());
                let tail = std::ptr::read_unaligned(src.add(len - 16).cast::<u128>());
                std::ptr::write_unaligned(dst.cast::<u128>(), head);
                std::ptr::write_unaligned(dst.add(len - 16).cast::<u128>(), tail);
            } else if (8..16).contains(&len) {
                let head = std::ptr::read_unaligned(src.cast::<u64>());
                let tail = std::ptr::read_unaligned(src.add(len - 8).cast::<u64>());
                std::ptr::write_unaligned(dst.cast::<u64>(), head);
                std::ptr::write_unaligned(dst.add(len - 8).cast::<u64>(), tail);
            } else {
                std::ptr::copy_nonoverlapping(src, dst, len);
            }
            out.set_len(at + len);
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

    #[test]
    fn a_piece_is_checked_once_then_read() {
        let fd = rustix::fs::memfd_create("map-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 8192).unwrap();
        let map = Mapping::new(&fd, 8192).unwrap();
        let mut bytes = 7u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(&9u64.to_le_bytes());
        bytes.extend_from_slice(b"payload");
        map.copy_in(4096, &bytes);
        let p = map.piece(4096, 7).unwrap();
        assert_eq!(p.header().map(u64::from_le), [7, 9]);
        let mut out = b"x".to_vec();
        p.append_payload_to(&mut out);
        assert_eq!(out, b"xpayload");
        // Every length through the inline copies' cases and past them, each against its
        // neighbours' bytes: exactly the payload arrives, after what the buffer held.
        let payload: Vec<u8> = (0..80u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        map.copy_in(2048 + 16, &payload);
        map.copy_in(2048 + 16 + 80, &[0xee; 32]);
        for len in 0..=80 {
            let p = map.piece(2048, len).unwrap();
            let mut out = b"ab".to_vec();
            p.append_payload_to(&mut out);
            assert_eq!(&out[..2], b"ab", "len {len}");
            assert_eq!(&out[2..], &payload[..len], "len {len}");
        }
        assert!(map.piece(4100, 7).is_none(), "not 16-aligned");
        assert!(map.piece(8192 - 16, 1).is_none(), "past the end");
        assert!(map.piece(8192 - 16, 0).is_some());
        assert!(map.piece(usize::MAX - 15, 16).is_none(), "no overflow");
        assert_eq!(
            map.u64_array_at::<2>(4096)[1]
                .load(std::sync::atomic::Ordering::Relaxed)
                .to_le(),
            9u64.to_le()
        );
    }
}
