//! The reserve's address window: one range the reserve carves its heap steps and pool chunks
//! from, so that `free` recognises the reserve's blocks by address alone.
//!
//! Far memory off, the window is its own private anonymous mapping (`MAP_NORESERVE`: address
//! space only until the management thread pre-faults a piece). Far memory on, it is carved from
//! the managed arena, so every page the reserve pre-faults is a page of the budget.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use gleaner_pager::PAGE_SIZE;

use crate::lock::SpinLock;

/// `madvise` advice that faults a range in writable (Linux 5.14+), not in every libc release.
const MADV_POPULATE_WRITE: i32 = 23;

static BASE: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);

/// Whether `addr` lies in the reserve's window.
pub(crate) fn contains(addr: usize) -> bool {
    addr >= BASE.load(Ordering::Acquire) && addr < END.load(Ordering::Acquire)
}

/// The window and its free page ranges (first fit; freed ranges merge with their neighbours).
pub(crate) struct Window {
    /// Whether the window lies in managed memory (a pager serves its faults).
    far: bool,
    free: SpinLock<BTreeMap<usize, usize>>,
}

impl Window {
    /// A window of `len` bytes: mapped for itself, or (`far`) carved from the managed arena.
    pub(crate) fn new(len: usize, far: bool) -> Result<Window, String> {
        let len = len / PAGE_SIZE * PAGE_SIZE;
        let base = if far {
            let a = crate::arena::get().ok_or("no managed arena")?;
            a.carve(len)
                .ok_or_else(|| "the managed arena has no room for the reserve".to_string())?
        } else {
            // SAFETY: a fresh private anonymous mapping at an address of the kernel's choice.
            let p = unsafe {
                crate::real::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(format!(
                    "reserving {} MiB of address space for the reserve: {}",
                    len >> 20,
                    std::io::Error::last_os_error()
                ));
            }
            p as usize
        };
        let mut free = BTreeMap::new();
        free.insert(base, len);
        BASE.store(base, Ordering::Release);
        END.store(base + len, Ordering::Release);
        Ok(Window {
            far,
            free: SpinLock::new(free),
        })
    }

    /// Whether the window is managed memory.
    pub(crate) fn far(&self) -> bool {
        self.far
    }

    /// Takes `len` bytes (a multiple of the page size), first fit. None when the window is full.
    pub(crate) fn take(&self, len: usize) -> Option<usize> {
        self.free.with(|free| first_fit(free, len))
    }

    /// [`take`](Self::take) for a request: `Err(())` if the lock stayed held through a brief
    /// spin (the request goes elsewhere rather than wait).
    #[allow(clippy::result_unit_err)]
    pub(crate) fn try_take(&self, len: usize) -> Result<Option<usize>, ()> {
        self.free.try_with(|free| first_fit(free, len)).ok_or(())
    }

    /// Gives `[start, start+len)` back: its memory is released (the pages go back to the system,
    /// or to the pager) and the range is free for later steps and chunks.
    pub(crate) fn give(&self, start: usize, len: usize) {
        self.release(start, len);
        self.free.with(|free| {
            let (mut start, mut len) = (start, len);
            if let Some((&s, &n)) = free.range(..start).next_back() {
                if s + n == start {
                    free.remove(&s);
                    start = s;
                    len += n;
                }
            }
            if let Some(n) = free.remove(&(start + len)) {
                len += n;
            }
            free.insert(start, len);
        });
    }

    /// Takes the window's lock before `fork`.
    pub(crate) fn lock(&self) {
        self.free.lock();
    }

    /// Releases it after `fork`.
    ///
    /// # Safety
    /// Only after [`lock`](Self::lock).
    pub(crate) unsafe fn unlock(&self) {
        // SAFETY: forwarded contract.
        unsafe { self.free.unlock() }
    }

    /// Drops the memory behind `[start, start+len)`; the range reads as zeros afterwards.
    fn release(&self, start: usize, len: usize) {
        if self.far {
            if let Some(a) = crate::arena::get() {
                a.discard(start, len);
            }
            return;
        }
        // SAFETY: the range is the reserve's own, inside its private anonymous window, and no
        // block handed out lies in it (the caller gives back only unused steps and chunks).
        unsafe {
            libc::munlock(start as *const libc::c_void, len);
            crate::real::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED);
        }
    }
}

/// Takes `len` bytes from the free ranges, first fit.
fn first_fit(free: &mut BTreeMap<usize, usize>, len: usize) -> Option<usize> {
    let (&start, &have) = free.iter().find(|(_, &n)| n >= len)?;
    free.remove(&start);
    if have > len {
        free.insert(start + len, have - len);
    }
    Some(start)
}

/// Pre-faults `[start, start+len)` writable, so that the program's first touch finds its pages
/// present: `MADV_POPULATE_WRITE`, or on a kernel without it a write to each page (the range is
/// fresh, so writing a zero changes nothing). `Err(errno)` if the kernel refused (`ENOMEM`: the
/// memory cgroup's reclaim did not make room in time; the caller gives the range back).
pub(crate) fn populate(start: usize, len: usize) -> Result<(), i32> {
    // SAFETY: the range is the reserve's, not yet handed out; populating changes no contents.
    let r = unsafe { crate::real::madvise(start as *mut libc::c_void, len, MADV_POPULATE_WRITE) };
    if r == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    if err == libc::EINVAL {
        for page in (start..start + len).step_by(PAGE_SIZE) {
            // SAFETY: a page of the fresh range, which reads as zeros: writing zero keeps it so.
            unsafe { std::ptr::write_volatile(page as *mut u8, 0) };
        }
        return Ok(());
    }
    Err(err)
}
