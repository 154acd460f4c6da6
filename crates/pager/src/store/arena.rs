//! The far arena: a `PROT_NONE` reservation of address space into which the shared-memory
//! store maps the slabs its memnode grants, side by side, so that a blob's place is one byte
//! offset from the arena's start. All of the store's unsafe memory access is here.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use crate::PAGE_SIZE;

/// The reservation and the slabs mapped into it.
pub(crate) struct Arena {
    addr: usize,
    len: usize,
}

impl Arena {
    /// Reserves `len` bytes of address space (never touched until a slab is mapped there).
    pub(crate) fn reserve(len: usize) -> io::Result<Arena> {
        let len = len.max(PAGE_SIZE).next_multiple_of(PAGE_SIZE);
        // SAFETY: a fresh private anonymous reservation with no address hint: the kernel picks
        // a free range, so no existing mapping is affected.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::empty(),
                rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::NORESERVE,
            )
        }?;
        // A fork child inherits it, slabs and all: the far copies it was forked with are its
        // snapshot (see `ShmStore::fork_child`), and the rest of the reservation is where it maps
        // slabs of its own.
        let arena = Arena {
            addr: p as usize,
            len,
        };
        arena.leave_out_of_core_dumps(arena.addr, len);
        Ok(arena)
    }

    /// Pages the reservation spans.
    pub(crate) fn pages(&self) -> u64 {
        (self.len / PAGE_SIZE) as u64
    }

    /// Maps `pages` pages of `memfd` at page `first` of the arena, over the reservation.
    pub(crate) fn map_slab(&self, first: u64, pages: u64, memfd: &OwnedFd) -> io::Result<()> {
        assert!(first + pages <= self.pages(), "slab outside the arena");
        let at = (self.addr + first as usize * PAGE_SIZE) as *mut std::ffi::c_void;
        let len = pages as usize * PAGE_SIZE;
        // SAFETY: MAP_FIXED over a part of our own PROT_NONE reservation that no slab occupies
        // yet (slabs are mapped once each, at increasing pages), so nothing live is replaced.
        unsafe {
            rustix::mm::mmap(
                at,
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED | rustix::mm::MapFlags::FIXED,
                memfd.as_fd(),
                0,
            )
        }?;
        self.leave_out_of_core_dumps(at as usize, len);
        // Inherited by a fork child like the rest of the arena: its snapshot is read here.
        Ok(())
    }

    /// Leaves `[at, at+len)` of the arena out of core dumps: the slabs hold sealed blobs, of no
    /// use to whoever reads a core, and a core dump includes shared memory whole. (The arena is
    /// not managed memory: the preload library's `madvise` passes it on, as for `punch`.)
    fn leave_out_of_core_dumps(&self, at: usize, len: usize) {
        // SAFETY: DONTDUMP changes only whether a core dump includes the range, which is ours.
        let r = unsafe { libc::madvise(at as *mut libc::c_void, len, libc::MADV_DONTDUMP) };
        if r != 0 {
            log::debug!(
                "leaving far memory's slabs out of core dumps: {}",
                io::Error::last_os_error()
            );
        }
    }

    /// Frees `pages` pages of slab at page `first` of the arena, and their memory in the slab's
    /// memfd (`MADV_REMOVE` on the shared mapping: the hole `fallocate` would punch), so that
    /// the slab's descriptor need not be kept.
    pub(crate) fn punch(&self, first: u64, pages: u64) -> io::Result<()> {
        assert!(first + pages <= self.pages(), "punch outside the arena");
        let at = (self.addr + first as usize * PAGE_SIZE) as *mut std::ffi::c_void;
        let len = pages as usize * PAGE_SIZE;
        // SAFETY: the range lies in slabs this store mapped shared and writable (the caller
        // clips it to them); the pages hold no live blob, so nothing reads them any more.
        let punch = || unsafe { libc::madvise(at, len, libc::MADV_REMOVE) };
        if punch() == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) {
            return Err(e);
        }
        // A program that called `mlockall(MCL_FUTURE)` has every mapping made since locked,
        // the slabs mapped here included, and the kernel does not punch locked pages. The slabs
        // are gleaner's, not the program's: unlock the whole arena (it is one reservation, so
        // the range has no holes) and punch again.
        // SAFETY: munlock changes no contents and accesses no memory; the range is ours.
        if unsafe { libc::munlock(self.addr as *const std::ffi::c_void, self.len) } != 0 {
            return Err(e);
        }
        if punch() == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// The `len` bytes at `offset`.
    ///
    /// # Safety
    /// The range must lie in mapped slabs, and nothing may write it while the slice lives.
    pub(crate) unsafe fn bytes(&self, offset: u64, len: usize) -> &[u8] {
        debug_assert!(offset as usize + len <= self.len);
        // SAFETY: as the caller guarantees.
        unsafe { std::slice::from_raw_parts((self.addr + offset as usize) as *const u8, len) }
    }

    /// The `len` bytes at `offset`, to write.
    ///
    /// # Safety
    /// The range must lie in mapped slabs, and nothing else may read or write it while the
    /// slice lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn bytes_mut(&self, offset: u64, len: usize) -> &mut [u8] {
        debug_assert!(offset as usize + len <= self.len);
        // SAFETY: as the caller guarantees.
        unsafe { std::slice::from_raw_parts_mut((self.addr + offset as usize) as *mut u8, len) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the range reserved (and the slabs mapped inside it), once,
        // after every handle (which holds the Arc owning this arena) is gone.
        if let Err(e) = unsafe { rustix::mm::munmap(self.addr as *mut _, self.len) } {
            log::warn!("unmapping the far arena: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory the memfd holds, in 512-byte blocks (`fstat`'s `st_blocks`).
    fn blocks(fd: &OwnedFd) -> u64 {
        rustix::fs::fstat(fd).unwrap().st_blocks as u64
    }

    /// An arena of `arena_pages` with a fresh 16-page memfd mapped as a slab at page `first`.
    fn arena_with_slab(arena_pages: usize, first: u64) -> (Arena, OwnedFd) {
        let arena = Arena::reserve(arena_pages * PAGE_SIZE).unwrap();
        let memfd =
            rustix::fs::memfd_create("arena-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&memfd, 16 * PAGE_SIZE as u64).unwrap();
        arena.map_slab(first, 16, &memfd).unwrap();
        (arena, memfd)
    }

    #[test]
    fn punching_through_the_mapping_frees_the_memfds_memory() {
        let (arena, memfd) = arena_with_slab(64, 8);
        let at = arena.addr + 8 * PAGE_SIZE;
        // SAFETY: pages 8..24 of the arena are the slab just mapped, shared and writable, and
        // nothing else uses them.
        unsafe { std::ptr::write_bytes(at as *mut u8, 7, 16 * PAGE_SIZE) };
        let full = blocks(&memfd);
        assert!(full >= 16 * PAGE_SIZE as u64 / 512, "{full}");
        arena.punch(12, 8).unwrap();
        let left = blocks(&memfd);
        assert_eq!(full - left, 8 * PAGE_SIZE as u64 / 512, "{full} -> {left}");
        // The pages around the hole keep their bytes; the hole reads as zeros.
        // SAFETY: as above; reads of the slab's pages.
        let (kept, hole) = unsafe {
            (
                *((at + 4 * PAGE_SIZE - 1) as *const u8),
                *((at + 4 * PAGE_SIZE) as *const u8),
            )
        };
        assert_eq!((kept, hole), (7, 0));
    }

    /// A program that locked its memory (`mlockall`) locked the slabs too, and the kernel
    /// punches no locked page (`EINVAL`): the arena unlocks itself and punches.
    #[test]
    fn punching_a_slab_the_program_locked_still_frees_the_memory() {
        let (arena, memfd) = arena_with_slab(32, 0);
        assert_eq!(
            // SAFETY: the arena's first 16 pages are the slab just mapped, used by nothing else;
            // mlock faults them in and locks them, changing no contents.
            unsafe { libc::mlock(arena.addr as *const libc::c_void, 16 * PAGE_SIZE) },
            0,
            "mlock: {}",
            io::Error::last_os_error()
        );
        // SAFETY: as above.
        unsafe { std::ptr::write_bytes(arena.addr as *mut u8, 7, 16 * PAGE_SIZE) };
        let full = blocks(&memfd);
        // SAFETY: as above: a punch of the locked slab by hand fails.
        let refused = unsafe {
            libc::madvise(
                arena.addr as *mut libc::c_void,
                PAGE_SIZE,
                libc::MADV_REMOVE,
            )
        };
        assert_eq!(refused, -1, "the kernel punched a locked page");
        arena.punch(4, 8).unwrap();
        assert_eq!(full - blocks(&memfd), 8 * PAGE_SIZE as u64 / 512);
    }
}
