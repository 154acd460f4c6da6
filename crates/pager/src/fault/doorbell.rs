//! Stopping fault handlers that block in `read` on the userfaultfd.
//!
//! Where the kernel lets a single read ask not to block (`preadv2` with `RWF_NOWAIT`, see
//! [`Uffd::nowait_reads`]), the region's userfaultfd is made blocking and each handler waits for
//! its next message inside `read` itself: one system call a fault instead of `poll` and then `read`
//! (a little faster per fault with one handler on the faulting CPU: `gleaner bench wakeup`'s
//! `read-same` against `block-same`, in `docs/BENCHMARKS.md`, "What a userfaultfd fault costs:
//! handler placement"). A blocked `read` wakes for nothing but a message, so a stop flag or an
//! eventfd cannot end it.
//! The doorbell can: a mapping of one page per handler, registered on the same userfaultfd
//! for missing faults only. Stopping touches its pages one after another; each touch is a
//! fault message that one handler reads, answers with a zero page (which lets the toucher go on)
//! and then exits. Handlers exit only that way, so the number of touches is the number of
//! handlers. The pages are kept from fork children (`MADV_DONTFORK`).

use gleaner_uffd::{Event, Installed, Uffd};

use crate::PAGE_SIZE;

/// One page per handler, registered on the region's userfaultfd.
pub(crate) struct Doorbell {
    base: usize,
    pages: usize,
}

impl Doorbell {
    /// A doorbell of `pages` pages (one per handler) on `uffd`.
    pub(crate) fn new(uffd: &Uffd, pages: usize) -> std::io::Result<Doorbell> {
        let pages = pages.max(1);
        let len = pages * PAGE_SIZE;
        // SAFETY: a fresh private anonymous mapping; the kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let bell = Doorbell {
            base: p as usize,
            pages,
        };
        // SAFETY: madvise on the mapping just made, which this struct owns.
        if unsafe { libc::madvise(p, len, libc::MADV_DONTFORK) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        uffd.register(bell.base, len, false)
            .map_err(std::io::Error::other)?;
        Ok(bell)
    }

    /// Takes the touch of the doorbell out of `events`, if one is there: its address.
    pub(crate) fn take_ring(&self, events: &mut Vec<Event>) -> Option<usize> {
        let rang = |addr: usize| addr >= self.base && addr < self.base + self.pages * PAGE_SIZE;
        let at = events
            .iter()
            .position(|ev| matches!(ev, Event::Fault { addr, .. } if rang(*addr)))?;
        match events.remove(at) {
            Event::Fault { addr, .. } => Some(addr),
            _ => unreachable!("the position of a fault"),
        }
    }

    /// Answers a touch of the doorbell at `addr`: a zero page, which wakes the toucher.
    pub(crate) fn answer(&self, uffd: &Uffd, addr: usize) {
        let page = addr & !(PAGE_SIZE - 1);
        // A failure leaves the toucher waiting for ever: say so loudly rather than hang quietly.
        let answered = uffd
            .zeropage(page, PAGE_SIZE, true)
            .and_then(|installed| match installed {
                Installed::Done => Ok(()),
                // Present already (never: each page is touched once): wake the toucher.
                Installed::AlreadyPresent => uffd.wake(page, PAGE_SIZE),
            });
        if let Err(e) = answered {
            crate::fatal::fatal(&format!(
                "answering a stopping fault handler's doorbell: {e}"
            ));
        }
    }

    /// Touches every page in turn, each once a handler has answered the last: stops every
    /// handler. Call once, after the stop flag is set; never from a handler.
    pub(crate) fn ring(&self) {
        for i in 0..self.pages {
            // SAFETY: a page of our own live mapping, readable; the read waits until a handler
            // installs the page (a zero page), and nothing else writes it.
            unsafe { std::ptr::read_volatile((self.base + i * PAGE_SIZE) as *const u8) };
        }
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping this struct made and owns; nothing refers to it after.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.pages * PAGE_SIZE) };
    }
}
