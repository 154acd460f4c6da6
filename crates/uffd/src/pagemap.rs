//! `PAGEMAP_SCAN` on `/proc/self/pagemap` (6.7+): find the pages written since they were
//! write-protected under `UFFD_FEATURE_WP_ASYNC`, and re-protect them in the same call.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// `PAGE_IS_WPALLOWED`: the page's range is registered for asynchronous write protection.
pub const PAGE_IS_WPALLOWED: u64 = 1 << 0;
/// `PAGE_IS_WRITTEN`: written since write protection was last applied.
pub const PAGE_IS_WRITTEN: u64 = 1 << 1;
/// `PAGE_IS_PRESENT`: mapped in memory.
pub const PAGE_IS_PRESENT: u64 = 1 << 3;
/// `PAGE_IS_SWAPPED`: swapped out (its contents are in swap, not lost).
pub const PAGE_IS_SWAPPED: u64 = 1 << 4;
/// `PM_SCAN_WP_MATCHING`: write-protect the pages that match.
pub const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
/// `PM_SCAN_CHECK_WPASYNC`: fail on pages without asynchronous write protection.
pub const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `struct page_region`: `[start, end)` with its categories.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PageRegion {
    /// First address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// `PAGE_IS_*` bits.
    pub categories: u64,
}

/// `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: u64 =
    (3 << 30) | ((std::mem::size_of::<PmScanArg>() as u64) << 16) | ((b'f' as u64) << 8) | 16;

/// An open `/proc/self/pagemap`.
pub struct Pagemap {
    file: File,
}

/// Opens `/proc/self/pagemap` with the process dumpable for the open ([`Pagemap::open`]).
///
/// Each thread's change of user makes the process undumpable again: while the C library has
/// every thread of a program that gives up root change its credentials in turn, another
/// thread's change can land between the toggle and the open (a fork child's reclaim thread
/// opening its pagemap while the child's `setreuid` went round, in CPython's
/// `test_subprocess.test_user`). So the toggle is tried again, a few times, until the open
/// is not refused.
fn open_while_dumpable() -> io::Result<File> {
    const TRIES: usize = 100;
    let mut tries = 0;
    loop {
        // SAFETY: PR_GET_DUMPABLE takes no pointer and returns the flag.
        let was = unsafe { libc::prctl(libc::PR_GET_DUMPABLE) };
        if was == 0 {
            // SAFETY: PR_SET_DUMPABLE takes the flag by value.
            unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1) };
        }
        let opened = File::open("/proc/self/pagemap");
        if was == 0 {
            // SAFETY: as above, back to what it was.
            unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0) };
        }
        tries += 1;
        match opened {
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied && tries < TRIES => {
                std::thread::yield_now()
            }
            other => return other,
        }
    }
}

impl Pagemap {
    /// Opens this process's pagemap.
    ///
    /// A program that dropped its privileges (`setuid` from root: `memcached -u nobody`) is no
    /// longer dumpable, and its `/proc/self` files are root's: the open fails with `EACCES`, and
    /// a pager thread that opened its pagemap late (an evictor started after the drop, a fork
    /// child's) stopped the program. The process is then made dumpable for the one open and
    /// put back at once: for those microseconds another process of the same user could attach
    /// to it, where it otherwise could not.
    pub fn open() -> io::Result<Pagemap> {
        let file = gleaner_fds::make_held(|| match File::open("/proc/self/pagemap") {
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => open_while_dumpable(),
            other => other,
        })?;
        Ok(Pagemap { file })
    }

    /// Appends to `out` the runs of pages in `[start, end)` written since they were last
    /// protected, and write-protects them again atomically. Returns where the walk stopped
    /// (`end` unless `out`'s spare capacity filled up first).
    pub fn take_written(
        &self,
        start: usize,
        end: usize,
        out: &mut Vec<PageRegion>,
    ) -> io::Result<usize> {
        self.walk(
            PmScanArg {
                flags: PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
                category_mask: PAGE_IS_WRITTEN,
                return_mask: PAGE_IS_WRITTEN,
                ..PmScanArg::default()
            },
            start,
            end,
            out,
        )
    }

    /// As [`Pagemap::take_written`], for a range that may also hold mappings without
    /// asynchronous write protection (a file the program mapped over it with `MAP_FIXED`):
    /// those are skipped instead of failing the walk. This is the access scan's reference bit:
    /// a page reported here was written since the previous call covering it.
    pub fn harvest_written(
        &self,
        start: usize,
        end: usize,
        out: &mut Vec<PageRegion>,
    ) -> io::Result<usize> {
        self.walk(
            PmScanArg {
                flags: PM_SCAN_WP_MATCHING,
                category_mask: PAGE_IS_WRITTEN,
                return_mask: PAGE_IS_WRITTEN,
                ..PmScanArg::default()
            },
            start,
            end,
            out,
        )
    }

    /// Appends to `out` the runs of pages in `[start, end)` that are present or swapped, with
    /// their `PAGE_IS_PRESENT`, `PAGE_IS_SWAPPED` and `PAGE_IS_WRITTEN` categories (written:
    /// no asynchronous write protection on the page since it was protected). Changes nothing.
    /// Returns where the walk stopped (`end` unless `out`'s spare capacity filled up first).
    pub fn scan(&self, start: usize, end: usize, out: &mut Vec<PageRegion>) -> io::Result<usize> {
        self.walk(
            PmScanArg {
                category_anyof_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
                return_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED | PAGE_IS_WRITTEN,
                ..PmScanArg::default()
            },
            start,
            end,
            out,
        )
    }

    /// One `PAGEMAP_SCAN` over `[start, end)` with `arg`'s flags and masks, its runs appended
    /// to `out`'s spare capacity. Returns where the walk stopped.
    fn walk(
        &self,
        mut arg: PmScanArg,
        start: usize,
        end: usize,
        out: &mut Vec<PageRegion>,
    ) -> io::Result<usize> {
        let spare = out.capacity() - out.len();
        assert!(spare > 0, "reserve room in `out` first");
        arg.size = std::mem::size_of::<PmScanArg>() as u64;
        arg.start = start as u64;
        arg.end = end as u64;
        arg.vec = out.as_mut_ptr().wrapping_add(out.len()) as u64;
        arg.vec_len = spare as u64;
        // SAFETY: PAGEMAP_SCAN reads `arg` and writes at most `vec_len` PageRegion entries into
        // `out`'s spare capacity, whose address and length `arg` carries; it returns how many.
        let n = unsafe { libc::ioctl(self.file.as_raw_fd(), PAGEMAP_SCAN as _, &mut arg) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel initialised the first `n` (<= spare) entries past the old length.
        unsafe { out.set_len(out.len() + n as usize) };
        Ok(arg.walk_end as usize)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ioctl_number_matches_the_kernel_header() {
        // _IOWR('f', 16, struct pm_scan_arg) with a 96-byte argument.
        assert_eq!(super::PAGEMAP_SCAN, 0xc060_6610);
    }
}
