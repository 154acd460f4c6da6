//! The reserved virtual range behind a region: one anonymous private mapping, never backed by
//! transparent huge pages, unmapped on drop.
//!
//! Every call here is a raw system call, not the C library's wrapper: under `LD_PRELOAD` the
//! `mmap`/`munmap`/`madvise` symbols are gleaner's own interposers, which call back into the
//! pager (a `madvise` from the evictor would re-enter `Region::discard`).

use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use crate::PAGE_SIZE;

/// `PIDFD_SELF_THREAD` (Linux 6.15, newer than Debian's headers): a pidfd argument meaning "the
/// calling thread", whose memory is the whole process's, so no pidfd has to be opened (or
/// reopened after `fork`). (`PIDFD_SELF_THREAD_GROUP`, -20000, is refused by `process_madvise`
/// on 6.18.)
const PIDFD_SELF_THREAD: libc::c_int = -10000;

/// Ranges handed to one `process_madvise` call (the kernel's `UIO_MAXIOV`).
const MAX_IOVECS: usize = 1024;

/// Cleared the first time the kernel refuses a vectored `MADV_DONTNEED` on the calling process
/// (before Linux 6.13 `process_madvise` took only non-destructive advice; before 6.15 it had no
/// `PIDFD_SELF`): every later drop uses one `madvise` per range.
static VECTORED_DROP: AtomicBool = AtomicBool::new(true);

/// `MADV_DONTNEED_LOCKED` (Linux 5.18, newer than Debian's `libc` crate knows): `MADV_DONTNEED`
/// that also drops pages the program locked with `mlock` or `mlockall`, where plain
/// `MADV_DONTNEED` fails with `EINVAL`.
const MADV_DONTNEED_LOCKED: libc::c_int = 24;

/// The advice that drops a region's pages ([`drop_advice`]); 0 until first asked.
static DROP_ADVICE: AtomicI32 = AtomicI32::new(0);

/// The advice with which the pager drops pages: `MADV_DONTNEED_LOCKED` where the kernel has
/// it, else `MADV_DONTNEED`. A program may lock its memory (`mlockall(MCL_FUTURE)`, `mlock`
/// on a buffer: `memcached -k`, programs guarding secrets): its pages stay out of the kernel's
/// swap, but gleaner still evicts them within the budget (sealed), and the program's own
/// discards of them are done. With plain `MADV_DONTNEED` the first eviction of a locked page
/// failed and stopped the program (exit 86).
pub(crate) fn drop_advice() -> libc::c_int {
    let known = DROP_ADVICE.load(Ordering::Relaxed);
    if known != 0 {
        return known;
    }
    // An empty range at an aligned address: the kernel checks that it knows the advice, then
    // returns at once, touching nothing.
    // SAFETY: madvise on zero bytes accesses no memory.
    let r = unsafe { libc::syscall(libc::SYS_madvise, 0usize, 0usize, MADV_DONTNEED_LOCKED) };
    let advice = if r == 0 {
        MADV_DONTNEED_LOCKED
    } else {
        libc::MADV_DONTNEED
    };
    DROP_ADVICE.store(advice, Ordering::Relaxed);
    advice
}

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
        // SAFETY: no address hint; the kernel picks a free range, so no existing memory is
        // affected.
        let p = unsafe { map_anonymous(None, len) }?;
        let m = Mapping { addr: p, len };
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
        // (NOHUGEPAGE, DONTFORK, DONTNEED(_LOCKED), POPULATE_WRITE) never touch memory outside
        // the range; DONTNEED(_LOCKED) discards contents, which callers only do for pages whose
        // data is safe elsewhere; POPULATE_WRITE changes no contents.
        let r = unsafe { libc::syscall(libc::SYS_madvise, self.addr + offset, len, advice) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Discards the pages of several ranges, `(first page, page count)` each, as `MADV_DONTNEED`
    /// would (locked ones too: [`drop_advice`]). One vectored `process_madvise` covers up to
    /// [`MAX_IOVECS`] ranges with a single TLB flush, where one `madvise` per range flushes (and
    /// interrupts every other CPU running the program) once per range: on the 2-vCPU test VM the
    /// vectored call was measured an order of magnitude cheaper per scattered page
    /// (`docs/decisions/0003-eviction-through-a-pipe.md`). Falls back to one `madvise`
    /// per range where the kernel refuses.
    pub(crate) fn discard_ranges(&self, ranges: &[(usize, usize)]) -> io::Result<()> {
        let mut rest = ranges;
        while !rest.is_empty() && VECTORED_DROP.load(Ordering::Relaxed) {
            let chunk = &rest[..rest.len().min(MAX_IOVECS)];
            let iov: Vec<libc::iovec> = chunk
                .iter()
                .map(|&(first, count)| {
                    assert!(
                        (first + count) * PAGE_SIZE <= self.len,
                        "discard outside the mapping"
                    );
                    libc::iovec {
                        iov_base: (self.addr + first * PAGE_SIZE) as *mut libc::c_void,
                        iov_len: count * PAGE_SIZE,
                    }
                })
                .collect();
            // SAFETY: every iovec lies inside this mapping (asserted above) and `iov` outlives
            // the call; the target is the calling process itself. The drop advice discards the
            // contents, which callers only do for pages whose data is safe elsewhere, exactly
            // as in `madvise`.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_process_madvise,
                    PIDFD_SELF_THREAD,
                    iov.as_ptr(),
                    iov.len(),
                    drop_advice(),
                    0u32,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                log::debug!("vectored MADV_DONTNEED refused ({e}); dropping one range at a time");
                VECTORED_DROP.store(false, Ordering::Relaxed);
                break;
            }
            // A short count means the kernel stopped part-way: skip what it covered, retry the rest.
            let mut done = r as usize;
            let mut whole = 0;
            for &(_, count) in chunk {
                if done < count * PAGE_SIZE {
                    break;
                }
                done -= count * PAGE_SIZE;
                whole += 1;
            }
            if whole == 0 {
                // Not even the first range went through: let `madvise` report why.
                break;
            }
            rest = &rest[whole..];
        }
        for &(first, count) in rest {
            self.madvise(first * PAGE_SIZE, count * PAGE_SIZE, drop_advice())?;
        }
        Ok(())
    }
}

impl Mapping {
    /// Maps fresh anonymous memory over `[offset, offset+len)` of this mapping, as `reserve`
    /// made it (private, `MAP_NORESERVE`, no huge pages; `dontfork` as the region asked): what
    /// the program mapped there over the region's memory (a file, with `MAP_FIXED`) is gone.
    /// The caller registers the range with the userfaultfd again.
    pub(crate) fn remap_anonymous(
        &self,
        offset: usize,
        len: usize,
        dontfork: bool,
    ) -> io::Result<()> {
        assert!(
            offset.is_multiple_of(PAGE_SIZE) && offset + len <= self.len,
            "remap outside the mapping"
        );
        // SAFETY: MAP_FIXED over a range inside this mapping's reservation, which the program
        // has given up (it unmapped or replaced what it had mapped there): nothing else lives
        // there, and the new memory reads as zeros.
        unsafe { map_anonymous(Some(self.addr + offset), len) }?;
        self.madvise(offset, len, libc::MADV_NOHUGEPAGE)?;
        if dontfork {
            self.madvise(offset, len, libc::MADV_DONTFORK)?;
        }
        Ok(())
    }
}

/// Maps `len` bytes of private anonymous memory as a region's reservation is made (read-write,
/// `MAP_NORESERVE`), at `at` with `MAP_FIXED` or where the kernel chooses; returns its address.
///
/// # Safety
///
/// With `at`, whatever is mapped at `[at, at+len)` is replaced: the caller must own that range
/// and nothing may still use what was there.
unsafe fn map_anonymous(at: Option<usize>, len: usize) -> io::Result<usize> {
    let fixed = if at.is_some() { libc::MAP_FIXED } else { 0 };
    // SAFETY: the caller vouches for the range when it is fixed; without `at` the kernel picks
    // a free one. Checked for MAP_FAILED below.
    let p = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            at.unwrap_or(0),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | fixed,
            -1,
            0,
        )
    } as *mut libc::c_void;
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p as usize)
}

/// Whether drops still go through the vectored `process_madvise` (false once the kernel refused).
pub(crate) fn vectored_drops() -> bool {
    VECTORED_DROP.load(Ordering::Relaxed)
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the range mapped in `reserve`, once.
        unsafe { libc::syscall(libc::SYS_munmap, self.addr, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a marker into every page of `m` through a raw pointer.
    fn fill(m: &Mapping, pages: usize) {
        for p in 0..pages {
            // SAFETY: page `p` lies inside the mapping, which is readable and writable and used
            // by nothing else in this test.
            unsafe { *((m.addr() + p * PAGE_SIZE) as *mut u8) = 0xA5 };
        }
    }

    /// The first byte of every page.
    fn first_bytes(m: &Mapping, pages: usize) -> Vec<u8> {
        (0..pages)
            // SAFETY: as in `fill`.
            .map(|p| unsafe { *((m.addr() + p * PAGE_SIZE) as *const u8) })
            .collect()
    }

    /// Pages the program locked (`mlock`, `mlockall`) are dropped too: plain `MADV_DONTNEED`
    /// refuses them, and that stopped a program that locks its memory at its first eviction.
    #[test]
    fn discard_ranges_drops_locked_pages_too() {
        let pages = 16;
        let m = Mapping::reserve(pages * PAGE_SIZE).unwrap();
        fill(&m, pages);
        // SAFETY: the mapping's pages, resident already; mlock changes no contents.
        let r = unsafe { libc::mlock(m.addr() as *const libc::c_void, pages * PAGE_SIZE) };
        assert_eq!(r, 0, "mlock: {}", io::Error::last_os_error());
        assert!(
            m.madvise(0, PAGE_SIZE, libc::MADV_DONTNEED).is_err(),
            "the kernel dropped a locked page with MADV_DONTNEED"
        );
        m.discard_ranges(&[(2, 3), (9, 1)]).unwrap();
        m.madvise(12 * PAGE_SIZE, PAGE_SIZE, drop_advice()).unwrap();
        let dropped = |p: usize| (2..5).contains(&p) || p == 9 || p == 12;
        for (p, b) in first_bytes(&m, pages).into_iter().enumerate() {
            assert_eq!(b, if dropped(p) { 0 } else { 0xA5 }, "page {p}");
        }
    }

    #[test]
    fn discard_ranges_zeroes_exactly_the_given_pages() {
        let pages = 64;
        let m = Mapping::reserve(pages * PAGE_SIZE).unwrap();
        fill(&m, pages);
        let ranges = [(1, 2), (5, 1), (10, 3), (63, 1)];
        m.discard_ranges(&ranges).unwrap();
        let dropped = |p: usize| ranges.iter().any(|&(f, n)| p >= f && p < f + n);
        for (p, b) in first_bytes(&m, pages).into_iter().enumerate() {
            assert_eq!(b, if dropped(p) { 0 } else { 0xA5 }, "page {p}");
        }
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut v = release.split(|c: char| !c.is_ascii_digit());
        let major: u32 = v.next().and_then(|x| x.parse().ok()).unwrap_or(0);
        let minor: u32 = v.next().and_then(|x| x.parse().ok()).unwrap_or(0);
        if (major, minor) >= (6, 15) {
            assert!(
                vectored_drops(),
                "kernel {release}: vectored MADV_DONTNEED was refused"
            );
        } else {
            eprintln!(
                "NOTE: kernel {} predates PIDFD_SELF (6.15): only the one-madvise-per-range \
                 fallback ran here",
                release.trim()
            );
        }
    }

    #[test]
    fn discard_ranges_handles_more_ranges_than_one_call_takes() {
        let pages = 2 * MAX_IOVECS + 400;
        let m = Mapping::reserve(pages * PAGE_SIZE).unwrap();
        fill(&m, pages);
        let ranges: Vec<(usize, usize)> = (0..pages).step_by(2).map(|p| (p, 1)).collect();
        assert!(ranges.len() > MAX_IOVECS);
        m.discard_ranges(&ranges).unwrap();
        for (p, b) in first_bytes(&m, pages).into_iter().enumerate() {
            assert_eq!(b, if p % 2 == 0 { 0 } else { 0xA5 }, "page {p}");
        }
    }

    #[test]
    #[should_panic(expected = "discard outside the mapping")]
    fn discard_ranges_refuses_a_range_past_the_end() {
        let m = Mapping::reserve(4 * PAGE_SIZE).unwrap();
        let _ = m.discard_ranges(&[(3, 2)]);
    }
}
