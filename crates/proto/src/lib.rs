//! The gleaner wire protocol, shared by the pager (client) and the memory node (server).
//!
//! Every frame is a fixed 12-byte little-endian header followed by a payload:
//!
//! ```text
//! offset 0  u16  magic   0x4C47 ("GL")
//!        2  u8   version PROTOCOL_VERSION
//!        3  u8   kind    MessageKind
//!        4  u32  req_id  echoed by the reply
//!        8  u32  len     payload length, at most MAX_PAYLOAD
//! ```
//!
//! Every length and count is checked against a hard bound *before* anything is allocated, so a
//! malformed or hostile frame costs the receiver at most one `MAX_PAYLOAD` buffer and is then
//! rejected with a [`ProtoError`]. See `docs/protocol.md` for the handshake and each message.
#![deny(missing_docs)]

mod auth;
pub mod client;
pub mod fdpass;
mod frame;
mod kind;
mod message;
pub mod patience;
pub mod units;

pub use auth::{
    client_proof, generate_token, proofs_equal, random_bytes, read_secret_file, read_token_file,
    server_proof, write_token_file, Nonce, Proof, SessionKey, Token, NONCE_LEN, PROOF_LEN,
    SESSION_KEY_LEN, TOKEN_LEN,
};
pub use client::{
    ClientError, ConnectOptions, Connection, Endpoint, PendingRead, PendingWrite, SessionInfo,
    SlabGrant, Stream,
};
pub use frame::{read_frame, write_frame, FrameHeader, HEADER_LEN, MAGIC, READ_AHEAD};
pub use kind::MessageKind;
pub use message::{BatchIter, ErrorCode, Message, PageBatch, PageIds, PageRanges, PageVersions};

/// Size of one page of client memory (the unit of page ids, of shared-memory slabs, and of the
/// uncompressed contents a far page stands for).
pub const PAGE_SIZE: usize = 4096;
/// Largest blob one batch entry may carry: a page the client sealed without managing to compress
/// it, plus room for its codec's header and authentication tag. Blobs are opaque to the protocol
/// and the memnode; any length from 1 to this bound is valid.
pub const MAX_BLOB_SIZE: usize = PAGE_SIZE + 64;
/// Protocol version spoken by this build. A peer with another version is refused at the handshake.
pub const PROTOCOL_VERSION: u8 = 4;
/// Most pages one read or write request may carry.
pub const MAX_BATCH_PAGES: usize = 256;
/// Most page ranges one free request may carry.
pub const MAX_FREE_RANGES: usize = 4096;
/// Longest text (error message, stats JSON, client name) a frame may carry.
pub const MAX_TEXT_LEN: usize = 256 * 1024;
/// Largest payload any frame may carry: a full write batch of maximal blobs plus its count
/// (`4 + 256 × (8 + 8 + 4 + 4160)` = 1 070 084 bytes).
pub const MAX_PAYLOAD: usize = 4 + MAX_BATCH_PAGES * (8 + 8 + 4 + MAX_BLOB_SIZE);

/// Why a frame could not be read or decoded.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    /// The underlying socket failed or closed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The peer closed the connection cleanly between frames.
    #[error("connection closed by peer")]
    Closed,
    /// The first two bytes were not the protocol magic.
    #[error("bad magic 0x{0:04x} (not a gleaner peer?)")]
    BadMagic(u16),
    /// The peer speaks another protocol version.
    #[error("unsupported protocol version {0} (this build speaks {PROTOCOL_VERSION})")]
    BadVersion(u8),
    /// The message kind byte is not one this version knows.
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    /// The header announced a payload larger than [`MAX_PAYLOAD`].
    #[error("frame payload of {0} bytes exceeds the limit of {MAX_PAYLOAD}")]
    Oversized(u32),
    /// The payload is shorter or longer than its contents say, or a count exceeds its bound.
    #[error("malformed {kind:?} payload: {why}")]
    Malformed {
        /// Which message was being decoded.
        kind: MessageKind,
        /// What was wrong with it.
        why: String,
    },
}

impl ProtoError {
    /// Whether this error means the peer simply went away (as opposed to sending garbage).
    pub fn is_disconnect(&self) -> bool {
        match self {
            ProtoError::Closed => true,
            ProtoError::Io(e) => matches!(
                e.kind(),
                std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::ConnectionAborted
            ),
            _ => false,
        }
    }
}
