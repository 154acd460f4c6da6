//! Shared-memory slabs: the page store of sessions whose client runs on this host.
//!
//! A client connected through a Unix socket can ask for a *slab*: a memfd of a given number of
//! pages that the memnode creates, seals against resizing, keeps one reference to, and hands to
//! the client over the socket (`SCM_RIGHTS`). The client maps it and keeps its own index of which
//! page lives in which slot, so fetching a page is a copy out of its own mapping and writing one
//! back is a copy into it: no request reaches the memnode on the data path.
//!
//! The memnode never maps a slab: it only accounts for it. A slab's pages count against the
//! capacity (pages × `PAGE_SIZE` bytes of it, whatever the client writes into them) from the
//! moment it is granted until the session ends (by `Goodbye`, or by its lease
//! running out after the client's last connection closed), when the memnode closes its
//! reference; the memory is freed once the client has unmapped it too. A session can only ever
//! reach the slabs granted to it: there is no request that names a slab.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use gleaner_proto::units::format_size;
use gleaner_proto::PAGE_SIZE;
use rustix::fs::{MemfdFlags, SealFlags};

use crate::store::{Capacity, Released};

/// Most slabs one session may hold (each is a descriptor here and a mapping in the client).
pub(crate) const MAX_SLABS_PER_SESSION: usize = 4096;

/// Most pages one grant may cover (16 GiB).
pub(crate) const MAX_GRANT_PAGES: u64 = 1 << 22;

/// Why a grant was refused.
#[derive(Debug)]
pub(crate) enum GrantError {
    /// Less than one page of capacity left: nothing was granted.
    Full {
        /// Bytes free at the time.
        free: u64,
        /// Total capacity in bytes.
        total: u64,
    },
    /// The request itself is not acceptable (zero pages, too many slabs).
    Refused(String),
    /// The memfd could not be created.
    Os(io::Error),
}

impl std::fmt::Display for GrantError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GrantError::Full { free, total } => write!(
                f,
                "memnode full: no free page for a slab ({free} of {total} bytes free, {} of {})",
                format_size(*free),
                format_size(*total)
            ),
            GrantError::Refused(why) => f.write_str(why),
            GrantError::Os(e) => write!(f, "creating a shared-memory slab failed: {e}"),
        }
    }
}

/// One granted slab.
#[derive(Debug)]
struct Slab {
    pages: u64,
    memfd: OwnedFd,
}

/// A session's slabs.
#[derive(Debug, Default)]
pub(crate) struct Slabs {
    slabs: Vec<Slab>,
}

/// What [`Slabs::usage`] reports.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SlabUsage {
    /// Slabs held.
    pub slabs: u64,
    /// Pages granted in all.
    pub pages: u64,
    /// Bytes of capacity they hold: `pages` × `PAGE_SIZE`.
    pub bytes: u64,
    /// Bytes of memory the slabs really occupy (written and not punched out).
    pub resident_bytes: u64,
}

impl Slabs {
    /// Grants a slab of up to `want` pages (fewer, at least one, when less is free), reserving
    /// pages × `PAGE_SIZE` bytes from `capacity`. Returns the slab's number, its pages, and a new
    /// descriptor for it (to send; this table keeps its own).
    pub(crate) fn grant(
        &mut self,
        want: u64,
        capacity: &Capacity,
    ) -> Result<(u32, u64, OwnedFd), GrantError> {
        if want == 0 || want > MAX_GRANT_PAGES {
            return Err(GrantError::Refused(format!(
                "a slab must be 1 to {MAX_GRANT_PAGES} pages, not {want}"
            )));
        }
        if self.slabs.len() >= MAX_SLABS_PER_SESSION {
            return Err(GrantError::Refused(format!(
                "the session already holds the most slabs allowed ({MAX_SLABS_PER_SESSION})"
            )));
        }
        let pages = loop {
            let free = capacity.free();
            let n = want.min(free / PAGE_SIZE as u64);
            if n == 0 {
                return Err(GrantError::Full {
                    free,
                    total: capacity.total(),
                });
            }
            if capacity.try_reserve(n * PAGE_SIZE as u64).is_ok() {
                break n;
            }
        };
        let made = create_memfd(pages).and_then(|fd| {
            let copy = fd.try_clone()?;
            Ok((fd, copy))
        });
        let (memfd, copy) = match made {
            Ok(fds) => fds,
            Err(e) => {
                capacity.release(pages * PAGE_SIZE as u64);
                return Err(GrantError::Os(e));
            }
        };
        let id = self.slabs.len() as u32;
        self.slabs.push(Slab { pages, memfd });
        Ok((id, pages, copy))
    }

    /// Closes every slab and releases its bytes to `capacity`; returns what was released.
    pub(crate) fn end(&mut self, capacity: &Capacity) -> Released {
        let pages: u64 = self.slabs.iter().map(|s| s.pages).sum();
        self.slabs.clear();
        let bytes = pages * PAGE_SIZE as u64;
        capacity.release(bytes);
        Released { pages, bytes }
    }

    /// Slabs, granted pages and the memory they really occupy.
    pub(crate) fn usage(&self) -> SlabUsage {
        let mut u = SlabUsage::default();
        for s in &self.slabs {
            u.slabs += 1;
            u.pages += s.pages;
            u.bytes += s.pages * PAGE_SIZE as u64;
            if let Ok(st) = rustix::fs::fstat(s.memfd.as_fd()) {
                u.resident_bytes += st.st_blocks as u64 * 512;
            }
        }
        u
    }
}

/// A new memfd of `pages` pages, sealed so that neither side can change its size.
fn create_memfd(pages: u64) -> io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create(
        "gleaner-slab",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    rustix::fs::ftruncate(&fd, pages * PAGE_SIZE as u64)?;
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = PAGE_SIZE as u64;

    #[test]
    fn grants_take_what_is_free_and_end_gives_it_back() {
        // 100 pages and a half: the half page can hold no slab page.
        let cap = Capacity::new(100 * P + P / 2);
        let mut s = Slabs::default();
        let (id, pages, fd) = s.grant(60, &cap).unwrap();
        assert_eq!((id, pages), (0, 60));
        assert_eq!(cap.used(), 60 * P);
        let st = rustix::fs::fstat(&fd).unwrap();
        assert_eq!(st.st_size as u64, 60 * 4096);
        // Sealed: the client cannot grow or shrink it.
        assert!(rustix::fs::ftruncate(&fd, 4096).is_err());
        let (id, pages, _) = s.grant(60, &cap).unwrap();
        assert_eq!((id, pages), (1, 40), "a partial grant of what is left");
        let err = s.grant(1, &cap).unwrap_err();
        assert!(
            matches!(
                err,
                GrantError::Full {
                    free: 2048,
                    total: 411_648
                }
            ),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "memnode full: no free page for a slab (2048 of 411648 bytes free, \
             2.00 KiB of 402.00 KiB)"
        );
        assert!(matches!(
            s.grant(0, &Capacity::new(5 * P)),
            Err(GrantError::Refused(_))
        ));
        assert_eq!(s.usage().slabs, 2);
        assert_eq!(s.usage().pages, 100);
        assert_eq!(s.usage().bytes, 100 * P);
        assert_eq!(
            s.end(&cap),
            Released {
                pages: 100,
                bytes: 100 * P
            }
        );
        assert_eq!(cap.used(), 0);
        assert_eq!(s.usage().slabs, 0);
    }
}
