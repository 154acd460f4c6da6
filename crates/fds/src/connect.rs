//! Unix-socket connections made inside the program's process, held from the start.
//!
//! `UnixStream::connect` makes the socket and connects it in one call: the socket would sit
//! unrecorded at the lowest free number for as long as the connection takes, and a [`Making`]
//! window around it would make the program's `close` and `dup2` wait for a daemon's accept
//! queue. So the socket is made and adopted in a window of its own, and connected after.
//!
//! [`Making`]: crate::Making

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

/// Connects a Unix stream socket to `path`, the socket held ([`crate::adopt`]) before it
/// connects. Errors as `UnixStream::connect`'s (a path too long for a socket address is
/// `InvalidInput`).
pub fn connect_unix(path: impl AsRef<Path>) -> io::Result<UnixStream> {
    let path = path.as_ref();
    // SAFETY: sockaddr_un is plain old data; all zeros is a valid (empty) value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} cannot be a Unix socket's address (empty, a NUL byte, or over {} bytes)",
                path.display(),
                addr.sun_path.len() - 1
            ),
        ));
    }
    for (dst, &src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = src as libc::c_char;
    }
    let socket = crate::make_held(|| {
        // SAFETY: socket(2) takes integers and returns a new descriptor or -1.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just made `fd`; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    })?;
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    loop {
        // SAFETY: `addr` is a live, initialized sockaddr_un and `len` lies within it.
        let r = unsafe {
            libc::connect(
                socket.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                len as libc::socklen_t,
            )
        };
        if r == 0 {
            return Ok(UnixStream::from(socket));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            // Closed here, whoever the caller is: a program thread's close of a held
            // descriptor would be refused.
            crate::forget(socket.as_raw_fd());
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;

    use super::connect_unix;

    #[test]
    fn a_held_connection_reaches_its_listener_and_bad_paths_are_named() {
        let dir = std::env::temp_dir().join(format!("gleaner-fds-connect-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s");
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut client = connect_unix(&path).unwrap();
        assert!(client.as_raw_fd() >= crate::floor());
        assert!(crate::is_held(client.as_raw_fd()));
        let (mut server, _) = listener.accept().unwrap();
        client.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        server.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
        crate::forget(client.as_raw_fd());
        drop((client, server, listener));
        // (Not the closed listener's path: a test of this binary that forks may hold a copy.)
        let nobody = connect_unix(dir.join("never-bound"));
        std::fs::remove_dir_all(&dir).unwrap();
        let nobody = nobody.expect_err("nothing listens there");
        assert_eq!(nobody.kind(), std::io::ErrorKind::NotFound, "{nobody}");
        let long = "x".repeat(200);
        let e = connect_unix(&long).expect_err("too long");
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("Unix socket"), "{e}");
    }
}
