//! One client connection: the handshake, then one request at a time until the peer leaves.
//!
//! Each connection runs on its own thread with blocking I/O and keeps its buffers (receive,
//! send, staged pages) across requests. Locks (session table, a session's pages) are taken only
//! around in-memory work, never across a socket read or write.
//!
//! Before authentication the only acceptable frame is `Auth`, bounded to [`MAX_AUTH_PAYLOAD`]
//! bytes and required to arrive whole within the handshake timeout (a total deadline, not a
//! per-read one), so unauthenticated peers can hold neither much memory nor a thread for long.
//!
//! Anything malformed (a bad header, an oversized length, a truncated frame, an undecodable
//! payload, a request before authentication, a server-to-client message) ends the connection: it
//! is logged with the peer's address, counted in `malformed_frames`, answered with a best-effort
//! `Error{BadRequest}`, and the socket is shut down. Other connections are unaffected.

use std::io::{self, BufReader, Read};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use gleaner_proto::{
    client_proof, proofs_equal, random_bytes, read_frame, server_proof, write_frame, ErrorCode,
    FrameHeader, Message, MessageKind, Nonce, ProtoError, Stream, HEADER_LEN, NONCE_LEN, PROOF_LEN,
    READ_AHEAD, SESSION_KEY_LEN,
};

use std::os::fd::AsFd;

use gleaner_proto::fdpass::write_frame_with_fd;
use gleaner_proto::units::format_size;

use crate::sched::Class;
use crate::session::{AttachError, Session};
use crate::shared::Shared;
use crate::slabs::GrantError;
use crate::stats::bump;
use crate::store::{stage, Blob, Capacity, Released, SessionPages, Staged};

/// Longest `Auth` payload accepted: its fixed fields plus a client name of up to 4 KiB. Before
/// authentication nothing larger is legitimate, so nothing larger is allocated.
pub(crate) const MAX_AUTH_PAYLOAD: usize =
    NONCE_LEN + 8 + SESSION_KEY_LEN + PROOF_LEN + 4 + MAX_AUTH_CLIENT_NAME;
/// Longest client name accepted in `Auth` (names are cut to 128 bytes when stored).
pub(crate) const MAX_AUTH_CLIENT_NAME: usize = 4096;

/// Serves one accepted connection until it ends, then shuts the socket down.
pub(crate) fn handle(shared: &Shared, stream: Stream, peer: &str) {
    let mut conn = Conn {
        shared,
        peer,
        stream: BufReader::with_capacity(READ_AHEAD, stream),
        rx: Vec::new(),
        tx: Vec::new(),
        staged: Vec::new(),
        order: Vec::new(),
        replaced: Vec::new(),
    };
    let end = match conn.handshake() {
        Ok(session) => {
            let end = conn.serve(&session);
            if !matches!(end, End::Goodbye) {
                shared.sessions.detach(&session);
            }
            end
        }
        Err(end) => end,
    };
    conn.finish(end);
    // Other handles to this socket exist (the server's shutdown registry): shut it down rather
    // than rely on the drop, so the peer sees the end now.
    let _ = conn.stream.get_ref().shutdown();
}

/// Why a connection ended.
enum End {
    /// The peer closed the connection between frames.
    Closed,
    /// The session ended with `Goodbye`.
    Goodbye,
    /// The socket failed (reset, broken pipe, ...).
    Disconnected(io::Error),
    /// The peer sent something that is not a valid request in this state.
    Malformed {
        /// What was wrong.
        reason: String,
        /// The request id of the offending frame, if its header was readable.
        req_id: u32,
    },
    /// No `Auth` arrived within the handshake timeout.
    TimedOut,
    /// The handshake was refused (already logged, counted and answered).
    Refused,
}

/// What to answer a request with.
enum Reply {
    /// The payload of this kind is already encoded in `Conn::tx`.
    Encoded(MessageKind),
    Ack(u32),
    Pong,
    Stats(String),
    Error(ErrorCode, String),
    /// A slab for the client: its number, its pages and its memfd, sent with the frame.
    Grant(u32, u64, std::os::fd::OwnedFd),
    /// A forked session's id and attach key.
    Forked(u64, gleaner_proto::SessionKey),
}

struct Conn<'a> {
    shared: &'a Shared,
    peer: &'a str,
    /// The connection. Requests are read through the buffer; replies are written to the
    /// stream itself (`get_mut`), and so is the one frame read before it, the client's `Auth`.
    stream: BufReader<Stream>,
    /// Receive buffer (one frame payload), reused.
    rx: Vec<u8>,
    /// Send buffer (one reply payload), reused.
    tx: Vec<u8>,
    /// Blobs of a write, copied out of `rx` before the session lock is taken.
    staged: Vec<Staged>,
    /// Scratch for counting the bytes a write adds.
    order: Vec<(u64, usize)>,
    /// Blobs replaced or skipped (stale) by a write, freed after the session lock is released.
    replaced: Vec<Blob>,
}

impl Conn<'_> {
    /// Challenge, verify the client's proof, create or attach the session, answer `Welcome`.
    fn handshake(&mut self) -> Result<Arc<Session>, End> {
        let cfg = &self.shared.config;
        let server_nonce: Nonce = random_bytes();
        self.send(
            0,
            &Message::Challenge {
                nonce: server_nonce,
            },
        )?;
        let header = self.read_auth()?;
        let (client_nonce, session_id, session_key, proof, client_name) =
            match Message::decode(header.kind, &self.rx) {
                Ok(Message::Auth {
                    client_nonce,
                    session_id,
                    session_key,
                    proof,
                    client_name,
                }) => (
                    client_nonce,
                    session_id,
                    session_key,
                    proof,
                    client_name.to_string(),
                ),
                Ok(_) => unreachable!("an Auth header decodes to an Auth message"),
                Err(e) => return Err(malformed(&e, header.req_id)),
            };
        // The token the proof was made with decides the tenant.
        let tenant = self.shared.tenants.iter().find(|t| {
            let expected = client_proof(
                &t.token,
                &server_nonce,
                &client_nonce,
                session_id,
                &session_key,
            );
            proofs_equal(&expected, &proof)
        });
        let Some(tenant) = tenant.cloned() else {
            bump(&self.shared.counters.auth_failures, 1);
            log::warn!(
                "{}: authentication failed: wrong token (client {client_name:?})",
                self.peer
            );
            self.send_error(header.req_id, ErrorCode::AuthFailed, "wrong token");
            return Err(End::Refused);
        };
        let session = if session_id == 0 {
            let s = self.shared.sessions.create(&client_name, &tenant);
            bump(&self.shared.counters.sessions_created, 1);
            log::info!(
                "{}: new session {} for client {:?}",
                self.peer,
                s.id(),
                s.client()
            );
            s
        } else {
            match self
                .shared
                .sessions
                .attach(session_id, &session_key, &tenant)
            {
                Ok(s) => {
                    bump(&self.shared.counters.sessions_attached, 1);
                    log::debug!("{}: attached to session {}", self.peer, s.id());
                    s
                }
                Err(why) => {
                    bump(&self.shared.counters.auth_failures, 1);
                    bump(&self.shared.counters.session_attach_failures, 1);
                    let detail = match why {
                        AttachError::Unknown => "no such session",
                        AttachError::WrongKey => "wrong session key",
                    };
                    log::warn!(
                        "{}: authentication failed: unknown session or wrong session key \
                         (session {session_id}: {detail}; client {client_name:?})",
                        self.peer
                    );
                    self.send_error(
                        header.req_id,
                        ErrorCode::AuthFailed,
                        "unknown session or wrong session key",
                    );
                    return Err(End::Refused);
                }
            }
        };
        let welcome = Message::Welcome {
            session_id: session.id(),
            session_key: session.key(),
            proof: server_proof(&tenant.token, &server_nonce, &client_nonce, session.id()),
            capacity_bytes: tenant.capacity.total(),
            lease_ms: cfg.lease.as_millis().try_into().unwrap_or(u64::MAX),
        };
        let sent = self.send(header.req_id, &welcome).and_then(|_| {
            self.stream
                .get_ref()
                .set_read_timeout(None)
                .map_err(End::Disconnected)
        });
        if let Err(end) = sent {
            self.shared.sessions.detach(&session);
            return Err(end);
        }
        Ok(session)
    }

    /// Serves requests on an authenticated connection until it ends.
    fn serve(&mut self, session: &Arc<Session>) -> End {
        loop {
            let header = match self.read() {
                Ok(h) => h,
                Err(end) => return end,
            };
            session
                .bytes_in
                .fetch_add(frame_len(&header), std::sync::atomic::Ordering::Relaxed);
            let (reply, goodbye) = match self.request(session, &header) {
                Ok(r) => r,
                Err(end) => return end,
            };
            bump(&session.requests, 1);
            match self.send_reply(header.req_id, reply) {
                Ok(n) => bump(&session.bytes_out, n),
                Err(end) => return end,
            }
            if goodbye {
                return End::Goodbye;
            }
        }
    }

    /// Serves a read of `pages` (a demand read or a prefetch, `class`): the reply is encoded
    /// into `tx`, then, with a link, sent only at the request's turn; a prefetch still waiting
    /// past `deadline` at its turn is answered `Error{Late}` instead (nothing sent).
    fn serve_read(
        shared: &Shared,
        tx: &mut Vec<u8>,
        session: &Arc<Session>,
        pages: &gleaner_proto::PageIds<'_>,
        class: Class,
        deadline: Option<std::time::Duration>,
    ) -> Reply {
        let counters = &shared.counters;
        bump(&counters.req_read, 1);
        let store = session.store();
        if store.is_ended() {
            return ended(session);
        }
        if let Err(missing) = store.read_into(pages, tx) {
            bump(&counters.errors_not_found, 1);
            return Reply::Error(ErrorCode::NotFound, missing.to_string());
        }
        drop(store);
        if let Some(link) = &shared.link {
            let bytes = tx.len() as u64;
            let tenant = session.tenant();
            if let Err(late) = link.transfer(
                &tenant.queue,
                tenant.weight,
                session.id(),
                class,
                bytes,
                deadline,
            ) {
                return Reply::Error(
                    ErrorCode::Late,
                    format!(
                        "prefetch dropped: it waited {} us for the link, past its deadline of \
                         {} us",
                        late.waited_us,
                        deadline.map_or(0, |d| d.as_micros())
                    ),
                );
            }
        }
        bump(&counters.pages_read, pages.len() as u64);
        Reply::Encoded(MessageKind::Pages)
    }

    /// Executes one request; returns the reply and whether the session just ended by `Goodbye`.
    fn request(
        &mut self,
        session: &Arc<Session>,
        header: &FrameHeader,
    ) -> Result<(Reply, bool), End> {
        use MessageKind as K;
        match header.kind {
            K::Read
            | K::Prefetch
            | K::Write
            | K::Free
            | K::Forget
            | K::Ping
            | K::StatsRequest
            | K::Goodbye
            | K::Drain
            | K::Fork
            | K::GrantRequest => {}
            K::Auth => {
                return Err(End::Malformed {
                    reason: "Auth frame on an already authenticated connection".into(),
                    req_id: header.req_id,
                })
            }
            K::Challenge
            | K::Welcome
            | K::Pages
            | K::Ack
            | K::Pong
            | K::Stats
            | K::Error
            | K::Forked
            | K::Grant => {
                return Err(End::Malformed {
                    reason: format!("{:?} is a server-to-client message", header.kind),
                    req_id: header.req_id,
                })
            }
        }
        let msg =
            Message::decode(header.kind, &self.rx).map_err(|e| malformed(&e, header.req_id))?;
        let shared = self.shared;
        let counters = &shared.counters;
        let reply = match msg {
            Message::Read { pages } => {
                Self::serve_read(shared, &mut self.tx, session, &pages, Class::Demand, None)
            }
            Message::Prefetch { deadline_us, pages } => {
                let deadline = (deadline_us != u32::MAX)
                    .then(|| std::time::Duration::from_micros(deadline_us.into()));
                Self::serve_read(
                    shared,
                    &mut self.tx,
                    session,
                    &pages,
                    Class::Prefetch,
                    deadline,
                )
            }
            Message::Write { batch } => {
                bump(&counters.req_write, 1);
                if let Some(link) = &shared.link {
                    let bytes = self.rx.len() as u64;
                    let tenant = session.tenant();
                    let _ = link.transfer(
                        &tenant.queue,
                        tenant.weight,
                        session.id(),
                        Class::WriteBack,
                        bytes,
                        None,
                    );
                }
                // Copy the pages out of the receive buffer before taking the lock.
                stage(&batch, &mut self.staged);
                let result = {
                    let mut store = session.store_mut();
                    if store.is_ended() {
                        None
                    } else {
                        Some(store.write(
                            &mut self.staged,
                            session.capacity(),
                            &mut self.order,
                            &mut self.replaced,
                        ))
                    }
                };
                // Free replaced (or refused) blobs outside the lock.
                self.staged.clear();
                self.replaced.clear();
                match result {
                    None => ended(session),
                    Some(Ok(written)) => {
                        bump(&counters.pages_written, batch.len() as u64);
                        bump(&counters.stale_writes, written.stale);
                        Reply::Ack(batch.len() as u32)
                    }
                    Some(Err(full)) => {
                        bump(&counters.errors_full, 1);
                        log::debug!("session {}: {full}", session.id());
                        Reply::Error(ErrorCode::Full, full.to_string())
                    }
                }
            }
            Message::Free { ranges } => {
                bump(&counters.req_free, 1);
                remove_pages(session, &counters.pages_freed, |store, capacity| {
                    store.free(&ranges, capacity)
                })
            }
            Message::Forget { copies } => {
                bump(&counters.req_forget, 1);
                remove_pages(session, &counters.copies_forgotten, |store, capacity| {
                    store.forget(&copies, capacity)
                })
            }
            Message::Ping => {
                bump(&counters.req_ping, 1);
                if shared.is_draining() {
                    // How clients in a pool learn to move their pages elsewhere.
                    Reply::Error(
                        ErrorCode::Draining,
                        "this memnode is draining: move your pages to other memnodes and end \
                         the session (reads and writes are still served)"
                            .into(),
                    )
                } else {
                    Reply::Pong
                }
            }
            Message::Drain if !shared.is_main_tenant(session.tenant()) => Reply::Error(
                ErrorCode::BadRequest,
                format!(
                    "tenant {} may not drain the memnode: draining takes it down for every \
                     tenant; only the memnode's own token (--token-file) may",
                    session.tenant().name
                ),
            ),
            Message::Drain => {
                let sessions = shared.sessions.snapshot().len();
                if !shared.start_draining() {
                    log::info!(
                        "draining (asked by {}): {sessions} sessions to leave; exiting once none \
                         is left",
                        self.peer
                    );
                }
                Reply::Ack(u32::try_from(sessions).unwrap_or(u32::MAX))
            }
            Message::Fork => {
                let client = format!("{} (fork)", session.client());
                match shared.sessions.fork(session, &client) {
                    Ok(None) => ended(session),
                    Ok(Some(child)) => {
                        log::info!(
                            "session {} forked into session {} ({} pages)",
                            session.id(),
                            child.id(),
                            child.store().len()
                        );
                        Reply::Forked(child.id(), child.key())
                    }
                    Err(full) => {
                        bump(&counters.errors_full, 1);
                        Reply::Error(ErrorCode::Full, full.to_string())
                    }
                }
            }
            Message::GrantRequest { pages } => {
                bump(&counters.req_grant, 1);
                if !matches!(self.stream.get_ref(), Stream::Unix(_)) {
                    Reply::Error(
                        ErrorCode::BadRequest,
                        "shared-memory slabs are granted only over a Unix socket (a client on \
                         this host); use Read and Write over TCP"
                            .into(),
                    )
                } else {
                    match session.grant(pages, session.capacity()) {
                        Ok(None) => ended(session),
                        Ok(Some((id, granted, fd))) => {
                            bump(&counters.slabs_granted, 1);
                            bump(&counters.slab_pages_granted, granted);
                            log::debug!(
                                "session {}: slab {id} of {granted} pages granted",
                                session.id()
                            );
                            Reply::Grant(id, granted, fd)
                        }
                        Err(e @ GrantError::Full { .. }) => {
                            bump(&counters.errors_full, 1);
                            Reply::Error(ErrorCode::Full, e.to_string())
                        }
                        Err(e @ GrantError::Refused(_)) => {
                            Reply::Error(ErrorCode::BadRequest, e.to_string())
                        }
                        Err(e @ GrantError::Os(_)) => {
                            log::warn!("session {}: {e}", session.id());
                            Reply::Error(ErrorCode::Internal, e.to_string())
                        }
                    }
                }
            }
            Message::StatsRequest => {
                bump(&counters.req_stats, 1);
                Reply::Stats(shared.stats_json_for(session.tenant()))
            }
            Message::Goodbye => {
                bump(&counters.req_goodbye, 1);
                let removed = shared.sessions.remove(session);
                let released = session.end(session.capacity());
                if removed {
                    bump(&counters.sessions_ended_by_goodbye, 1);
                    log::info!(
                        "{}: session {} ({:?}) ended by goodbye; released {} pages ({})",
                        self.peer,
                        session.id(),
                        session.client(),
                        released.pages,
                        format_size(released.bytes)
                    );
                }
                return Ok((
                    Reply::Ack(u32::try_from(released.pages).unwrap_or(u32::MAX)),
                    true,
                ));
            }
            _ => unreachable!("server-to-client kinds were rejected above"),
        };
        Ok((reply, false))
    }

    /// Reads one request frame into `rx`.
    fn read(&mut self) -> Result<FrameHeader, End> {
        let r = read_frame(&mut self.stream, &mut self.rx);
        self.frame_read(r)
    }

    /// Reads the client's `Auth` frame into `rx`: the whole frame must arrive within the
    /// handshake timeout, and its length is checked against [`MAX_AUTH_PAYLOAD`] before anything
    /// is allocated, so unauthenticated peers cost little memory and time.
    fn read_auth(&mut self) -> Result<FrameHeader, End> {
        let deadline = Instant::now() + self.shared.config.handshake_timeout;
        // The Auth frame is the connection's first, read exactly: nothing is buffered yet, and
        // nothing of the next frame is taken.
        debug_assert!(self.stream.buffer().is_empty());
        let mut reader = Deadline {
            stream: self.stream.get_mut(),
            deadline,
        };
        let mut hdr = [0u8; HEADER_LEN];
        let r = match read_full(&mut reader, &mut hdr) {
            Ok(0) => Err(ProtoError::Closed),
            Ok(n) if n < HEADER_LEN => Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            Ok(_) => {
                let header = FrameHeader::decode(&hdr).map_err(|e| malformed(&e, 0))?;
                if header.kind != MessageKind::Auth {
                    return Err(End::Malformed {
                        reason: format!("{:?} frame before authentication", header.kind),
                        req_id: header.req_id,
                    });
                }
                if header.len as usize > MAX_AUTH_PAYLOAD {
                    return Err(End::Malformed {
                        reason: format!(
                            "Auth payload of {} bytes exceeds the limit of {MAX_AUTH_PAYLOAD}",
                            header.len
                        ),
                        req_id: header.req_id,
                    });
                }
                // Let the protocol's own reader decode the header again and read the payload.
                read_frame(&mut (&hdr[..]).chain(&mut reader), &mut self.rx)
            }
            Err(e) => Err(e.into()),
        };
        self.frame_read(r)
    }

    /// Maps the outcome of reading a frame to how the connection ends, counting bytes.
    fn frame_read(&self, r: Result<FrameHeader, ProtoError>) -> Result<FrameHeader, End> {
        match r {
            Ok(h) => {
                bump(&self.shared.counters.bytes_in, frame_len(&h));
                Ok(h)
            }
            Err(ProtoError::Closed) => Err(End::Closed),
            Err(ProtoError::Io(e)) => Err(match e.kind() {
                io::ErrorKind::UnexpectedEof => End::Malformed {
                    reason: "truncated frame (the connection closed mid-frame)".into(),
                    req_id: 0,
                },
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => End::TimedOut,
                _ => End::Disconnected(e),
            }),
            Err(e) => Err(malformed(&e, 0)),
        }
    }

    /// Sends one message; returns the frame bytes sent.
    fn send(&mut self, req_id: u32, msg: &Message<'_>) -> Result<u64, End> {
        msg.send(self.stream.get_mut(), req_id, &mut self.tx)
            .map_err(send_failed)?;
        let n = (HEADER_LEN + self.tx.len()) as u64;
        bump(&self.shared.counters.bytes_out, n);
        Ok(n)
    }

    fn send_reply(&mut self, req_id: u32, reply: Reply) -> Result<u64, End> {
        match reply {
            Reply::Encoded(kind) => {
                write_frame(self.stream.get_mut(), kind, req_id, &self.tx).map_err(send_failed)?;
                let n = (HEADER_LEN + self.tx.len()) as u64;
                bump(&self.shared.counters.bytes_out, n);
                Ok(n)
            }
            Reply::Ack(count) => self.send(req_id, &Message::Ack { count }),
            Reply::Pong => self.send(req_id, &Message::Pong),
            Reply::Forked(session_id, session_key) => self.send(
                req_id,
                &Message::Forked {
                    session_id,
                    session_key,
                },
            ),
            Reply::Stats(json) => self.send(req_id, &Message::Stats { json: &json }),
            Reply::Error(code, message) => self.send(
                req_id,
                &Message::Error {
                    code,
                    message: &message,
                },
            ),
            Reply::Grant(slab_id, pages, fd) => {
                let Stream::Unix(sock) = self.stream.get_ref() else {
                    unreachable!("grants are refused on TCP connections");
                };
                self.tx.clear();
                Message::Grant { slab_id, pages }.encode(&mut self.tx);
                write_frame_with_fd(sock, MessageKind::Grant, req_id, &self.tx, fd.as_fd())
                    .map_err(send_failed)?;
                let n = (HEADER_LEN + self.tx.len()) as u64;
                bump(&self.shared.counters.bytes_out, n);
                Ok(n)
            }
        }
    }

    /// Sends an error reply, ignoring failure (the connection is about to close anyway).
    fn send_error(&mut self, req_id: u32, code: ErrorCode, message: &str) {
        let _ = self.send(req_id, &Message::Error { code, message });
    }

    /// Logs and counts how the connection ended.
    fn finish(&mut self, end: End) {
        let stopping = self.shared.is_stopping();
        let peer = self.peer;
        match end {
            End::Closed | End::Goodbye | End::Refused => {
                log::debug!("{peer}: connection closed");
            }
            End::Disconnected(e) if stopping => log::debug!("{peer}: closed at shutdown: {e}"),
            End::Disconnected(e) => log::info!("{peer}: connection lost: {e}"),
            End::Malformed { reason, .. } if stopping => {
                log::debug!("{peer}: closed at shutdown: {reason}");
            }
            End::Malformed { reason, req_id } => {
                bump(&self.shared.counters.malformed_frames, 1);
                log::warn!("{peer}: malformed input, dropping the connection: {reason}");
                self.send_error(req_id, ErrorCode::BadRequest, &reason);
            }
            End::TimedOut => {
                bump(&self.shared.counters.handshake_timeouts, 1);
                log::warn!(
                    "{peer}: did not authenticate within {:?}; dropping the connection",
                    self.shared.config.handshake_timeout
                );
            }
        }
    }
}

/// A reader whose reads all end by one deadline (the handshake's), however slowly the peer
/// sends.
struct Deadline<'a> {
    stream: &'a mut Stream,
    deadline: Instant,
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

/// Reads until `buf` is full or the peer closes; returns the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Removes pages from `session`'s store with `remove` (a free or a forget), adds how many to
/// `removed` and acknowledges that many; a session already ended gets the error saying so.
fn remove_pages(
    session: &Session,
    removed: &AtomicU64,
    remove: impl FnOnce(&mut SessionPages, &Capacity) -> Released,
) -> Reply {
    let r = {
        let mut store = session.store_mut();
        if store.is_ended() {
            return ended(session);
        }
        remove(&mut store, session.capacity())
    };
    bump(removed, r.pages);
    Reply::Ack(u32::try_from(r.pages).unwrap_or(u32::MAX))
}

/// The reply to any page request on a session that another connection ended with `Goodbye`.
fn ended(session: &Session) -> Reply {
    Reply::Error(
        ErrorCode::BadRequest,
        format!(
            "session {} has ended (Goodbye on another connection)",
            session.id()
        ),
    )
}

fn malformed(e: &ProtoError, req_id: u32) -> End {
    End::Malformed {
        reason: e.to_string(),
        req_id,
    }
}

fn send_failed(e: ProtoError) -> End {
    match e {
        ProtoError::Io(e) => End::Disconnected(e),
        // Only an oversized payload, which the server never builds.
        other => End::Disconnected(io::Error::other(other.to_string())),
    }
}

fn frame_len(h: &FrameHeader) -> u64 {
    HEADER_LEN as u64 + u64::from(h.len)
}
