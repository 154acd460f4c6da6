//! Frame header encoding and blocking frame I/O.

use std::io::{self, Read, Write};

use crate::kind::MessageKind;
use crate::{ProtoError, MAX_PAYLOAD, PROTOCOL_VERSION};

/// The two magic bytes that open every frame ("GL" read little-endian).
pub const MAGIC: u16 = 0x4C47;
/// Length of the fixed frame header in bytes.
pub const HEADER_LEN: usize = 12;
/// Bytes a reader of frames reads ahead (both ends of a memnode connection): a frame's header
/// and payload, a read's page list or a reply of a few pages, usually come in one `recv`
/// instead of two; larger payloads are read straight into their own buffer.
pub const READ_AHEAD: usize = 16 << 10;

/// A decoded, validated frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// What the payload holds.
    pub kind: MessageKind,
    /// Request identifier; a reply carries the id of the request it answers.
    pub req_id: u32,
    /// Payload length in bytes (already checked against [`MAX_PAYLOAD`]).
    pub len: u32,
}

impl FrameHeader {
    /// Encodes the header into its 12 wire bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        b[2] = PROTOCOL_VERSION;
        b[3] = self.kind as u8;
        b[4..8].copy_from_slice(&self.req_id.to_le_bytes());
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes and validates 12 header bytes: magic, version, kind and the payload bound.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Self, ProtoError> {
        let magic = u16::from_le_bytes([b[0], b[1]]);
        if magic != MAGIC {
            return Err(ProtoError::BadMagic(magic));
        }
        if b[2] != PROTOCOL_VERSION {
            return Err(ProtoError::BadVersion(b[2]));
        }
        let kind = MessageKind::from_u8(b[3]).ok_or(ProtoError::UnknownKind(b[3]))?;
        let req_id = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
        let len = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        if len as usize > MAX_PAYLOAD {
            return Err(ProtoError::Oversized(len));
        }
        Ok(FrameHeader { kind, req_id, len })
    }
}

/// Reads one frame: validates the header, then reads exactly its payload into `payload`
/// (which is cleared and resized; its capacity is reused across calls).
///
/// Returns [`ProtoError::Closed`] if the peer closed the connection before the first header byte.
pub fn read_frame(r: &mut impl Read, payload: &mut Vec<u8>) -> Result<FrameHeader, ProtoError> {
    let mut hdr = [0u8; HEADER_LEN];
    read_exact_or_closed(r, &mut hdr)?;
    let header = FrameHeader::decode(&hdr)?;
    payload.clear();
    payload.resize(header.len as usize, 0);
    r.read_exact(payload)?;
    Ok(header)
}

/// Writes one frame (header and payload) with a single vectored write where the OS allows.
pub fn write_frame(
    w: &mut impl Write,
    kind: MessageKind,
    req_id: u32,
    payload: &[u8],
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
    write_all_vectored(w, &header, payload)?;
    Ok(())
}

fn write_all_vectored(w: &mut impl Write, a: &[u8], b: &[u8]) -> io::Result<()> {
    let mut written = 0usize;
    let total = a.len() + b.len();
    while written < total {
        let n = if written < a.len() {
            w.write_vectored(&[io::IoSlice::new(&a[written..]), io::IoSlice::new(b)])
        } else {
            w.write(&b[written - a.len()..])
        };
        match n {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    w.flush()
}

/// Like `read_exact`, but a clean EOF before the first byte is reported as [`ProtoError::Closed`].
fn read_exact_or_closed(r: &mut impl Read, buf: &mut [u8]) -> Result<(), ProtoError> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Err(ProtoError::Closed),
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = FrameHeader {
            kind: MessageKind::Read,
            req_id: 7,
            len: 99,
        };
        assert_eq!(FrameHeader::decode(&h.encode()).unwrap(), h);
    }

    #[test]
    fn header_rejects_bad_magic_version_kind_and_size() {
        let good = FrameHeader {
            kind: MessageKind::Ping,
            req_id: 1,
            len: 0,
        }
        .encode();
        let mut b = good;
        b[0] = 0;
        assert!(matches!(
            FrameHeader::decode(&b),
            Err(ProtoError::BadMagic(_))
        ));
        let mut b = good;
        b[2] = 99;
        assert!(matches!(
            FrameHeader::decode(&b),
            Err(ProtoError::BadVersion(99))
        ));
        let mut b = good;
        b[3] = 250;
        assert!(matches!(
            FrameHeader::decode(&b),
            Err(ProtoError::UnknownKind(250))
        ));
        let mut b = good;
        b[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            FrameHeader::decode(&b),
            Err(ProtoError::Oversized(_))
        ));
    }

    #[test]
    fn oversized_header_allocates_nothing() {
        let mut bytes = FrameHeader {
            kind: MessageKind::Write,
            req_id: 1,
            len: 0,
        }
        .encode()
        .to_vec();
        bytes[8..12].copy_from_slice(&(crate::MAX_PAYLOAD as u32 + 1).to_le_bytes());
        let mut payload = Vec::new();
        let err = read_frame(&mut &bytes[..], &mut payload).unwrap_err();
        assert!(matches!(err, ProtoError::Oversized(_)));
        assert_eq!(payload.capacity(), 0);
    }

    #[test]
    fn truncated_frame_is_an_error_and_empty_stream_is_closed() {
        let mut payload = Vec::new();
        assert!(matches!(
            read_frame(&mut &[][..], &mut payload),
            Err(ProtoError::Closed)
        ));
        let mut bytes = FrameHeader {
            kind: MessageKind::Ping,
            req_id: 1,
            len: 10,
        }
        .encode()
        .to_vec();
        bytes.extend_from_slice(&[1, 2, 3]);
        let err = read_frame(&mut &bytes[..], &mut payload).unwrap_err();
        assert!(matches!(err, ProtoError::Io(_)));
        assert!(err.is_disconnect());
    }
}
