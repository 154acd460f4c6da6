//! A region's memory as the engine handles it: the reserved mapping, the userfaultfd that serves
//! it, and the per-page state table. Everything here is addressing and installing pages; no
//! policy.

use std::time::Instant;

use gleaner_uffd::{Installed, Uffd};

use crate::fatal::fatal;
use crate::fault::state::{PageState, PageTable};
use crate::memory::mapping::Mapping;
use crate::PAGE_SIZE;

/// The most pages zero-filled in one go (a sequential fill's window).
pub(crate) const MAX_ZERO_RUN: usize = 64;

/// The source for zero-filling pages: one, or a run of up to [`MAX_ZERO_RUN`] at once.
static ZEROS: [u8; MAX_ZERO_RUN * PAGE_SIZE] = [0; MAX_ZERO_RUN * PAGE_SIZE];

/// The mapping, its userfaultfd and its page table. A fork child's pager shares the mapping and
/// the table (its copies of them) with the parent's engine it inherited, which it never uses.
pub(crate) struct Memory {
    pub(crate) mapping: std::sync::Arc<Mapping>,
    pub(crate) uffd: Uffd,
    pub(crate) table: std::sync::Arc<PageTable>,
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

    /// Which of the `count` pages from `first` have a page mapped, into `out` (one byte per
    /// page, bit 0 set when mapped): `mincore`, one system call, no fault.
    pub(crate) fn mapped(
        &self,
        first: usize,
        count: usize,
        out: &mut Vec<u8>,
    ) -> std::io::Result<()> {
        out.clear();
        out.resize(count, 0);
        // SAFETY: the range is `count` pages of this region's live mapping, and `out` holds a
        // byte for each of them.
        let rc = unsafe {
            libc::mincore(
                self.addr_of(first) as *mut libc::c_void,
                count * PAGE_SIZE,
                out.as_mut_ptr(),
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Releases `page`, which the caller owns, into `state`, then wakes the threads whose faults
    /// on it were left to the caller meanwhile ([`PageTable::defer_to_owner`]).
    pub(crate) fn release(&self, page: usize, state: PageState) {
        self.table.release(page, state);
        self.wake_deferred(std::iter::once(page));
    }

    /// After the caller released `pages` from a state it owned: wakes the threads whose faults
    /// on them were left to it ([`PageTable::defer_to_owner`]). One fence for all of them.
    pub(crate) fn wake_deferred(&self, pages: impl Iterator<Item = usize>) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        for page in pages {
            if self.table.take_waited(page) {
                self.wake(page);
            }
        }
    }

    /// Installs `data` (one page of memory outside every registered range) as `page`, which the
    /// caller owns, and wakes the threads waiting on it. Write-protected unless `writable`.
    pub(crate) fn install(&self, page: usize, data: &[u8], writable: bool) {
        let r = self.copy_page(page, data, writable);
        self.outcome(page, r);
    }

    /// [`Memory::install`], but the threads waiting on `page` are woken only after the clock is
    /// read, and that reading is returned: the moment the page was mapped. A thread woken on the
    /// handler's own CPU may run at once in its place, and then the clock read after a waking
    /// install counts the program's own time until the handler runs again. The separate wake costs
    /// a system call: handlers time one fault in [`crate::fault::resolve::TIMED_INSTALL_EVERY`] this way.
    pub(crate) fn install_timed(&self, page: usize, data: &[u8], writable: bool) -> Instant {
        let r = self.copy_page_waking(page, data, writable, false);
        let mapped = Instant::now();
        self.outcome(page, r);
        self.wake(page);
        mapped
    }

    /// The `UFFDIO_COPY` (waking) of one page of `data` as `page`.
    fn copy_page(
        &self,
        page: usize,
        data: &[u8],
        writable: bool,
    ) -> Result<Installed, gleaner_uffd::UffdError> {
        self.copy_page_waking(page, data, writable, true)
    }

    /// The `UFFDIO_COPY` of one page of `data` as `page`, waking the threads waiting on it if
    /// `wake`.
    fn copy_page_waking(
        &self,
        page: usize,
        data: &[u8],
        writable: bool,
        wake: bool,
    ) -> Result<Installed, gleaner_uffd::UffdError> {
        assert_eq!(data.len(), PAGE_SIZE, "a page install takes one page");
        // SAFETY: `data` is one page of handler-owned memory (a receive buffer, a slot of the
        // far arena, a staging buffer or the static zero page), never registered with any
        // userfaultfd; the destination is an aligned page of this region's registered range.
        unsafe {
            self.uffd.copy(
                self.addr_of(page),
                data.as_ptr(),
                PAGE_SIZE,
                !writable,
                wake,
            )
        }
    }

    /// Serves a page's first touch without the network: a private zeroed page, writable. (Not
    /// the shared zero page: eviction takes pages through a pipe, which is exact only for pages
    /// the program owns; a write to the zero page would go to a new copy.)
    pub(crate) fn install_zero(&self, page: usize) {
        self.install(page, &ZEROS[..PAGE_SIZE], true);
    }

    /// Zero-fills `page` (owned by the caller) writable if nothing is mapped there, and wakes
    /// the threads waiting on it either way; returns whether it did fill it.
    pub(crate) fn install_zero_if_missing(&self, page: usize) -> bool {
        match self.copy_page(page, &ZEROS[..PAGE_SIZE], true) {
            Ok(Installed::Done) => true,
            Ok(Installed::AlreadyPresent) => {
                self.wake(page);
                false
            }
            r => {
                self.outcome(page, r);
                false
            }
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
        match r {
            Ok(Installed::Done) => {}
            // One UFFDIO_COPY must lie inside one kernel mapping (ENOENT when the run crosses a
            // split the program made, e.g. by mprotect), and it stops at the first page already
            // present (EEXIST). Neither installed the rest of the run: do it page by page.
            _ if count > 1 => (first..first + count).for_each(|p| self.install_zero(p)),
            r => self.outcome(first, r),
        }
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
            Err(gleaner_uffd::UffdError::Os { source, .. })
                if source.raw_os_error() == Some(libc::ENOENT) =>
            {
                fatal(&format!(
                    "installing page {page} failed: the program mapped something else over it \
                 behind gleaner's back (a raw mmap system call with MAP_FIXED inside its \
                 far-memory heap; through the C library's mmap that is handled): {source}"
                ))
            }
            Err(e) => fatal(&format!("installing page {page} failed: {e}")),
        }
    }
}
