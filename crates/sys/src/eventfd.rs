//! Eventfds: a counter the kernel keeps, to wake a thread blocked in `poll`.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// A new eventfd at count 0, close-on-exec; non-blocking if `nonblocking`.
pub fn eventfd(nonblocking: bool) -> io::Result<OwnedFd> {
    let flags = libc::EFD_CLOEXEC | if nonblocking { libc::EFD_NONBLOCK } else { 0 };
    // SAFETY: eventfd(2) with an initial count and flags; returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    #[test]
    fn an_eventfd_counts_what_is_written_and_a_nonblocking_one_says_when_empty() {
        let mut f = std::fs::File::from(super::eventfd(true).unwrap());
        f.write_all(&3u64.to_ne_bytes()).unwrap();
        f.write_all(&4u64.to_ne_bytes()).unwrap();
        let mut buf = [0u8; 8];
        f.read_exact(&mut buf).unwrap();
        assert_eq!(u64::from_ne_bytes(buf), 7);
        let e = f.read_exact(&mut buf).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
    }
}
