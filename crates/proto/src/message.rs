//! Message kinds and their payload encodings.
//!
//! Decoding borrows from the payload buffer: page data is never copied on the way in, so a handler
//! can install a page straight from the receive buffer. Decoding never allocates either: a
//! [`PageBatch`] is validated entry by entry when it is decoded and then walked in place.

use std::io::Write;

use crate::auth::{Nonce, Proof, SessionKey, NONCE_LEN, PROOF_LEN, SESSION_KEY_LEN};
use crate::frame::write_frame;
use crate::kind::MessageKind;
use crate::{ProtoError, MAX_BATCH_PAGES, MAX_BLOB_SIZE, MAX_FREE_RANGES, MAX_TEXT_LEN};

/// Why the server refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum ErrorCode {
    /// The client's proof did not match the shared token (or it named an unknown session).
    AuthFailed = 1,
    /// A page asked for is not stored in this session.
    NotFound = 2,
    /// The write does not fit in the server's remaining capacity (in bytes); nothing was stored.
    Full = 3,
    /// The request was malformed or not allowed in this state.
    BadRequest = 4,
    /// The server is shutting down.
    ShuttingDown = 5,
    /// Any other server-side failure.
    Internal = 6,
    /// The server is draining (the answer to `Ping`): move your pages to other memnodes and end
    /// the session; reads and writes are still served meanwhile.
    Draining = 7,
    /// A prefetch waited past its deadline and was dropped; nothing was read.
    Late = 8,
}

impl ErrorCode {
    fn from_u16(v: u16) -> Option<Self> {
        use ErrorCode::*;
        Some(match v {
            1 => AuthFailed,
            2 => NotFound,
            3 => Full,
            4 => BadRequest,
            5 => ShuttingDown,
            6 => Internal,
            7 => Draining,
            8 => Late,
            _ => return None,
        })
    }
}

/// One decoded message. Variable-length parts borrow from the payload buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message<'a> {
    /// See [`MessageKind::Challenge`].
    Challenge {
        /// The server's fresh random nonce.
        nonce: Nonce,
    },
    /// See [`MessageKind::Auth`].
    Auth {
        /// The client's fresh random nonce.
        client_nonce: Nonce,
        /// Zero to create a new session, else the session to attach this connection to.
        session_id: u64,
        /// The session's attach key (zero when creating a session).
        session_key: SessionKey,
        /// HMAC proof that the client holds the token, see [`crate::client_proof`].
        proof: Proof,
        /// A human-readable client name for logs and stats.
        client_name: &'a str,
    },
    /// See [`MessageKind::Welcome`].
    Welcome {
        /// The session this connection belongs to.
        session_id: u64,
        /// The key further connections present to attach to it.
        session_key: SessionKey,
        /// HMAC proof that the server holds the token, see [`crate::server_proof`].
        proof: Proof,
        /// The server's total capacity in bytes, shared by all its sessions (stored blobs count
        /// their length, shared-memory slabs their pages × [`crate::PAGE_SIZE`]).
        capacity_bytes: u64,
        /// How long the session outlives its last connection, in milliseconds.
        lease_ms: u64,
    },
    /// See [`MessageKind::Read`].
    Read {
        /// The page ids to read.
        pages: PageIds<'a>,
    },
    /// See [`MessageKind::Pages`].
    Pages {
        /// The pages read, in request order.
        batch: PageBatch<'a>,
    },
    /// See [`MessageKind::Write`].
    Write {
        /// The pages to store.
        batch: PageBatch<'a>,
    },
    /// See [`MessageKind::Ack`].
    Ack {
        /// How many items the acknowledged request covered.
        count: u32,
    },
    /// See [`MessageKind::Free`].
    Free {
        /// The page ranges to release.
        ranges: PageRanges<'a>,
    },
    /// See [`MessageKind::Ping`].
    Ping,
    /// See [`MessageKind::Drain`].
    Drain,
    /// See [`MessageKind::Fork`].
    Fork,
    /// See [`MessageKind::Prefetch`].
    Prefetch {
        /// The longest the request may wait for the link before it is dropped, µs
        /// (`u32::MAX`: no deadline).
        deadline_us: u32,
        /// The page ids to read.
        pages: PageIds<'a>,
    },
    /// See [`MessageKind::Forget`].
    Forget {
        /// The copies to drop.
        copies: PageVersions<'a>,
    },
    /// See [`MessageKind::Forked`].
    Forked {
        /// The new session.
        session_id: u64,
        /// Its attach key.
        session_key: SessionKey,
    },
    /// See [`MessageKind::Pong`].
    Pong,
    /// See [`MessageKind::StatsRequest`].
    StatsRequest,
    /// See [`MessageKind::Stats`].
    Stats {
        /// The server's metrics as a JSON document.
        json: &'a str,
    },
    /// See [`MessageKind::Goodbye`].
    Goodbye,
    /// See [`MessageKind::Error`].
    Error {
        /// The machine-readable reason.
        code: ErrorCode,
        /// A human-readable explanation.
        message: &'a str,
    },
    /// See [`MessageKind::GrantRequest`].
    GrantRequest {
        /// Pages wanted; the server may grant fewer (at least one) when it has less free.
        pages: u64,
    },
    /// See [`MessageKind::Grant`].
    Grant {
        /// The slab's number within the session (0, 1, 2, ... in grant order).
        slab_id: u32,
        /// Pages granted (the memfd is exactly this many pages long, sealed against resizing).
        pages: u64,
    },
}

impl<'a> Message<'a> {
    /// The frame kind this message travels as.
    pub fn kind(&self) -> MessageKind {
        match self {
            Message::Challenge { .. } => MessageKind::Challenge,
            Message::Auth { .. } => MessageKind::Auth,
            Message::Welcome { .. } => MessageKind::Welcome,
            Message::Read { .. } => MessageKind::Read,
            Message::Pages { .. } => MessageKind::Pages,
            Message::Write { .. } => MessageKind::Write,
            Message::Ack { .. } => MessageKind::Ack,
            Message::Free { .. } => MessageKind::Free,
            Message::Ping => MessageKind::Ping,
            Message::Drain => MessageKind::Drain,
            Message::Fork => MessageKind::Fork,
            Message::Prefetch { .. } => MessageKind::Prefetch,
            Message::Forget { .. } => MessageKind::Forget,
            Message::Forked { .. } => MessageKind::Forked,
            Message::Pong => MessageKind::Pong,
            Message::StatsRequest => MessageKind::StatsRequest,
            Message::Stats { .. } => MessageKind::Stats,
            Message::Goodbye => MessageKind::Goodbye,
            Message::Error { .. } => MessageKind::Error,
            Message::GrantRequest { .. } => MessageKind::GrantRequest,
            Message::Grant { .. } => MessageKind::Grant,
        }
    }

    /// Appends this message's payload encoding to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            Message::Challenge { nonce } => out.extend_from_slice(&nonce),
            Message::Auth {
                client_nonce,
                session_id,
                session_key,
                proof,
                client_name,
            } => {
                out.extend_from_slice(&client_nonce);
                out.extend_from_slice(&session_id.to_le_bytes());
                out.extend_from_slice(&session_key);
                out.extend_from_slice(&proof);
                put_text(out, client_name);
            }
            Message::Welcome {
                session_id,
                session_key,
                proof,
                capacity_bytes,
                lease_ms,
            } => {
                out.extend_from_slice(&session_id.to_le_bytes());
                out.extend_from_slice(&session_key);
                out.extend_from_slice(&proof);
                out.extend_from_slice(&capacity_bytes.to_le_bytes());
                out.extend_from_slice(&lease_ms.to_le_bytes());
            }
            Message::Read { pages } => out.extend_from_slice(pages.raw),
            Message::Prefetch { deadline_us, pages } => {
                out.extend_from_slice(&deadline_us.to_le_bytes());
                out.extend_from_slice(pages.raw);
            }
            Message::Pages { batch } | Message::Write { batch } => out.extend_from_slice(batch.raw),
            Message::Ack { count } => out.extend_from_slice(&count.to_le_bytes()),
            Message::Free { ranges } => out.extend_from_slice(ranges.raw),
            Message::Forget { copies } => out.extend_from_slice(copies.raw),
            Message::Forked {
                session_id,
                session_key,
            } => {
                out.extend_from_slice(&session_id.to_le_bytes());
                out.extend_from_slice(&session_key);
            }
            Message::Ping
            | Message::Drain
            | Message::Fork
            | Message::Pong
            | Message::StatsRequest
            | Message::Goodbye => {}
            Message::Stats { json } => put_text(out, json),
            Message::Error { code, message } => {
                out.extend_from_slice(&(code as u16).to_le_bytes());
                put_text(out, message);
            }
            Message::GrantRequest { pages } => out.extend_from_slice(&pages.to_le_bytes()),
            Message::Grant { slab_id, pages } => {
                out.extend_from_slice(&slab_id.to_le_bytes());
                out.extend_from_slice(&pages.to_le_bytes());
            }
        }
    }

    /// Decodes a payload of the given kind, checking every count and length.
    pub fn decode(kind: MessageKind, payload: &'a [u8]) -> Result<Self, ProtoError> {
        let mut c = Cursor {
            kind,
            buf: payload,
            pos: 0,
        };
        let msg = match kind {
            MessageKind::Challenge => Message::Challenge {
                nonce: c.array::<NONCE_LEN>()?,
            },
            MessageKind::Auth => Message::Auth {
                client_nonce: c.array::<NONCE_LEN>()?,
                session_id: c.u64()?,
                session_key: c.array::<SESSION_KEY_LEN>()?,
                proof: c.array::<PROOF_LEN>()?,
                client_name: c.text()?,
            },
            MessageKind::Welcome => Message::Welcome {
                session_id: c.u64()?,
                session_key: c.array::<SESSION_KEY_LEN>()?,
                proof: c.array::<PROOF_LEN>()?,
                capacity_bytes: c.u64()?,
                lease_ms: c.u64()?,
            },
            MessageKind::Read => Message::Read {
                pages: PageIds {
                    raw: c.counted(8, MAX_BATCH_PAGES)?,
                },
            },
            MessageKind::Pages => Message::Pages { batch: c.batch()? },
            MessageKind::Write => Message::Write { batch: c.batch()? },
            MessageKind::Ack => Message::Ack { count: c.u32()? },
            MessageKind::Free => Message::Free {
                ranges: PageRanges {
                    raw: c.counted(12, MAX_FREE_RANGES)?,
                },
            },
            MessageKind::Ping => Message::Ping,
            MessageKind::Drain => Message::Drain,
            MessageKind::Fork => Message::Fork,
            MessageKind::Prefetch => Message::Prefetch {
                deadline_us: c.u32()?,
                pages: PageIds {
                    raw: c.counted(8, MAX_BATCH_PAGES)?,
                },
            },
            MessageKind::Forget => Message::Forget {
                copies: PageVersions {
                    raw: c.counted(16, MAX_BATCH_PAGES)?,
                },
            },
            MessageKind::Forked => Message::Forked {
                session_id: c.u64()?,
                session_key: c.array::<SESSION_KEY_LEN>()?,
            },
            MessageKind::Pong => Message::Pong,
            MessageKind::StatsRequest => Message::StatsRequest,
            MessageKind::Stats => Message::Stats { json: c.text()? },
            MessageKind::Goodbye => Message::Goodbye,
            MessageKind::Error => {
                let raw = c.u16()?;
                let code = ErrorCode::from_u16(raw)
                    .ok_or_else(|| c.malformed(format!("unknown error code {raw}")))?;
                Message::Error {
                    code,
                    message: c.text()?,
                }
            }
            MessageKind::GrantRequest => Message::GrantRequest { pages: c.u64()? },
            MessageKind::Grant => Message::Grant {
                slab_id: c.u32()?,
                pages: c.u64()?,
            },
        };
        c.finish()?;
        Ok(msg)
    }

    /// Encodes this message into `scratch` and writes it as one frame.
    pub fn send(
        &self,
        w: &mut impl Write,
        req_id: u32,
        scratch: &mut Vec<u8>,
    ) -> Result<(), ProtoError> {
        scratch.clear();
        self.encode(scratch);
        write_frame(w, self.kind(), req_id, scratch)
    }
}

fn put_text(out: &mut Vec<u8>, s: &str) {
    // Texts longer than the bound are cut at a character boundary rather than refused: they are
    // only ever diagnostics, and a reply must never become undecodable because of its message.
    let mut end = s.len().min(MAX_TEXT_LEN);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u32).to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..end]);
}

/// A list of page ids as it lies in a payload: `u32 count` then `count` little-endian `u64`s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageIds<'a> {
    raw: &'a [u8],
}

impl<'a> PageIds<'a> {
    /// Appends the encoding of `ids` to `out`. Panics if there are more than [`MAX_BATCH_PAGES`].
    pub fn encode_into(out: &mut Vec<u8>, ids: &[u64]) {
        assert!(ids.len() <= MAX_BATCH_PAGES, "read batch too large");
        out.extend_from_slice(&(ids.len() as u32).to_le_bytes());
        for id in ids {
            out.extend_from_slice(&id.to_le_bytes());
        }
    }

    /// Wraps an encoding produced by [`PageIds::encode_into`] (for building a `Message::Read`).
    pub fn from_encoded(raw: &'a [u8]) -> Self {
        PageIds { raw }
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        (self.raw.len() - 4) / 8
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ids in order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + 'a {
        self.raw[4..]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
    }
}

/// Page copies as they lie in a payload: `u32 count` then `count` × (`u64` page id, `u64`
/// version), with `count <= MAX_BATCH_PAGES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageVersions<'a> {
    raw: &'a [u8],
}

impl<'a> PageVersions<'a> {
    /// Appends the encoding of `copies` to `out`. Panics if there are more than
    /// [`MAX_BATCH_PAGES`].
    pub fn encode_into(out: &mut Vec<u8>, copies: &[(u64, u64)]) {
        assert!(copies.len() <= MAX_BATCH_PAGES, "too many page copies");
        out.extend_from_slice(&(copies.len() as u32).to_le_bytes());
        for (id, version) in copies {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&version.to_le_bytes());
        }
    }

    /// Wraps an encoding produced by [`PageVersions::encode_into`].
    pub fn from_encoded(raw: &'a [u8]) -> Self {
        PageVersions { raw }
    }

    /// Number of copies.
    pub fn len(&self) -> usize {
        (self.raw.len() - 4) / 16
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `(page id, version)` pairs in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + 'a {
        self.raw[4..].chunks_exact(16).map(|c| {
            (
                u64::from_le_bytes(c[..8].try_into().expect("8 bytes")),
                u64::from_le_bytes(c[8..].try_into().expect("8 bytes")),
            )
        })
    }
}

/// A batch of `(page id, version, blob)` entries: `u32 count` then `count` × (`u64` id, `u64`
/// version, `u32` len, `len` bytes), with `count <= MAX_BATCH_PAGES` and
/// `1 <= len <= MAX_BLOB_SIZE` for every entry.
///
/// Blobs are opaque to the protocol (the pager seals each page into one: compressed, encrypted,
/// or the raw 4096 bytes); only their bounds are checked. The version is the client's count of
/// its writes of the page (its codec's nonce): a memnode ignores a write older than the blob it
/// holds, so a batch that a broken connection delivers late never overwrites a newer one. A
/// client that does not version its pages sends 0 throughout (every write then replaces).
///
/// Entries have variable sizes, so an entry's offset cannot be computed: the batch keeps the
/// count from its header and walks the entries. It deliberately keeps no offsets index: that
/// would cost an allocation per decoded frame on the request path and make [`Message`] (which
/// borrows the payload and is `Copy`) own heap memory, while every user reads a batch in order
/// ([`PageBatch::iter`] is one pass over the bytes). [`PageBatch::get`] is therefore O(i), which
/// is at most [`MAX_BATCH_PAGES`] header hops; prefer `iter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageBatch<'a> {
    /// The whole encoding, count included.
    raw: &'a [u8],
    /// The number of entries (the header's count, validated against the entries present).
    count: usize,
}

impl<'a> PageBatch<'a> {
    /// Starts a batch encoding in `out` (clearing it); add entries with [`PageBatch::push`] or
    /// [`PageBatch::push_slot`].
    pub fn begin(out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&0u32.to_le_bytes());
    }

    /// Appends the header of one entry of `len` bytes to a begun batch and bumps its count.
    /// Panics if `len` is out of bounds or the batch is already full.
    fn push_header(out: &mut Vec<u8>, id: u64, version: u64, len: usize) {
        assert!(
            (1..=MAX_BLOB_SIZE).contains(&len),
            "a batch entry must be 1 to {MAX_BLOB_SIZE} bytes, not {len}"
        );
        let count = u32::from_le_bytes(out[0..4].try_into().expect("begun batch")) as usize;
        assert!(count < MAX_BATCH_PAGES, "page batch too large");
        out[0..4].copy_from_slice(&(count as u32 + 1).to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&(len as u32).to_le_bytes());
    }

    /// Appends one entry to a batch started with [`PageBatch::begin`].
    /// Panics if `data` is empty or longer than [`MAX_BLOB_SIZE`], or the batch is already full.
    pub fn push(out: &mut Vec<u8>, id: u64, version: u64, data: &[u8]) {
        Self::push_header(out, id, version, data.len());
        out.extend_from_slice(data);
    }

    /// Appends one entry of `len` zeroed bytes to a begun batch and returns them to fill in
    /// place. Panics if `len` is 0 or more than [`MAX_BLOB_SIZE`], or the batch is already full.
    pub fn push_slot(out: &mut Vec<u8>, id: u64, version: u64, len: usize) -> &mut [u8] {
        Self::push_header(out, id, version, len);
        let start = out.len();
        out.resize(start + len, 0);
        &mut out[start..]
    }

    /// Wraps an encoding produced by [`PageBatch::begin`] and [`PageBatch::push`] /
    /// [`PageBatch::push_slot`] (bytes from a peer go through [`Message::decode`], which
    /// validates them). Panics if `raw` is shorter than its count.
    pub fn from_encoded(raw: &'a [u8]) -> Self {
        let count = u32::from_le_bytes(raw[..4].try_into().expect("4 bytes")) as usize;
        PageBatch { raw, count }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The `i`-th entry. O(i): walks the entries before it (see the type's documentation).
    /// Panics if `i >= self.len()`.
    pub fn get(&self, i: usize) -> (u64, u64, &'a [u8]) {
        self.iter().nth(i).unwrap_or_else(|| {
            panic!(
                "batch entry {i} out of range (the batch has {} entries)",
                self.count
            )
        })
    }

    /// The entries in order.
    pub fn iter(&self) -> BatchIter<'a> {
        BatchIter {
            rest: self.raw.get(4..).unwrap_or_default(),
            left: self.count,
        }
    }
}

/// The entries of a [`PageBatch`] in order, from [`PageBatch::iter`].
#[derive(Debug, Clone)]
pub struct BatchIter<'a> {
    /// The bytes of the entries not yet returned.
    rest: &'a [u8],
    /// How many entries are left.
    left: usize,
}

/// Bytes of a batch entry's header: id, version, length.
const ENTRY_HEADER: usize = 20;

impl<'a> Iterator for BatchIter<'a> {
    /// `(page id, version, blob)`.
    type Item = (u64, u64, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        // A decoded batch was validated entry by entry; on a malformed hand-made encoding the
        // walk simply ends early rather than panicking.
        let entry = (|| {
            let id = u64::from_le_bytes(self.rest.get(..8)?.try_into().ok()?);
            let version = u64::from_le_bytes(self.rest.get(8..16)?.try_into().ok()?);
            let len = u32::from_le_bytes(self.rest.get(16..ENTRY_HEADER)?.try_into().ok()?);
            let len = len as usize;
            let data = self.rest.get(ENTRY_HEADER..ENTRY_HEADER + len)?;
            Some((id, version, data, ENTRY_HEADER + len))
        })();
        match entry {
            Some((id, version, data, used)) => {
                self.rest = &self.rest[used..];
                self.left -= 1;
                Some((id, version, data))
            }
            None => {
                self.left = 0;
                None
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left))
    }
}

/// Page ranges to free: `u32 count` then `count` × (`u64` first page, `u32` page count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRanges<'a> {
    raw: &'a [u8],
}

impl<'a> PageRanges<'a> {
    /// Appends the encoding of `ranges` to `out`. Panics if there are more than [`MAX_FREE_RANGES`].
    pub fn encode_into(out: &mut Vec<u8>, ranges: &[(u64, u32)]) {
        assert!(ranges.len() <= MAX_FREE_RANGES, "too many free ranges");
        out.extend_from_slice(&(ranges.len() as u32).to_le_bytes());
        for (start, count) in ranges {
            out.extend_from_slice(&start.to_le_bytes());
            out.extend_from_slice(&count.to_le_bytes());
        }
    }

    /// Wraps an encoding produced by [`PageRanges::encode_into`].
    pub fn from_encoded(raw: &'a [u8]) -> Self {
        PageRanges { raw }
    }

    /// Number of ranges.
    pub fn len(&self) -> usize {
        (self.raw.len() - 4) / 12
    }

    /// Whether there are no ranges.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `(first page, page count)` ranges in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + 'a {
        self.raw[4..].chunks_exact(12).map(|c| {
            (
                u64::from_le_bytes(c[..8].try_into().expect("8 bytes")),
                u32::from_le_bytes(c[8..].try_into().expect("4 bytes")),
            )
        })
    }
}

/// A bounds-checked reader over one payload.
struct Cursor<'a> {
    kind: MessageKind,
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn malformed(&self, why: String) -> ProtoError {
        ProtoError::Malformed {
            kind: self.kind,
            why,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        let remaining = self.buf.len() - self.pos;
        if n > remaining {
            return Err(self.malformed(format!(
                "needs {n} more bytes at offset {} but only {remaining} remain",
                self.pos
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ProtoError> {
        Ok(self.take(N)?.try_into().expect("length checked"))
    }

    fn u16(&mut self) -> Result<u16, ProtoError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn text(&mut self) -> Result<&'a str, ProtoError> {
        let len = self.u32()? as usize;
        if len > MAX_TEXT_LEN {
            return Err(self.malformed(format!("text of {len} bytes exceeds {MAX_TEXT_LEN}")));
        }
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes).map_err(|e| self.malformed(format!("text is not UTF-8: {e}")))
    }

    /// A `u32` count followed by `count` fixed-size items; returns the whole encoding (count
    /// included) after checking the count against `max` and the bytes actually present.
    fn counted(&mut self, item: usize, max: usize) -> Result<&'a [u8], ProtoError> {
        let start = self.pos;
        let count = self.u32()? as usize;
        if count > max {
            return Err(self.malformed(format!("count {count} exceeds the limit of {max}")));
        }
        self.take(count * item)?;
        Ok(&self.buf[start..self.pos])
    }

    /// A [`PageBatch`]: a `u32` count, then `count` entries of (`u64` id, `u64` version, `u32`
    /// len, `len` bytes). Checks the count against [`MAX_BATCH_PAGES`] and every entry's length against
    /// `1..=MAX_BLOB_SIZE` and the bytes actually present, before the batch is handed out.
    fn batch(&mut self) -> Result<PageBatch<'a>, ProtoError> {
        let start = self.pos;
        let count = self.u32()? as usize;
        if count > MAX_BATCH_PAGES {
            return Err(self.malformed(format!(
                "count {count} exceeds the limit of {MAX_BATCH_PAGES}"
            )));
        }
        for i in 0..count {
            let at = self.pos;
            let truncated = |c: &Self| {
                c.malformed(format!(
                    "entry {i} of {count} at offset {at} is truncated ({} bytes remain)",
                    c.buf.len() - at
                ))
            };
            if self.buf.len() - self.pos < ENTRY_HEADER {
                return Err(truncated(self));
            }
            self.u64()?;
            self.u64()?;
            let len = self.u32()? as usize;
            if !(1..=MAX_BLOB_SIZE).contains(&len) {
                return Err(self.malformed(format!(
                    "entry {i} of {count} has length {len}, outside 1..={MAX_BLOB_SIZE}"
                )));
            }
            if self.buf.len() - self.pos < len {
                return Err(truncated(self));
            }
            self.take(len)?;
        }
        Ok(PageBatch {
            raw: &self.buf[start..self.pos],
            count,
        })
    }

    fn finish(&self) -> Result<(), ProtoError> {
        if self.pos != self.buf.len() {
            return Err(self.malformed(format!(
                "{} trailing bytes after the message",
                self.buf.len() - self.pos
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MAX_PAYLOAD, PAGE_SIZE};

    fn round_trip(msg: Message<'_>) {
        let mut buf = Vec::new();
        msg.encode(&mut buf);
        let back = Message::decode(msg.kind(), &buf).unwrap();
        assert_eq!(back, msg);
    }

    #[test]
    fn every_kind_round_trips() {
        let mut ids = Vec::new();
        PageIds::encode_into(&mut ids, &[1, 2, u64::MAX]);
        let mut batch = Vec::new();
        PageBatch::begin(&mut batch);
        PageBatch::push(&mut batch, 5, 50, &[7u8; PAGE_SIZE]);
        PageBatch::push_slot(&mut batch, 6, u64::MAX, 100).fill(9);
        PageBatch::push(&mut batch, 7, 0, &[1]);
        PageBatch::push(&mut batch, 8, 1, &[2u8; MAX_BLOB_SIZE]);
        let mut ranges = Vec::new();
        PageRanges::encode_into(&mut ranges, &[(0, 10), (100, 1)]);
        let mut copies = Vec::new();
        PageVersions::encode_into(&mut copies, &[(3, 30), (u64::MAX, 0)]);
        for msg in [
            Message::Challenge { nonce: [3; 32] },
            Message::Auth {
                client_nonce: [1; 32],
                session_id: 42,
                session_key: [2; 16],
                proof: [4; 32],
                client_name: "pager@host",
            },
            Message::Welcome {
                session_id: 42,
                session_key: [2; 16],
                proof: [5; 32],
                capacity_bytes: 1 << 32,
                lease_ms: 30_000,
            },
            Message::Read {
                pages: PageIds::from_encoded(&ids),
            },
            Message::Pages {
                batch: PageBatch::from_encoded(&batch),
            },
            Message::Write {
                batch: PageBatch::from_encoded(&batch),
            },
            Message::Ack { count: 3 },
            Message::Free {
                ranges: PageRanges::from_encoded(&ranges),
            },
            Message::Ping,
            Message::Drain,
            Message::Fork,
            Message::Prefetch {
                deadline_us: 1500,
                pages: PageIds::from_encoded(&ids),
            },
            Message::Forget {
                copies: PageVersions::from_encoded(&copies),
            },
            Message::Forked {
                session_id: 7,
                session_key: [9; SESSION_KEY_LEN],
            },
            Message::Pong,
            Message::StatsRequest,
            Message::Stats { json: "{\"a\":1}" },
            Message::Goodbye,
            Message::Error {
                code: ErrorCode::Full,
                message: "memnode full",
            },
            Message::GrantRequest { pages: 16384 },
            Message::Grant {
                slab_id: 3,
                pages: 16384,
            },
        ] {
            round_trip(msg);
        }
        let b = PageBatch::from_encoded(&batch);
        assert_eq!(b.len(), 4);
        assert_eq!(b.get(1).0, 6);
        assert_eq!(b.get(1).1, u64::MAX);
        assert_eq!(b.get(1).2.len(), 100);
        assert!(b.get(1).2.iter().all(|&x| x == 9));
        let entries: Vec<(u64, u64, usize)> = b.iter().map(|(id, v, d)| (id, v, d.len())).collect();
        assert_eq!(
            entries,
            vec![
                (5, 50, PAGE_SIZE),
                (6, u64::MAX, 100),
                (7, 0, 1),
                (8, 1, MAX_BLOB_SIZE)
            ]
        );
        assert_eq!(b.get(3).2, &[2u8; MAX_BLOB_SIZE][..]);
        let ids = PageIds::from_encoded(&ids);
        assert_eq!(ids.iter().collect::<Vec<_>>(), vec![1, 2, u64::MAX]);
    }

    #[test]
    fn counts_beyond_bounds_are_rejected_before_reading() {
        let mut p = Vec::new();
        p.extend_from_slice(&(MAX_BATCH_PAGES as u32 + 1).to_le_bytes());
        let err = Message::decode(MessageKind::Read, &p).unwrap_err();
        assert!(err.to_string().contains("exceeds the limit"), "{err}");
        let err = Message::decode(MessageKind::Write, &p).unwrap_err();
        assert!(err.to_string().contains("exceeds the limit"), "{err}");
    }

    #[test]
    fn counts_larger_than_payload_are_rejected() {
        let mut p = Vec::new();
        p.extend_from_slice(&3u32.to_le_bytes());
        p.extend_from_slice(&1u64.to_le_bytes());
        let err = Message::decode(MessageKind::Read, &p).unwrap_err();
        assert!(err.to_string().contains("more bytes"), "{err}");
    }

    #[test]
    fn trailing_bytes_and_bad_text_are_rejected() {
        let err = Message::decode(MessageKind::Ping, &[0]).unwrap_err();
        assert!(err.to_string().contains("trailing"), "{err}");
        let mut p = Vec::new();
        p.extend_from_slice(&2u32.to_le_bytes());
        p.extend_from_slice(&[0xff, 0xfe]);
        let err = Message::decode(MessageKind::Stats, &p).unwrap_err();
        assert!(err.to_string().contains("UTF-8"), "{err}");
        let mut p = Vec::new();
        p.extend_from_slice(&(MAX_TEXT_LEN as u32 + 1).to_le_bytes());
        let err = Message::decode(MessageKind::Stats, &p).unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");
        let err = Message::decode(MessageKind::Error, &[99, 0, 0, 0, 0, 0]).unwrap_err();
        assert!(err.to_string().contains("unknown error code"), "{err}");
    }

    /// Deterministic garbage and mutations of valid frames must never panic the decoder.
    #[test]
    fn decoder_survives_garbage() {
        let mut rng = gleaner_sys::rng::XorShift64::from_state(0x9E37_79B9_7F4A_7C15);
        let mut next = move || rng.next_u64();
        let mut valid = Vec::new();
        PageBatch::begin(&mut valid);
        PageBatch::push(&mut valid, 1, 3, &[1u8; 37]);
        PageBatch::push(&mut valid, 2, 4, &[2u8; PAGE_SIZE]);
        for _ in 0..20_000 {
            let kind = MessageKind::from_u8((next() % 17 + 1) as u8).unwrap();
            let len = (next() % 64) as usize;
            let mut payload: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if next() % 2 == 0 {
                payload = valid.clone();
                let i = (next() as usize) % payload.len();
                payload[i] ^= next() as u8 | 1;
                payload.truncate((next() as usize) % (payload.len() + 1));
            }
            if let Ok(Message::Pages { batch } | Message::Write { batch }) =
                Message::decode(kind, &payload)
            {
                // Whatever decodes is a batch whose walk matches its count and bounds.
                assert_eq!(batch.iter().count(), batch.len());
                assert!(batch
                    .iter()
                    .all(|(_, _, d)| (1..=MAX_BLOB_SIZE).contains(&d.len())));
            }
        }
    }

    /// A batch payload from raw `(id, declared len, data)` entries (version = id + 100), with a
    /// chosen count.
    fn raw_batch(count: u32, entries: &[(u64, u32, &[u8])]) -> Vec<u8> {
        let mut p = count.to_le_bytes().to_vec();
        for (id, len, data) in entries {
            p.extend_from_slice(&id.to_le_bytes());
            p.extend_from_slice(&(id + 100).to_le_bytes());
            p.extend_from_slice(&len.to_le_bytes());
            p.extend_from_slice(data);
        }
        p
    }

    /// Decodes `p` as both batch-carrying kinds; both must fail with a message containing `want`.
    fn assert_batch_rejected(p: &[u8], want: &str) {
        for kind in [MessageKind::Write, MessageKind::Pages] {
            let err = Message::decode(kind, p).unwrap_err();
            assert!(
                matches!(err, ProtoError::Malformed { kind: k, .. } if k == kind),
                "{err}"
            );
            assert!(err.to_string().contains(want), "{kind:?}: {err}");
        }
    }

    #[test]
    fn batch_entries_of_length_zero_are_rejected() {
        let p = raw_batch(2, &[(1, 3, &[1, 2, 3]), (2, 0, &[])]);
        assert_batch_rejected(&p, "entry 1 of 2 has length 0, outside 1..=4160");
    }

    #[test]
    fn batch_entries_longer_than_a_blob_are_rejected() {
        let big = vec![0u8; MAX_BLOB_SIZE + 1];
        let p = raw_batch(1, &[(1, big.len() as u32, &big)]);
        assert_batch_rejected(&p, "entry 0 of 1 has length 4161, outside 1..=4160");
        // A huge declared length is refused by the bound, not by reading past the payload.
        let p = raw_batch(1, &[(1, u32::MAX, &[0; 16])]);
        assert_batch_rejected(&p, "has length 4294967295");
        // Exactly MAX_BLOB_SIZE is fine.
        let max = vec![3u8; MAX_BLOB_SIZE];
        let p = raw_batch(1, &[(9, max.len() as u32, &max)]);
        let Message::Write { batch } = Message::decode(MessageKind::Write, &p).unwrap() else {
            panic!("not a write");
        };
        assert_eq!(batch.get(0), (9, 109, &max[..]));
    }

    #[test]
    fn truncated_batch_entries_are_rejected() {
        // The data is shorter than the entry's declared length.
        let p = raw_batch(1, &[(1, 100, &[0; 99])]);
        assert_batch_rejected(
            &p,
            "entry 0 of 1 at offset 4 is truncated (119 bytes remain)",
        );
        // The entry header itself is cut (an id, a version and half a length).
        let mut p = raw_batch(2, &[(1, 2, &[5, 6])]);
        p.extend_from_slice(&7u64.to_le_bytes());
        p.extend_from_slice(&8u64.to_le_bytes());
        p.extend_from_slice(&[1, 0]);
        assert_batch_rejected(
            &p,
            "entry 1 of 2 at offset 26 is truncated (18 bytes remain)",
        );
        // The count promises more entries than are present.
        let p = raw_batch(3, &[(1, 1, &[1])]);
        assert_batch_rejected(
            &p,
            "entry 1 of 3 at offset 25 is truncated (0 bytes remain)",
        );
    }

    #[test]
    fn trailing_bytes_after_a_batch_are_rejected() {
        let mut p = raw_batch(1, &[(1, 4, &[1, 2, 3, 4])]);
        p.push(0);
        assert_batch_rejected(&p, "1 trailing bytes");
        // Entries beyond the count are trailing bytes too, not extra entries.
        let p = raw_batch(1, &[(1, 1, &[1]), (2, 1, &[2])]);
        assert_batch_rejected(&p, "21 trailing bytes");
        // An empty batch is just its count.
        let empty = 0u32.to_le_bytes();
        let Message::Pages { batch } = Message::decode(MessageKind::Pages, &empty).unwrap() else {
            panic!("not pages");
        };
        assert!(batch.is_empty());
        assert_eq!(batch.iter().count(), 0);
    }

    #[test]
    fn batch_counts_beyond_the_limit_are_rejected_before_any_entry() {
        // The count alone decides: no entry follows, and none is read.
        let p = raw_batch(MAX_BATCH_PAGES as u32 + 1, &[]);
        assert_batch_rejected(&p, "count 257 exceeds the limit of 256");
        let p = raw_batch(u32::MAX, &[]);
        assert_batch_rejected(&p, "exceeds the limit");
    }

    #[test]
    fn a_full_batch_of_maximal_blobs_fits_the_payload_bound() {
        let mut out = Vec::new();
        PageBatch::begin(&mut out);
        for id in 0..MAX_BATCH_PAGES as u64 {
            PageBatch::push_slot(&mut out, id, id * 3, MAX_BLOB_SIZE).fill(id as u8);
        }
        assert_eq!(out.len(), MAX_PAYLOAD);
        let Message::Write { batch } = Message::decode(MessageKind::Write, &out).unwrap() else {
            panic!("not a write");
        };
        assert_eq!(batch.len(), MAX_BATCH_PAGES);
        for (i, (id, version, data)) in batch.iter().enumerate() {
            assert_eq!(id, i as u64);
            assert_eq!(version, id * 3);
            assert_eq!(data.len(), MAX_BLOB_SIZE);
            assert!(data.iter().all(|&b| b == i as u8));
        }
    }

    /// The fuzzer's seeds (written by `fuzz/make_seeds.py`) are valid frames of this version.
    #[test]
    fn fuzz_seeds_are_valid_frames() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/decode_frame");
        let mut seeds = 0;
        let mut kinds = std::collections::HashSet::new();
        for entry in std::fs::read_dir(&dir).expect("the fuzz seeds directory") {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            let mut input = &bytes[..];
            let mut payload = Vec::new();
            while !input.is_empty() {
                let h = crate::read_frame(&mut input, &mut payload)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                Message::decode(h.kind, &payload)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                kinds.insert(h.kind as u8);
            }
            seeds += 1;
        }
        let all = (0..=u8::MAX)
            .filter(|&b| MessageKind::from_u8(b).is_some())
            .count();
        assert!(seeds >= all, "only {seeds} seeds in {}", dir.display());
        assert_eq!(kinds.len(), all, "every message kind has a seed");
    }

    #[test]
    #[should_panic(expected = "must be 1 to 4160 bytes, not 0")]
    fn pushing_an_empty_entry_panics() {
        let mut out = Vec::new();
        PageBatch::begin(&mut out);
        PageBatch::push(&mut out, 1, 0, &[]);
    }

    #[test]
    #[should_panic(expected = "must be 1 to 4160 bytes, not 4161")]
    fn pushing_an_oversized_slot_panics() {
        let mut out = Vec::new();
        PageBatch::begin(&mut out);
        PageBatch::push_slot(&mut out, 1, 0, MAX_BLOB_SIZE + 1);
    }

    #[test]
    #[should_panic(expected = "page batch too large")]
    fn pushing_past_the_batch_limit_panics() {
        let mut out = Vec::new();
        PageBatch::begin(&mut out);
        for id in 0..=MAX_BATCH_PAGES as u64 {
            PageBatch::push(&mut out, id, 0, &[0]);
        }
    }
}
