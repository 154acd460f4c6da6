//! A thin, safe wrapper over Linux `userfaultfd`: creation (syscall, `/dev/userfaultfd`, or the
//! user-mode-only fallback), feature negotiation, registration, the resolution ioctls
//! (copy, zeropage, wake, write-protect, move) and event decoding. No policy lives here.
//!
//! Every `unsafe` block in this crate is an `ioctl`, `read` or `syscall` on the owned descriptor
//! with a `#[repr(C)]` argument that lives across the call; none dereferences user memory itself.
#![deny(missing_docs)]

pub mod pagemap;
pub mod sys;

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

/// Optional kernel features, as reported and requested through `UFFDIO_API`.
pub mod features {
    /// Write-protect faults are reported (`UFFD_FEATURE_PAGEFAULT_FLAG_WP`).
    pub const PAGEFAULT_FLAG_WP: u64 = 1 << 0;
    /// `fork` events carry the child's new descriptor.
    pub const EVENT_FORK: u64 = 1 << 1;
    /// `mremap` events.
    pub const EVENT_REMAP: u64 = 1 << 2;
    /// `madvise(DONTNEED/REMOVE)` events.
    pub const EVENT_REMOVE: u64 = 1 << 3;
    /// `munmap` events.
    pub const EVENT_UNMAP: u64 = 1 << 6;
    /// Faults raise SIGBUS instead of being queued.
    pub const SIGBUS: u64 = 1 << 7;
    /// Fault messages carry the faulting thread id.
    pub const THREAD_ID: u64 = 1 << 8;
    /// Never-populated pages can be write-protected (6.4+).
    pub const WP_UNPOPULATED: u64 = 1 << 13;
    /// `UFFDIO_POISON` (6.6+).
    pub const POISON: u64 = 1 << 14;
    /// The kernel resolves write-protect faults itself; dirty pages are found with PAGEMAP_SCAN (6.7+).
    pub const WP_ASYNC: u64 = 1 << 15;
    /// `UFFDIO_MOVE` (6.8+).
    pub const MOVE: u64 = 1 << 16;
}

/// Why a userfaultfd could not be obtained or used.
#[derive(Debug, thiserror::Error)]
pub enum UffdError {
    /// Neither the syscall nor `/dev/userfaultfd` gave a descriptor that handles kernel-mode faults.
    #[error(
        "userfaultfd is not permitted for this process (full mode needs one of: run as root or \
         with CAP_SYS_PTRACE; give this user read/write access to /dev/userfaultfd, e.g. \
         `chmod 0666 /dev/userfaultfd` or a udev rule; or `sysctl -w vm.unprivileged_userfaultfd=1`). \
         User-mode-only descriptors {user_mode}."
    )]
    NotPermitted {
        /// Whether a user-mode-only descriptor would have been available.
        user_mode: &'static str,
    },
    /// The kernel lacks userfaultfd entirely.
    #[error("this kernel does not support userfaultfd (CONFIG_USERFAULTFD is off)")]
    Unsupported,
    /// A required feature is missing from this kernel.
    #[error("this kernel's userfaultfd lacks {0}")]
    MissingFeature(&'static str),
    /// An ioctl or syscall failed.
    #[error("{op} failed: {source}")]
    Os {
        /// Which operation.
        op: &'static str,
        /// The errno.
        source: io::Error,
    },
}

fn os(op: &'static str) -> UffdError {
    UffdError::Os {
        op,
        source: io::Error::last_os_error(),
    }
}

/// Whether kernel-mode accesses (e.g. `read(2)` into a registered buffer) are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Kernel-mode faults wait for the handler like user faults.
    Full,
    /// `UFFD_USER_MODE_ONLY`: kernel-mode faults on missing pages fail with `EFAULT`.
    UserOnly,
}

/// How the descriptor was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The `userfaultfd(2)` syscall.
    Syscall,
    /// `ioctl(USERFAULTFD_IOC_NEW)` on `/dev/userfaultfd`.
    DevNode,
}

/// Options for [`Uffd::open`].
#[derive(Debug, Clone, Copy, Default)]
pub struct UffdOptions {
    /// Features to enable (see [`features`]); those the kernel lacks make `open` fail.
    pub features: u64,
    /// Accept a user-mode-only descriptor when nothing better is permitted.
    pub allow_user_mode_only: bool,
}

/// What kind of fault a page-fault message reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// A missing page was read.
    MissingRead,
    /// A missing page was written.
    MissingWrite,
    /// A write-protected page was written.
    WriteProtect,
    /// A minor fault (page in the page cache but unmapped).
    Minor,
}

/// One decoded userfaultfd message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A page fault.
    Fault {
        /// What kind of fault.
        kind: FaultKind,
        /// The faulting address (page-aligned unless EXACT_ADDRESS was requested).
        addr: usize,
        /// The faulting thread, when THREAD_ID is enabled (else 0).
        tid: u32,
    },
    /// The process forked; `fd` is the child's userfaultfd, now owned by the reader.
    Fork {
        /// The child's descriptor.
        fd: RawFd,
    },
    /// A registered range moved (`mremap`).
    Remap {
        /// Old start.
        from: usize,
        /// New start.
        to: usize,
        /// Length.
        len: usize,
    },
    /// `madvise(MADV_DONTNEED/MADV_REMOVE)` on `[start, end)`.
    Remove {
        /// Start.
        start: usize,
        /// End (exclusive).
        end: usize,
    },
    /// `munmap` of `[start, end)`.
    Unmap {
        /// Start.
        start: usize,
        /// End (exclusive).
        end: usize,
    },
    /// An event this build does not know.
    Unknown(u8),
}

impl Event {
    fn decode(m: &sys::UffdMsg) -> Event {
        let a = m.arg;
        match m.event {
            sys::UFFD_EVENT_PAGEFAULT => {
                let flags = a[0];
                let kind = if flags & sys::UFFD_PAGEFAULT_FLAG_WP != 0 {
                    FaultKind::WriteProtect
                } else if flags & sys::UFFD_PAGEFAULT_FLAG_MINOR != 0 {
                    FaultKind::Minor
                } else if flags & sys::UFFD_PAGEFAULT_FLAG_WRITE != 0 {
                    FaultKind::MissingWrite
                } else {
                    FaultKind::MissingRead
                };
                Event::Fault {
                    kind,
                    addr: a[1] as usize,
                    tid: a[2] as u32,
                }
            }
            sys::UFFD_EVENT_FORK => Event::Fork {
                fd: a[0] as u32 as RawFd,
            },
            sys::UFFD_EVENT_REMAP => Event::Remap {
                from: a[0] as usize,
                to: a[1] as usize,
                len: a[2] as usize,
            },
            sys::UFFD_EVENT_REMOVE => Event::Remove {
                start: a[0] as usize,
                end: a[1] as usize,
            },
            sys::UFFD_EVENT_UNMAP => Event::Unmap {
                start: a[0] as usize,
                end: a[1] as usize,
            },
            other => Event::Unknown(other),
        }
    }
}

/// Outcome of a page-installing ioctl.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    /// The pages were installed (and waiters woken unless DONTWAKE).
    Done,
    /// Something else installed the page first (`EEXIST`); the caller should wake waiters.
    AlreadyPresent,
}

/// An open userfaultfd descriptor with its negotiated features.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    features: u64,
    mode: Mode,
    source: Source,
    /// Whether a read can be told not to block (see [`Uffd::nowait_reads`]).
    nowait: bool,
}

/// `/dev/userfaultfd`, opened while the process could and kept, so that it and its fork
/// children can still make userfaultfds after the program drops its privileges
/// ([`keep_device_for_later`]); -1 when not kept.
static KEPT_DEVICE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// Opens `/dev/userfaultfd` and keeps it, once, in a process running as root. A server started
/// as root that drops its privileges (`setuid`) keeps the userfaultfd it has, but a fork child
/// it makes afterwards needs one of its own, and the system call refuses an unprivileged
/// process that (`vm.unprivileged_userfaultfd=0`): the child was stopped (exit 86). The device
/// checks who may use it when it is opened, so a descriptor opened as root still makes
/// userfaultfds after the drop. The process already holds a userfaultfd that handles kernel
/// faults, so this grants it nothing new.
fn keep_device_for_later() {
    use std::sync::atomic::Ordering;
    // SAFETY: geteuid has no preconditions.
    if KEPT_DEVICE.load(Ordering::Acquire) >= 0 || unsafe { libc::geteuid() } != 0 {
        return;
    }
    if let Ok(fd) = gleaner_fds::make_held(|| open_device().map(OwnedFd::from)) {
        let raw = fd.as_raw_fd();
        if KEPT_DEVICE
            .compare_exchange(-1, raw, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            // Kept for the life of the process (and inherited by its fork children).
            std::mem::forget(fd);
        }
    }
}

/// Opens the device node `/dev/userfaultfd` (6.1+), whose file mode governs access.
fn open_device() -> io::Result<std::fs::File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/userfaultfd")
}

/// A new userfaultfd made through the open device descriptor `dev`.
fn from_device(dev: BorrowedFd<'_>, flags: libc::c_int) -> Option<OwnedFd> {
    // SAFETY: USERFAULTFD_IOC_NEW takes the open flags by value and returns a new descriptor;
    // `dev` is live for the call.
    let fd = unsafe { libc::ioctl(dev.as_raw_fd(), sys::USERFAULTFD_IOC_NEW as _, flags) };
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A new userfaultfd from the kept `/dev/userfaultfd` ([`keep_device_for_later`]), if any.
fn from_kept_device(flags: libc::c_int) -> Option<OwnedFd> {
    let dev = KEPT_DEVICE.load(std::sync::atomic::Ordering::Acquire);
    // SAFETY: the kept device descriptor is never closed.
    (dev >= 0).then(|| from_device(unsafe { BorrowedFd::borrow_raw(dev) }, flags))?
}

/// Opens a raw descriptor (no API handshake yet). Returns where it came from and its mode.
fn create_raw(allow_user_mode_only: bool) -> Result<(OwnedFd, Source, Mode), UffdError> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    // SAFETY: userfaultfd(2) takes an int flags argument and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd >= 0 {
        keep_device_for_later();
        // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
        return Ok((
            unsafe { OwnedFd::from_raw_fd(fd as RawFd) },
            Source::Syscall,
            Mode::Full,
        ));
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::ENOSYS) => return Err(UffdError::Unsupported),
        Some(libc::EPERM) | Some(libc::EACCES) => {}
        _ => {
            return Err(UffdError::Os {
                op: "userfaultfd(2)",
                source: err,
            })
        }
    }
    // Not permitted through the syscall: the device kept from before a privilege drop, then the
    // device node (6.1+), whose file mode governs access.
    if let Some(fd) = from_kept_device(flags) {
        return Ok((fd, Source::DevNode, Mode::Full));
    }
    if let Some(fd) = open_device()
        .ok()
        .and_then(|dev| from_device(dev.as_fd(), flags))
    {
        return Ok((fd, Source::DevNode, Mode::Full));
    }
    // SAFETY: as above, with UFFD_USER_MODE_ONLY added to the flags.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags | sys::UFFD_USER_MODE_ONLY) };
    if fd < 0 {
        return Err(UffdError::NotPermitted {
            user_mode: "are not available either",
        });
    }
    // SAFETY: the kernel just returned this descriptor to us.
    let owned = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    if allow_user_mode_only {
        Ok((owned, Source::Syscall, Mode::UserOnly))
    } else {
        Err(UffdError::NotPermitted {
            user_mode: "are available but were not allowed (kernel-mode accesses such as read(2) \
                        into far memory would fail with EFAULT)",
        })
    }
}

fn first_missing(missing: u64) -> Option<&'static str> {
    const NAMES: [(u64, &str); 8] = [
        (
            features::PAGEFAULT_FLAG_WP,
            "write-protect faults (UFFD_FEATURE_PAGEFAULT_FLAG_WP, 5.7+)",
        ),
        (
            features::EVENT_FORK,
            "fork events (UFFD_FEATURE_EVENT_FORK)",
        ),
        (
            features::EVENT_REMAP,
            "mremap events (UFFD_FEATURE_EVENT_REMAP)",
        ),
        (
            features::EVENT_REMOVE,
            "madvise events (UFFD_FEATURE_EVENT_REMOVE)",
        ),
        (
            features::EVENT_UNMAP,
            "munmap events (UFFD_FEATURE_EVENT_UNMAP)",
        ),
        (features::THREAD_ID, "thread ids (UFFD_FEATURE_THREAD_ID)"),
        (
            features::WP_ASYNC,
            "asynchronous write-protect (UFFD_FEATURE_WP_ASYNC, 6.7+)",
        ),
        (features::MOVE, "UFFDIO_MOVE (6.8+)"),
    ];
    if missing == 0 {
        return None;
    }
    Some(
        NAMES
            .iter()
            .find(|(bit, _)| missing & bit != 0)
            .map_or("a requested feature", |(_, n)| n),
    )
}

fn api(fd: BorrowedFd<'_>, features: u64) -> Result<u64, UffdError> {
    let mut a = sys::UffdioApi {
        api: sys::UFFD_API,
        features,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes a UffdioApi that lives across the call.
    if unsafe { libc::ioctl(fd.as_raw_fd(), sys::UFFDIO_API as _, &mut a) } < 0 {
        return Err(os("UFFDIO_API"));
    }
    Ok(a.features)
}

impl Uffd {
    /// Features this kernel offers (probed on a throwaway descriptor).
    pub fn available_features(allow_user_mode_only: bool) -> Result<u64, UffdError> {
        // Open only for the probe, and closed inside the window (dropped before it).
        let _making = gleaner_fds::making();
        let (fd, _, _) = create_raw(allow_user_mode_only)?;
        api(fd.as_fd(), 0)
    }

    /// Creates a descriptor with `opts.features` enabled.
    pub fn open(opts: UffdOptions) -> Result<Uffd, UffdError> {
        let available = Self::available_features(opts.allow_user_mode_only)?;
        if let Some(name) = first_missing(opts.features & !available) {
            return Err(UffdError::MissingFeature(name));
        }
        // Out of the program's way: closing it would unregister the region (`gleaner_fds`).
        let (fd, source, mode) = {
            let _making = gleaner_fds::making();
            let (fd, source, mode) = create_raw(opts.allow_user_mode_only)?;
            (gleaner_fds::adopt(fd), source, mode)
        };
        api(fd.as_fd(), opts.features)?;
        let mut uffd = Uffd {
            fd,
            features: opts.features,
            mode,
            source,
            nowait: false,
        };
        // Nothing is registered yet, so no message can be lost: a kernel that honours
        // RWF_NOWAIT answers "nothing pending", one that does not fails with EOPNOTSUPP.
        uffd.nowait = matches!(uffd.read_into(&mut Vec::new(), 1, libc::RWF_NOWAIT), Ok(0));
        Ok(uffd)
    }

    /// The features enabled on this descriptor.
    pub fn features(&self) -> u64 {
        self.features
    }

    /// Whether kernel-mode faults are served.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Where the descriptor came from.
    pub fn source(&self) -> Source {
        self.source
    }

    /// The raw descriptor, for `poll`.
    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Whether this kernel lets one read ask not to block on a blocking descriptor (`preadv2`
    /// with `RWF_NOWAIT`; the 6.18 kernel's userfaultfd honours it): only then may the
    /// descriptor be made blocking ([`Uffd::set_blocking`]) while some reader still needs to
    /// return at once ([`Uffd::read_events_nowait`]). Probed when the descriptor was opened.
    pub fn nowait_reads(&self) -> bool {
        self.nowait
    }

    /// Makes reads block until a message comes (`true`) or return at once (`false`, as opened).
    /// A blocking read costs a fault one system call less than `poll` and then a read.
    pub fn set_blocking(&self, blocking: bool) -> Result<(), UffdError> {
        let fd = self.fd.as_raw_fd();
        let os = |op| UffdError::Os {
            op,
            source: io::Error::last_os_error(),
        };
        // SAFETY: F_GETFL on our own descriptor.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(os("fcntl(F_GETFL)"));
        }
        let flags = if blocking {
            flags & !libc::O_NONBLOCK
        } else {
            flags | libc::O_NONBLOCK
        };
        // SAFETY: F_SETFL on our own descriptor with its own flags, O_NONBLOCK changed.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
            return Err(os("fcntl(F_SETFL)"));
        }
        Ok(())
    }

    fn ioctl<T>(&self, req: u64, arg: &mut T) -> Result<(), io::Error> {
        loop {
            // SAFETY: every caller passes the #[repr(C)] struct that `req` expects; it lives
            // across the call. The ioctls read and write only that struct (and, for copy/move,
            // memory ranges whose validity the caller documents).
            let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), req as _, arg as *mut T) };
            if r >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
    }

    /// Registers `[start, start+len)` for missing faults and, if `wp`, write-protect faults.
    pub fn register(&self, start: usize, len: usize, wp: bool) -> Result<(), UffdError> {
        let mut r = sys::UffdioRegister {
            range: sys::UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: sys::UFFDIO_REGISTER_MODE_MISSING
                | if wp { sys::UFFDIO_REGISTER_MODE_WP } else { 0 },
            ioctls: 0,
        };
        self.ioctl(sys::UFFDIO_REGISTER, &mut r)
            .map_err(|source| UffdError::Os {
                op: "UFFDIO_REGISTER",
                source,
            })
    }

    /// Unregisters a range.
    pub fn unregister(&self, start: usize, len: usize) -> Result<(), UffdError> {
        let mut r = sys::UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        self.ioctl(sys::UFFDIO_UNREGISTER, &mut r)
            .map_err(|source| UffdError::Os {
                op: "UFFDIO_UNREGISTER",
                source,
            })
    }

    /// Copies `len` bytes from `src` into the registered range at `dst`, installing the pages.
    /// With `write_protect` they are installed write-protected; with `wake` waiters are woken.
    ///
    /// # Safety
    /// `src..src+len` must be readable memory of this process that is *not* registered with any
    /// userfaultfd (reading it must never fault into a handler), and `dst` must be page-aligned
    /// inside a range registered on this descriptor.
    pub unsafe fn copy(
        &self,
        dst: usize,
        src: *const u8,
        len: usize,
        write_protect: bool,
        wake: bool,
    ) -> Result<Installed, UffdError> {
        let mode = if write_protect {
            sys::UFFDIO_COPY_MODE_WP
        } else {
            0
        } | if wake {
            0
        } else {
            sys::UFFDIO_COPY_MODE_DONTWAKE
        };
        let mut done = 0usize;
        loop {
            let mut c = sys::UffdioCopy {
                dst: (dst + done) as u64,
                src: src as u64 + done as u64,
                len: (len - done) as u64,
                mode,
                copy: 0,
            };
            match self.ioctl(sys::UFFDIO_COPY, &mut c) {
                Ok(()) => return Ok(Installed::Done),
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    return Ok(Installed::AlreadyPresent)
                }
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                    // The address space is changing under a pending event; retry the remainder.
                    if c.copy > 0 {
                        done += c.copy as usize;
                    }
                    if done >= len {
                        return Ok(Installed::Done);
                    }
                    std::thread::yield_now();
                }
                Err(source) => {
                    return Err(UffdError::Os {
                        op: "UFFDIO_COPY",
                        source,
                    })
                }
            }
        }
    }

    /// Maps the shared zero page at `[start, start+len)` (a write then takes an ordinary
    /// copy-on-write fault inside the kernel, with no userfaultfd message).
    pub fn zeropage(&self, start: usize, len: usize, wake: bool) -> Result<Installed, UffdError> {
        loop {
            let mut z = sys::UffdioZeropage {
                range: sys::UffdioRange {
                    start: start as u64,
                    len: len as u64,
                },
                mode: if wake {
                    0
                } else {
                    sys::UFFDIO_ZEROPAGE_MODE_DONTWAKE
                },
                zeropage: 0,
            };
            match self.ioctl(sys::UFFDIO_ZEROPAGE, &mut z) {
                Ok(()) => return Ok(Installed::Done),
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    return Ok(Installed::AlreadyPresent)
                }
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => std::thread::yield_now(),
                Err(source) => {
                    return Err(UffdError::Os {
                        op: "UFFDIO_ZEROPAGE",
                        source,
                    })
                }
            }
        }
    }

    /// Wakes threads waiting on faults in `[start, start+len)`.
    pub fn wake(&self, start: usize, len: usize) -> Result<(), UffdError> {
        let mut r = sys::UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        self.ioctl(sys::UFFDIO_WAKE, &mut r)
            .map_err(|source| UffdError::Os {
                op: "UFFDIO_WAKE",
                source,
            })
    }

    /// Sets (`protect`) or clears write protection on `[start, start+len)`. Clearing wakes the
    /// threads blocked on write-protect faults there unless `wake` is false; setting never wakes.
    pub fn write_protect(
        &self,
        start: usize,
        len: usize,
        protect: bool,
        wake: bool,
    ) -> Result<(), UffdError> {
        loop {
            let mut w = sys::UffdioWriteprotect {
                range: sys::UffdioRange {
                    start: start as u64,
                    len: len as u64,
                },
                // The kernel refuses WP together with DONTWAKE (EINVAL); setting protection
                // wakes nobody anyway, so `wake` only matters when lifting it.
                mode: match (protect, wake) {
                    (true, _) => sys::UFFDIO_WRITEPROTECT_MODE_WP,
                    (false, true) => 0,
                    (false, false) => sys::UFFDIO_WRITEPROTECT_MODE_DONTWAKE,
                },
            };
            match self.ioctl(sys::UFFDIO_WRITEPROTECT, &mut w) {
                Ok(()) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => std::thread::yield_now(),
                Err(source) => {
                    return Err(UffdError::Os {
                        op: "UFFDIO_WRITEPROTECT",
                        source,
                    })
                }
            }
        }
    }

    /// Reads pending events into `out` (cleared first); returns how many. On a descriptor made
    /// blocking ([`Uffd::set_blocking`]) it waits for at least one; otherwise an empty result
    /// means nothing was pending. A signal ends the wait with an empty result.
    pub fn read_events(&self, out: &mut Vec<Event>, max: usize) -> Result<usize, UffdError> {
        self.read_into(out, max, 0)
    }

    /// Reads pending events into `out` (cleared first) without blocking, even on a blocking
    /// descriptor; returns how many (0: nothing was pending). Needs [`Uffd::nowait_reads`].
    pub fn read_events_nowait(&self, out: &mut Vec<Event>, max: usize) -> Result<usize, UffdError> {
        self.read_into(out, max, libc::RWF_NOWAIT)
    }

    fn read_into(&self, out: &mut Vec<Event>, max: usize, flags: i32) -> Result<usize, UffdError> {
        out.clear();
        let mut msgs = [sys::UffdMsg::default(); 64];
        let n = max.clamp(1, msgs.len());
        let iov = libc::iovec {
            iov_base: msgs.as_mut_ptr().cast(),
            iov_len: n * std::mem::size_of::<sys::UffdMsg>(),
        };
        // SAFETY: preadv2 (read(2) with flags; offset -1 is the current position) into one
        // iovec over a buffer of `n` UffdMsg that lives across the call; the kernel writes
        // whole 32-byte messages only.
        let r = unsafe { libc::preadv2(self.fd.as_raw_fd(), &iov, 1, -1, flags) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(0),
                _ => Err(UffdError::Os {
                    op: "reading the userfaultfd",
                    source: e,
                }),
            };
        }
        let count = r as usize / std::mem::size_of::<sys::UffdMsg>();
        out.extend(msgs[..count].iter().map(Event::decode));
        Ok(count)
    }
}
