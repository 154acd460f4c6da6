//! The registration protocol between clients and `gleaner node`, over a Unix stream socket.
//!
//! Each message is a 4-byte little-endian length and that many bytes of JSON (at most
//! [`MAX_MESSAGE`]). A client opens one connection per registration and keeps it open: the
//! daemon drops the registration (and closes the pool's memfd) when the connection closes, and
//! pushes [`Reply::Limit`] on it when it changes the grant. A `register` of a soft pool carries
//! the pool's memfd as `SCM_RIGHTS` ancillary data of its first byte.
//!
//! Every registration names its `kind` so other kinds of client can join the same daemon later
//! (Hermes's latency-critical processes, metrics readers): this daemon accepts
//! [`Kind::SoftPool`] and [`Kind::FarProgram`] and answers the others with a clear error.
//! A far program registers without a descriptor, with its floor and ceiling, and then sends a
//! [`Request::Report`] of its pager's counters every few hundred milliseconds on the same
//! connection; the daemon pushes its grant as [`Reply::Limit`].
//! The daemon takes the client's pid from the socket (`SO_PEERCRED`), not from the message.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::{Deserialize, Serialize};

/// The protocol's version; a `register` with another is refused.
pub const VERSION: u32 = 1;
/// The largest message, in bytes of JSON.
pub const MAX_MESSAGE: usize = 1 << 20;

/// What kind of client registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A soft-memory pool (a memfd of segments the daemon may punch).
    SoftPool,
    /// A far-memory program whose local budget is elastic (`gleaner run --local-mem A..B`).
    FarProgram,
    /// A latency-critical process (Hermes, issue 47; not served yet).
    LatencyCritical,
}

/// A request from a client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Register a client (for a soft pool, with its memfd attached).
    Register {
        /// The protocol version the client speaks.
        version: u32,
        /// The client's kind.
        kind: Kind,
        /// A name for status output.
        name: String,
        /// Relative weight in the allocation (default 1).
        #[serde(default = "one")]
        weight: f64,
        /// The least the daemon should leave the pool (bytes), pressure permitting.
        #[serde(default)]
        floor_bytes: u64,
        /// The most the pool may be granted (bytes); 0 = its memfd's size.
        #[serde(default)]
        ceiling_bytes: u64,
        /// What the pool holds now (a re-registration after a daemon restart), bytes.
        #[serde(default)]
        resident_bytes: u64,
    },
    /// The daemon's state: pools, grants, pressure and its last decisions.
    Status,
    /// A registered far program's pager counters, cumulative since it started (sent on the
    /// registration's connection; anywhere else it is refused).
    Report {
        /// Faults served from far memory.
        far_faults: u64,
        /// Far pages brought in, on demand and ahead of demand (prefetched): with a prefetcher
        /// most pages of a sequential sweep come in without a fault of their own.
        #[serde(default)]
        far_pages_in: u64,
        /// Of those, the faults whose service was timed (a sample).
        timed_faults: u64,
        /// The time the timed faults took in all, ns.
        timed_ns: u64,
        /// Pages resident now, in bytes.
        resident_bytes: u64,
        /// The budget the pager applies now, bytes (it trails a lowered grant while it evicts).
        budget_bytes: u64,
    },
    /// Mark process `pid` as batch or latency-critical (Hermes, Middleware'21) for the batch
    /// reclaimer. The mark lasts until the process exits; the connection may close at once.
    /// The daemon accepts only processes of the caller's own user (or any, from root).
    Mark {
        /// The process.
        pid: i32,
        /// What it is.
        class: Class,
    },
    /// Mark every process in a cgroup (v1 or v2: the directory holding its `cgroup.procs`),
    /// those that join it later included, as long as the cgroup exists. The daemon accepts only
    /// a cgroup directory the caller owns (or any, from root).
    MarkCgroup {
        /// The cgroup's directory, absolute (e.g. `/sys/fs/cgroup/batch`).
        path: String,
        /// What its processes are.
        class: Class,
    },
}

/// The class of a process marked with [`Request::Mark`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// A batch job: under pressure its page cache is dropped, largest file first.
    Batch,
    /// A latency-critical service: nothing of it is ever dropped, and its allocation rate sizes
    /// the free memory the daemon keeps.
    LatencyCritical,
}

fn one() -> f64 {
    1.0
}

/// A message from the daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Reply {
    /// The registration is accepted.
    Registered {
        /// The registration's id (for status output).
        id: u64,
        /// The grant, bytes.
        limit_bytes: u64,
    },
    /// A new grant; `direct` says the daemon will punch (or has punched) segments itself.
    Limit {
        /// The grant, bytes.
        limit_bytes: u64,
        /// Whether the daemon takes memory directly rather than waiting for the runtime.
        direct: bool,
    },
    /// The process is marked (the answer to [`Request::Mark`]).
    Marked {
        /// The process.
        pid: i32,
    },
    /// The cgroup is marked (the answer to [`Request::MarkCgroup`]).
    MarkedCgroup {
        /// How many processes it holds now.
        processes: u64,
    },
    /// The daemon's state (the answer to [`Request::Status`]).
    Status {
        /// The state, as JSON.
        state: serde_json::Value,
    },
    /// The request was refused; the connection is closed after this.
    Error {
        /// Why, in words.
        error: String,
    },
}

/// Protocol errors.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    /// The socket failed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The peer closed the connection.
    #[error("the connection was closed")]
    Closed,
    /// A message longer than [`MAX_MESSAGE`].
    #[error("a message of {0} bytes (the most is {MAX_MESSAGE})")]
    TooLong(usize),
    /// A message that is not valid JSON for this protocol.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// More descriptors than one.
    #[error("a message brought {0} descriptors (the most is 1)")]
    TooManyFds(usize),
}

/// Sends `msg`, with `fd` attached if given.
pub fn send<T: Serialize>(
    sock: &UnixStream,
    msg: &T,
    fd: Option<BorrowedFd<'_>>,
) -> Result<(), ProtoError> {
    let body = serde_json::to_vec(msg).map_err(|e| ProtoError::Malformed(e.to_string()))?;
    send_raw(sock, &body, fd)
}

/// Sends `body` as one message (tests use it to send malformed JSON).
pub fn send_raw(
    sock: &UnixStream,
    body: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> Result<(), ProtoError> {
    if body.len() > MAX_MESSAGE {
        return Err(ProtoError::TooLong(body.len()));
    }
    let len = (body.len() as u32).to_le_bytes();
    let mut bufs: Vec<u8> = Vec::with_capacity(4 + body.len());
    bufs.extend_from_slice(&len);
    bufs.extend_from_slice(body);
    let mut off = 0;
    let fds;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if let Some(fd) = fd {
        fds = [fd];
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(io::Error::other("no room for the descriptor").into());
        }
    }
    while off < bufs.len() {
        match sendmsg(
            sock,
            &[IoSlice::new(&bufs[off..])],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(n) => {
                off += n;
                control = SendAncillaryBuffer::default();
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(io::Error::from(e).into()),
        }
    }
    Ok(())
}

/// Receives one message's JSON bytes and any descriptor sent with it.
pub fn recv_raw(sock: &UnixStream) -> Result<(Vec<u8>, Option<OwnedFd>), ProtoError> {
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut len = [0u8; 4];
    read_full(sock, &mut len, &mut fds)?;
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_MESSAGE {
        return Err(ProtoError::TooLong(n));
    }
    let mut body = vec![0u8; n];
    read_full(sock, &mut body, &mut fds)?;
    if fds.len() > 1 {
        return Err(ProtoError::TooManyFds(fds.len()));
    }
    Ok((body, fds.pop()))
}

/// Receives and parses one message.
pub fn recv<T: for<'de> Deserialize<'de>>(
    sock: &UnixStream,
) -> Result<(T, Option<OwnedFd>), ProtoError> {
    let (body, fd) = recv_raw(sock)?;
    let msg = serde_json::from_slice(&body).map_err(|e| ProtoError::Malformed(e.to_string()))?;
    Ok((msg, fd))
}

fn read_full(sock: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> Result<(), ProtoError> {
    let mut off = 0;
    while off < buf.len() {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = match recvmsg(
            sock.as_fd(),
            &mut [IoSliceMut::new(&mut buf[off..])],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(r) => r.bytes,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(io::Error::from(e).into()),
        };
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(it) = msg {
                fds.extend(it);
            }
        }
        if got == 0 {
            return Err(ProtoError::Closed);
        }
        off += got;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_round_trips_and_defaults_apply() {
        let r: Request =
            serde_json::from_str(r#"{"op":"register","version":1,"kind":"soft_pool","name":"a"}"#)
                .unwrap();
        match r {
            Request::Register {
                weight,
                floor_bytes,
                ceiling_bytes,
                ..
            } => {
                assert_eq!(weight, 1.0);
                assert_eq!((floor_bytes, ceiling_bytes), (0, 0));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unknown_fields_and_ops_are_errors() {
        assert!(serde_json::from_str::<Request>(r#"{"op":"launch"}"#).is_err());
        assert!(serde_json::from_str::<Request>(
            r#"{"op":"register","version":1,"kind":"soft_pool","name":"a","bogus":1}"#
        )
        .is_err());
        assert!(serde_json::from_str::<Request>(
            r#"{"op":"register","version":1,"kind":"cache","name":"a"}"#
        )
        .is_err());
    }

    #[test]
    fn messages_travel_with_a_descriptor() {
        let (a, b) = UnixStream::pair().unwrap();
        let (fd, _c) = crate::shared::create_pool_memfd("t", 1).unwrap();
        send(&a, &Request::Status, Some(fd.as_fd())).unwrap();
        let (m, got): (Request, _) = recv(&b).unwrap();
        assert_eq!(m, Request::Status);
        let got = got.expect("the memfd came along");
        assert!(crate::shared::adopt_pool_memfd(&got).is_ok());
        // A length beyond the bound is refused before anything is allocated.
        use std::io::Write;
        (&a).write_all(&(u32::MAX).to_le_bytes()).unwrap();
        assert!(matches!(recv_raw(&b), Err(ProtoError::TooLong(_))));
    }
}
