//! Frames that carry a file descriptor over a Unix stream socket (`SCM_RIGHTS`): the memnode's
//! `Grant` reply hands the client the memfd of a shared-memory slab this way.
//!
//! The descriptor travels as ancillary data of the frame's first `sendmsg`; on a stream socket
//! the kernel delivers it with the first `recvmsg` that reads any byte of that send, so the
//! receiver reads the whole frame with `recvmsg` and collects descriptors as they come. A plain
//! `read` of those bytes would make the kernel close the descriptor instead.

use std::io::{self, IoSlice, IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};

use crate::frame::{FrameHeader, HEADER_LEN};
use crate::kind::MessageKind;
use crate::{ProtoError, MAX_PAYLOAD};

/// The most descriptors one frame may bring; more are a protocol error (and are closed).
pub const MAX_FDS_PER_FRAME: usize = 4;

/// Writes one frame with `fd` attached.
pub fn write_frame_with_fd(
    sock: &UnixStream,
    kind: MessageKind,
    req_id: u32,
    payload: &[u8],
    fd: BorrowedFd<'_>,
) -> Result<(), ProtoError> {
    if payload.len() > MAX_PAYLOAD {
        return Err(ProtoError::Oversized(payload.len() as u32));
    }
    let header = FrameHeader {
        kind,
        req_id,
        len: payload.len() as u32,
    }
    .encode();
    let fds = [fd];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("no room for the descriptor in the control buffer").into());
    }
    let sent = loop {
        match sendmsg(
            sock,
            &[IoSlice::new(&header), IoSlice::new(payload)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(n) => break n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(io::Error::from(e).into()),
        }
    };
    if sent == 0 {
        return Err(io::Error::from(io::ErrorKind::WriteZero).into());
    }
    // The descriptor went with the first byte; the rest of a short send goes plainly.
    let mut rest = Vec::new();
    rest.extend_from_slice(&header);
    rest.extend_from_slice(payload);
    (&*sock).write_all(&rest[sent..])?;
    Ok(())
}

/// Reads one frame into `payload`, appending any descriptors that arrive with it to `fds`.
/// A clean end of stream before the first byte is [`ProtoError::Closed`].
pub fn read_frame_with_fds(
    sock: &UnixStream,
    payload: &mut Vec<u8>,
    fds: &mut Vec<OwnedFd>,
) -> Result<FrameHeader, ProtoError> {
    read_frame_taking(sock, payload, Some(fds))
}

/// Reads one frame into `payload` and lets the kernel close any descriptor that came with it
/// (one [`peek_fd`] already copied).
pub fn read_frame_dropping_fds(
    sock: &UnixStream,
    payload: &mut Vec<u8>,
) -> Result<FrameHeader, ProtoError> {
    read_frame_taking(sock, payload, None)
}

fn read_frame_taking(
    sock: &UnixStream,
    payload: &mut Vec<u8>,
    mut fds: Option<&mut Vec<OwnedFd>>,
) -> Result<FrameHeader, ProtoError> {
    let mut hdr = [0u8; HEADER_LEN];
    recv_exact(sock, &mut hdr, fds.as_deref_mut(), true)?;
    let header = FrameHeader::decode(&hdr)?;
    payload.clear();
    payload.resize(header.len as usize, 0);
    recv_exact(sock, payload, fds, false)?;
    Ok(header)
}

/// What [`peek_fd`] found at the head of the stream.
#[derive(Debug)]
pub enum Peeked {
    /// A copy of the descriptor the next byte brings (the byte and its descriptor stay queued).
    Fd(OwnedFd),
    /// The next byte brings no descriptor.
    NoFd,
    /// The next byte brings one, but this process had no number free for the copy: nothing
    /// was consumed, and a later peek can try again.
    NoNumber,
}

/// Looks at the next byte of `sock` without consuming it (`MSG_PEEK`), taking a copy of any
/// descriptor it brings. A read that consumes the byte installs the descriptor or, where no
/// number is free, closes it for good; a peek that finds no number leaves it queued. Blocks as
/// a read does (the socket's read timeout applies); the end of the stream is
/// [`ProtoError::Closed`].
pub fn peek_fd(sock: &UnixStream) -> Result<Peeked, ProtoError> {
    let mut byte = [0u8; 1];
    loop {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_FRAME))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let r = recvmsg(
            sock,
            &mut [IoSliceMut::new(&mut byte)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC | RecvFlags::PEEK,
        );
        let m = match r {
            Ok(m) => m,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(io::Error::from(e).into()),
        };
        let mut fds: Vec<OwnedFd> = Vec::new();
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = msg {
                fds.extend(received);
            }
        }
        if m.bytes == 0 {
            return Err(ProtoError::Closed);
        }
        if m.flags.contains(ReturnFlags::CTRUNC) && fds.is_empty() {
            return Ok(Peeked::NoNumber);
        }
        if fds.len() > 1 {
            return Err(io::Error::other("a frame brought more than one file descriptor").into());
        }
        return Ok(fds.pop().map_or(Peeked::NoFd, Peeked::Fd));
    }
}

/// Fills `buf` with `recvmsg`, collecting descriptors into `fds` (`None`: with no room for
/// them, so that the kernel closes them).
fn recv_exact(
    sock: &UnixStream,
    buf: &mut [u8],
    mut fds: Option<&mut Vec<OwnedFd>>,
    first: bool,
) -> Result<(), ProtoError> {
    let mut filled = 0;
    while filled < buf.len() {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_FRAME))];
        let room = if fds.is_some() {
            &mut space[..]
        } else {
            &mut space[..0]
        };
        let mut control = RecvAncillaryBuffer::new(room);
        let r = recvmsg(
            sock,
            &mut [IoSliceMut::new(&mut buf[filled..])],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        );
        let n = match r {
            Ok(m) => m.bytes,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(io::Error::from(e).into()),
        };
        if let Some(fds) = fds.as_deref_mut() {
            for msg in control.drain() {
                if let RecvAncillaryMessage::ScmRights(received) = msg {
                    fds.extend(received);
                }
            }
            if fds.len() > MAX_FDS_PER_FRAME {
                return Err(io::Error::other("a frame brought too many file descriptors").into());
            }
        }
        if n == 0 {
            return Err(if first && filled == 0 {
                ProtoError::Closed
            } else {
                io::Error::from(io::ErrorKind::UnexpectedEof).into()
            });
        }
        filled += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsFd;

    #[test]
    fn a_descriptor_travels_with_its_frame() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut r, w) = std::io::pipe().unwrap();
        write_frame_with_fd(&a, MessageKind::Grant, 9, &[1, 2, 3], w.as_fd()).unwrap();
        drop(w);
        let mut payload = Vec::new();
        let mut fds = Vec::new();
        let h = read_frame_with_fds(&b, &mut payload, &mut fds).unwrap();
        assert_eq!((h.kind, h.req_id), (MessageKind::Grant, 9));
        assert_eq!(payload, [1, 2, 3]);
        assert_eq!(fds.len(), 1);
        // The received descriptor is the pipe's write end: writing through it reaches `r`.
        let mut w2 = std::fs::File::from(fds.pop().unwrap());
        w2.write_all(b"hi").unwrap();
        drop(w2);
        let mut got = String::new();
        r.read_to_string(&mut got).unwrap();
        assert_eq!(got, "hi");
        drop(a);
        assert!(matches!(
            read_frame_with_fds(&b, &mut payload, &mut fds),
            Err(ProtoError::Closed)
        ));
    }
}
