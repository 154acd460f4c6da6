//! `gleaner bench wakeup`'s `in-thread-sigbus` configuration: a userfaultfd opened with
//! `UFFD_FEATURE_SIGBUS` queues no message for a fault on a missing page; the kernel raises
//! SIGBUS in the faulting thread instead, and that thread installs the page itself, with
//! `UFFDIO_COPY` in its signal handler. No handler thread is woken, so no context switch.
//!
//! The price is what the kernel's own accesses to a missing page get under that feature: not a
//! wait for a handler but `EFAULT`. [`probe_kernel_accesses`] shows it with two system calls
//! every program makes, `read(2)` into a buffer and `futex(2)` on a lock word, each on a page no
//! one has touched.
//!
//! The handler is process-wide; [`SigbusServer`] installs it and puts the previous disposition
//! back when dropped.

use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};

use gleaner_pager::PAGE_SIZE;
use gleaner_uffd::sys;
use serde::Serialize;

/// The region the handler serves (`LEN` 0: none), the userfaultfd, and the page it copies from.
static BASE: AtomicUsize = AtomicUsize::new(0);
static LEN: AtomicUsize = AtomicUsize::new(0);
static UFFD: AtomicI32 = AtomicI32::new(-1);
static SRC: AtomicUsize = AtomicUsize::new(0);
/// Pages the handler installed.
static SERVED: AtomicU64 = AtomicU64::new(0);

/// The SIGBUS handler, installed for one configuration's run.
pub(super) struct SigbusServer {
    previous: libc::sigaction,
}

impl SigbusServer {
    /// Serves faults in `[base, base + len)`, registered on `uffd_fd` (opened with the SIGBUS
    /// feature), by copying `src` (one page that lives, unregistered, until this is dropped).
    pub(super) fn install(
        uffd_fd: i32,
        base: usize,
        len: usize,
        src: &[u8],
    ) -> Result<SigbusServer, String> {
        assert_eq!(src.len(), PAGE_SIZE, "the source is one page");
        UFFD.store(uffd_fd, Ordering::SeqCst);
        SRC.store(src.as_ptr() as usize, Ordering::SeqCst);
        BASE.store(base, Ordering::SeqCst);
        LEN.store(len, Ordering::SeqCst);
        SERVED.store(0, Ordering::SeqCst);
        // SAFETY: sigaction is plain data, for which all zeroes is a valid value.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            on_sigbus;
        action.sa_sigaction = handler as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO;
        // SAFETY: sigemptyset initialises the mask inside the live `action`.
        unsafe { libc::sigemptyset(&mut action.sa_mask) };
        // SAFETY: as above, all zeroes is a valid sigaction; the kernel fills it in.
        let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: installs a handler that only touches the statics set above and async-signal-
        // safe calls; both structs live across the call.
        if unsafe { libc::sigaction(libc::SIGBUS, &action, &mut previous) } != 0 {
            LEN.store(0, Ordering::SeqCst);
            return Err(format!(
                "sigaction(SIGBUS): {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(SigbusServer { previous })
    }

    /// Pages the handler installed so far.
    pub(super) fn served(&self) -> u64 {
        SERVED.load(Ordering::SeqCst)
    }
}

impl Drop for SigbusServer {
    fn drop(&mut self) {
        // SAFETY: restores the disposition saved by `install`, from a struct that lives across
        // the call.
        unsafe { libc::sigaction(libc::SIGBUS, &self.previous, std::ptr::null_mut()) };
        LEN.store(0, Ordering::SeqCst);
    }
}

/// The SIGBUS handler: installs the faulting page, or, for an address outside the region (a
/// real bus error), restores the default action so that the retried access kills the process.
extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler; errno is this thread's.
    let (addr, errno) = unsafe { ((*info).si_addr() as usize, *libc::__errno_location()) };
    let (base, len) = (BASE.load(Ordering::Relaxed), LEN.load(Ordering::Relaxed));
    if addr < base || addr >= base + len {
        // SAFETY: resetting SIGBUS to its default action is async-signal-safe.
        unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
        return;
    }
    let page = addr & !(PAGE_SIZE - 1);
    loop {
        let mut copy = sys::UffdioCopy {
            dst: page as u64,
            src: SRC.load(Ordering::Relaxed) as u64,
            len: PAGE_SIZE as u64,
            mode: 0,
            copy: 0,
        };
        // SAFETY: UFFDIO_COPY on the registered descriptor with a live argument struct; the
        // source is one unregistered page that outlives the handler's installation, and the
        // destination a page-aligned address inside the registered region.
        let r = unsafe { libc::ioctl(UFFD.load(Ordering::Relaxed), sys::UFFDIO_COPY, &mut copy) };
        // SAFETY: errno is this thread's.
        let err = unsafe { *libc::__errno_location() };
        if r == 0 {
            SERVED.fetch_add(1, Ordering::Relaxed);
            break;
        }
        if err == libc::EEXIST {
            break;
        }
        if err != libc::EAGAIN {
            let msg = b"gleaner bench wakeup: UFFDIO_COPY in the SIGBUS handler failed\n";
            // SAFETY: write(2) and _exit(2) are async-signal-safe; the message is a live slice.
            unsafe {
                libc::write(2, msg.as_ptr().cast(), msg.len());
                libc::_exit(1);
            }
        }
    }
    // SAFETY: as above; a signal handler must leave errno as it found it.
    unsafe { *libc::__errno_location() = errno };
}

/// What two system calls got when they touched a missing page of a region served in-thread.
#[derive(Serialize, Debug, Clone)]
pub(super) struct KernelAccesses {
    /// `read(2)` of one byte from a pipe into the page.
    pub read_into_missing_page: String,
    /// `futex(FUTEX_WAIT_PRIVATE, 0)` with a 1 ms timeout on the page's first word (a present
    /// page holding 0 would time out).
    pub futex_wait_on_missing_page: String,
}

/// Touches `page` (page-aligned, inside the region, never touched) from inside the kernel only.
pub(super) fn probe_kernel_accesses(page: usize) -> Result<KernelAccesses, String> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills the live two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe2: {}", std::io::Error::last_os_error()));
    }
    let outcome = |r: isize| {
        if r < 0 {
            let e = std::io::Error::last_os_error();
            let name = if e.raw_os_error() == Some(libc::EFAULT) {
                "EFAULT"
            } else {
                "error"
            };
            format!("{name} ({e})")
        } else {
            format!("returned {r}")
        }
    };
    // SAFETY: writes one byte from a live array to the pipe just created.
    let wrote = unsafe { libc::write(fds[1], b"x".as_ptr().cast(), 1) };
    let read = if wrote == 1 {
        // SAFETY: the kernel copies at most one byte to `page`, inside the live mapping; a
        // missing page there fails the copy (EFAULT) rather than faulting this thread.
        outcome(unsafe { libc::read(fds[0], page as *mut libc::c_void, 1) })
    } else {
        format!("not run: write to the pipe: {}", outcome(wrote))
    };
    // SAFETY: closes the two descriptors pipe2 returned.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    let timeout = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1_000_000,
    };
    // SAFETY: FUTEX_WAIT reads the aligned u32 at `page` from inside the kernel and sleeps at
    // most the live timeout; it writes nothing.
    let futex = unsafe {
        libc::syscall(
            libc::SYS_futex,
            page as *const u32,
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            0u32,
            &timeout as *const libc::timespec,
        )
    };
    Ok(KernelAccesses {
        read_into_missing_page: read,
        futex_wait_on_missing_page: outcome(futex as isize),
    })
}
