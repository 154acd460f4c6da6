//! Listening sockets (TCP or Unix) with an accept that another thread can interrupt.
//!
//! `accept(2)` cannot be interrupted portably from another thread, so the listener is
//! non-blocking and the accept loop `poll(2)`s it together with the read end of a socket pair: a
//! [`Waker`] writes one byte to the other end to make the loop return. This is the one place in
//! the crate that needs `unsafe` (the `poll` call).

use std::fs;
use std::io::{self, Write};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gleaner_proto::{Endpoint, Stream};

use crate::error::ServerError;

/// A bound, listening socket.
pub(crate) struct Listener {
    socket: Socket,
    local: Endpoint,
    wake_rx: UnixStream,
    /// For a Unix socket: its path and the (device, inode) we created, so that shutdown removes
    /// our own socket file and never one another process put there since.
    unix_file: Option<(PathBuf, u64, u64)>,
}

enum Socket {
    Tcp(TcpListener),
    Unix(UnixListener),
}

/// Interrupts a [`Listener::accept`] in progress (or the next one) from any thread.
#[derive(Clone)]
pub(crate) struct Waker(Arc<UnixStream>);

impl Waker {
    /// Makes the accept loop return [`Accepted::Woken`]. Never blocks.
    pub(crate) fn wake(&self) {
        // A full socket buffer (WouldBlock) means a wake-up is already pending: nothing to do.
        let _ = (&*self.0).write(&[1]);
    }
}

/// What one call to [`Listener::accept`] produced.
pub(crate) enum Accepted {
    /// A new connection and a label for its peer.
    Conn(Stream, String),
    /// The [`Waker`] was used.
    Woken,
}

impl Listener {
    /// Binds `endpoint`. A TCP port 0 picks a free port. An existing Unix socket file is removed
    /// if nothing accepts connections on it (a stale file from a crashed server); if a server is
    /// live there, this fails with [`ServerError::AddressInUse`].
    pub(crate) fn bind(endpoint: &Endpoint) -> Result<(Listener, Waker), ServerError> {
        let bind_err = |source: io::Error| {
            if source.kind() == io::ErrorKind::AddrInUse {
                ServerError::AddressInUse {
                    endpoint: endpoint.clone(),
                }
            } else {
                ServerError::Bind {
                    endpoint: endpoint.clone(),
                    source,
                }
            }
        };
        let (socket, local, unix_file) = match endpoint {
            Endpoint::Tcp(addr) => {
                let l = TcpListener::bind(addr.as_str()).map_err(bind_err)?;
                let local = Endpoint::Tcp(l.local_addr().map_err(bind_err)?.to_string());
                (Socket::Tcp(l), local, None)
            }
            Endpoint::Unix(path) => {
                remove_stale_socket(endpoint, path)?;
                let l = UnixListener::bind(path).map_err(bind_err)?;
                let meta = fs::symlink_metadata(path).map_err(bind_err)?;
                let file = (path.clone(), meta.dev(), meta.ino());
                (Socket::Unix(l), endpoint.clone(), Some(file))
            }
        };
        match &socket {
            Socket::Tcp(l) => l.set_nonblocking(true),
            Socket::Unix(l) => l.set_nonblocking(true),
        }
        .map_err(bind_err)?;
        let (wake_tx, wake_rx) = UnixStream::pair().map_err(bind_err)?;
        wake_tx.set_nonblocking(true).map_err(bind_err)?;
        let listener = Listener {
            socket,
            local,
            wake_rx,
            unix_file,
        };
        Ok((listener, Waker(Arc::new(wake_tx))))
    }

    /// The address actually bound (the real port when port 0 was asked for).
    pub(crate) fn local_endpoint(&self) -> &Endpoint {
        &self.local
    }

    /// Waits for the next connection or a wake-up. The returned stream is blocking, and TCP
    /// streams have Nagle's algorithm disabled.
    pub(crate) fn accept(&self) -> io::Result<Accepted> {
        loop {
            let (listener_ready, woken) =
                wait_readable(self.socket_fd(), self.wake_rx.as_raw_fd())?;
            if woken {
                return Ok(Accepted::Woken);
            }
            if !listener_ready {
                continue;
            }
            let accepted = match &self.socket {
                Socket::Tcp(l) => l.accept().and_then(|(s, peer)| {
                    s.set_nonblocking(false)?;
                    s.set_nodelay(true)?;
                    Ok((Stream::Tcp(s), peer.to_string()))
                }),
                Socket::Unix(l) => l.accept().and_then(|(s, _)| {
                    s.set_nonblocking(false)?;
                    Ok((Stream::Unix(s), format!("{} peer", self.local)))
                }),
            };
            match accepted {
                Ok((stream, peer)) => return Ok(Accepted::Conn(stream, peer)),
                // The peer gave up between poll and accept, or a signal interrupted us.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::Interrupted
                            | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Removes the Unix socket file if it is still the one this listener created.
    pub(crate) fn remove_socket_file(&self) {
        let Some((path, dev, ino)) = &self.unix_file else {
            return;
        };
        match fs::symlink_metadata(path) {
            Ok(m) if m.dev() == *dev && m.ino() == *ino => match fs::remove_file(path) {
                Ok(()) => log::debug!("removed socket file {}", path.display()),
                Err(e) => log::warn!("cannot remove socket file {}: {e}", path.display()),
            },
            Ok(_) => log::warn!(
                "socket file {} was replaced by someone else; leaving it",
                path.display()
            ),
            Err(_) => {}
        }
    }

    fn socket_fd(&self) -> RawFd {
        match &self.socket {
            Socket::Tcp(l) => l.as_raw_fd(),
            Socket::Unix(l) => l.as_raw_fd(),
        }
    }
}

/// Makes room for a Unix socket at `path`: removes a stale socket file, refuses a live one or a
/// non-socket file.
fn remove_stale_socket(endpoint: &Endpoint, path: &Path) -> Result<(), ServerError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ServerError::Bind {
                endpoint: endpoint.clone(),
                source,
            })
        }
    };
    if !meta.file_type().is_socket() {
        return Err(ServerError::NotASocket {
            path: path.to_path_buf(),
        });
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(ServerError::AddressInUse {
            endpoint: endpoint.clone(),
        }),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            fs::remove_file(path).map_err(|source| ServerError::Bind {
                endpoint: endpoint.clone(),
                source,
            })?;
            log::info!(
                "removed stale socket file {} (nothing was listening on it)",
                path.display()
            );
            Ok(())
        }
        Err(source) => Err(ServerError::Bind {
            endpoint: endpoint.clone(),
            source,
        }),
    }
}

/// Blocks until `listen_fd` or `wake_fd` is readable; returns which of them are.
fn wait_readable(listen_fd: RawFd, wake_fd: RawFd) -> io::Result<(bool, bool)> {
    let mut fds = [
        libc::pollfd {
            fd: listen_fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: wake_fd,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: `fds` is an initialised array of two `pollfd`s that lives across the call and
        // whose exact length is passed; `poll` only writes their `revents` fields. Both fds are
        // owned by the `Listener` borrowed by our caller, so they stay open during the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if rc >= 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok((fds[0].revents != 0, fds[1].revents != 0))
}
