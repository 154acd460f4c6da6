//! A region's memory as the engine handles it: the reserved mapping, the userfaultfd that serves
//! it, and the per-page state table. Everything here is addressing and installing pages; no
//! policy.

use gleaner_uffd::{Installed, Uffd};

use crate::fatal::fatal;
use crate::mapping::Mapping;
use crate::state::PageTable;
use crate::PAGE_SIZE;

/// The most pages zero-filled in one go (a sequential fill's window).
pub(crate) const MAX_ZERO_RUN: usize = 64;

/// The source for zero-filling pages: one, or a run of up to [`MAX_ZERO_RUN`] at once.
static ZEROS: [u8; MAX_ZERO_RUN * PAGE_SIZE] = [0; MAX_ZERO_RUN * PAGE_SIZE];

/// The mapping, its userfaultfd and its page table.
pub(crate) struct Memory {
    pub(crate) mapping: Mapping,
    pub(crate) uffd: Uffd,
    pub(crate) table: PageTable,
    /// Serve first-touch reads with a private zeroed page instead of the shared zero page (under
    /// asynchronous tracking eviction can only drop ordinary pages race-free).
    pub(crate) zero_reads_private: bool,
}

impl Memory {
    /// Pages in the region.
    pub(crate) fn pages(&self) -> usize {
        self.mapping.len() / PAGE_SIZE
    }

    /// The page holding `addr`, if it lies in the region.
    pub(crate) fn page_of(&self, addr: usize) -> Option<usize> {
        let base = self.mapping.addr();
        (addr >= base && addr < base + self.mapping.len()).then(|| (addr - base) / PAGE_SIZE)
    }

    /// The first address of `page`.
    pub(crate) fn addr_of(&self, page: usize) -> usize {
        self.mapping.addr() + page * PAGE_SIZE
    }

    /// Wakes threads blocked on faults in `page`.
    pub(crate) fn wake(&self, page: usize) {
        if let Err(e) = self.uffd.wake(self.addr_of(page), PAGE_SIZE) {
            fatal(&format!("waking faulting threads on page {page}: {e}"));
        }
    }

    /// Installs `data` (one page of memory outside every registered range) as `page`, which the
    /// caller owns, and wakes the threads waiting on it. Write-protected unless `writable`.
    pub(crate) fn install(&self, page: usize, data: &[u8], writable: bool) {
        assert_eq!(data.len(), PAGE_SIZE, "a page install takes one page");
        // SAFETY: `data` is one page of handler-owned memory (a receive buffer, a slot of the
        // far arena, a staging buffer or the static zero page), never registered with any
        // userfaultfd; the destination is an aligned page of this region's registered range.
        let r = unsafe {
            self.uffd.copy(
                self.addr_of(page),
                data.as_ptr(),
                PAGE_SIZE,
                !writable,
                true,
            )
        };
        self.outcome(page, r);
    }

    /// Serves a page's first touch without the network: a read maps the shared zero page (no
    /// memory used until written); a write gets a private zeroed page at once, which saves the
    /// copy-on-write fault that would follow the zero page.
    pub(crate) fn install_zero(&self, page: usize, write: bool) {
        if write || self.zero_reads_private {
            self.install(page, &ZEROS[..PAGE_SIZE], true);
        } else {
            let r = self.uffd.zeropage(self.addr_of(page), PAGE_SIZE, true);
            self.outcome(page, r);
        }
    }

    /// Zero-fills `count` consecutive pages from `first` (owned by the caller) writable in one
    /// `UFFDIO_COPY`, and wakes the threads waiting on any of them.
    pub(crate) fn install_zero_run(&self, first: usize, count: usize) {
        assert!(
            (1..=MAX_ZERO_RUN).contains(&count),
            "zero run of {count} pages"
        );
        // SAFETY: ZEROS is static memory outside every registered range, at least `count` pages
        // long; the destination run lies inside the region's registered range.
        let r = unsafe {
            self.uffd.copy(
                self.addr_of(first),
                ZEROS.as_ptr(),
                count * PAGE_SIZE,
                false,
                true,
            )
        };
        self.outcome(first, r);
    }

    /// Installs `data` as `page` unless the page is mapped already; returns whether it did.
    /// For a page the table calls resident but that may have been dropped by the kernel.
    pub(crate) fn reinstall(&self, page: usize, data: &[u8], writable: bool) -> bool {
        assert_eq!(data.len(), PAGE_SIZE, "a page install takes one page");
        // SAFETY: as in `install`.
        let r = unsafe {
            self.uffd.copy(
                self.addr_of(page),
                data.as_ptr(),
                PAGE_SIZE,
                !writable,
                true,
            )
        };
        match r {
            Ok(Installed::Done) => true,
            Ok(Installed::AlreadyPresent) => {
                self.wake(page);
                false
            }
            Err(e) => fatal(&format!("installing page {page} failed: {e}")),
        }
    }

    /// Whether `page` is mapped (present in memory, or swapped out by the kernel).
    pub(crate) fn is_mapped(&self, page: usize) -> bool {
        let mut v = 0u8;
        // SAFETY: mincore reads the page table for one page of our own mapping and writes one
        // byte into `v`.
        let r =
            unsafe { libc::mincore(self.addr_of(page) as *mut libc::c_void, PAGE_SIZE, &mut v) };
        r != 0 || v & 1 != 0
    }

    fn outcome(&self, page: usize, r: Result<Installed, gleaner_uffd::UffdError>) {
        match r {
            Ok(Installed::Done) => {}
            // The caller owns the page, so nothing else installs it; a present page here means
            // the program itself populated it behind the pager's back. Keep what is there.
            Ok(Installed::AlreadyPresent) => {
                log::warn!("page {page} was already present at install; kept");
                self.wake(page);
            }
            Err(e) => fatal(&format!("installing page {page} failed: {e}")),
        }
    }
}
