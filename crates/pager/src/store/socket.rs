//! The socket store: pages travel in batched `Read` and `Write` requests to the memnode, which
//! keeps the index. Works with any memnode, over TCP or a Unix socket. Each thread that uses the
//! store has its own connection attached to the session, so demand fetches never queue behind
//! write-backs. Pages travel as the codec's blobs (compressed, sealed); the client keeps only
//! each page's version, to open its blob with.
//!
//! A connection that breaks or stops answering is replaced by a new one attached to the same
//! session, with bounded backoff, for as long as the memnode keeps the session (its lease), and
//! the request is sent again: reads and write batches are idempotent (a batch carries the same
//! blobs, versions included). The program only waits. Past the lease, or when the memnode no
//! longer knows the session, the data is lost and the error says so.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use gleaner_proto::{
    ClientError, ConnectOptions, Connection, Endpoint, ErrorCode, PageBatch, PendingRead,
    SessionKey, Token,
};

use super::{Bell, BlobHandle, BlobStore, FarCopy, StoreError, StoreStats};
use crate::codec::versions::Versions;
use crate::codec::{Encoded, ENCODE_ROOM};
use crate::PagerError;

/// A memnode session: the address and credentials to attach more connections, and the first
/// connection, kept for session-wide requests (free, grants, goodbye).
pub(crate) struct MemnodeSession {
    endpoint: Endpoint,
    token: Token,
    opts: ConnectOptions,
    id: (u64, SessionKey),
    capacity_pages: u64,
    /// How long the memnode keeps the session without a connection.
    lease: Duration,
    /// How long a broken connection is retried: the lease, unless set shorter.
    window: Duration,
    /// Whether a refused connection ends the retries at once (nobody listens there: with other
    /// replicas to turn to, waiting for a restart only stalls the program).
    refusal_is_final: bool,
    control: Mutex<Option<Connection>>,
    /// Broken connections replaced by a new one.
    reconnects: AtomicU64,
    /// Whether a reconnection was logged as a warning (the first one is).
    warned: AtomicBool,
}

/// The most reconnections one request may take before its data is given up as unreachable (a
/// connection that breaks again at once, over and over).
const MAX_RECONNECTS_PER_REQUEST: u32 = 8;

/// The shortest reconnection window, whatever lease the memnode announces.
const MIN_RECONNECT_WINDOW: Duration = Duration::from_secs(1);

impl MemnodeSession {
    /// Connects, authenticates and creates the session.
    pub(crate) fn open(
        endpoint: Endpoint,
        token: Token,
        opts: ConnectOptions,
    ) -> Result<MemnodeSession, PagerError> {
        MemnodeSession::connect(endpoint, token, opts, None)
    }

    /// Connects and authenticates, creating a session, or with `existing` attaching to that
    /// one.
    fn connect(
        endpoint: Endpoint,
        token: Token,
        opts: ConnectOptions,
        existing: Option<(u64, SessionKey)>,
    ) -> Result<MemnodeSession, PagerError> {
        let first = Connection::connect(&endpoint, &token, existing, &opts)?;
        let info = first.session();
        Ok(MemnodeSession {
            endpoint,
            token,
            opts,
            id: (info.session_id, info.session_key),
            capacity_pages: info.capacity_bytes / gleaner_proto::PAGE_SIZE as u64,
            lease: Duration::from_millis(info.lease_ms),
            window: Duration::from_millis(info.lease_ms).max(MIN_RECONNECT_WINDOW),
            refusal_is_final: false,
            control: Mutex::new(Some(first)),
            reconnects: AtomicU64::new(0),
            warned: AtomicBool::new(false),
        })
    }

    /// A connection to session `existing` on the same memnode (a fork child's copy of this
    /// one), as the session it belongs to.
    pub(crate) fn attach_other(
        &self,
        client_name: &str,
        existing: (u64, SessionKey),
    ) -> Result<MemnodeSession, PagerError> {
        self.open_like(client_name, Some(existing))
    }

    fn open_like(
        &self,
        client_name: &str,
        existing: Option<(u64, SessionKey)>,
    ) -> Result<MemnodeSession, PagerError> {
        let opts = ConnectOptions {
            client_name: client_name.to_string(),
            ..self.opts.clone()
        };
        MemnodeSession::connect(self.endpoint.clone(), self.token, opts, existing)
    }

    /// Retries broken connections for `window` (when given) instead of the whole lease, and
    /// then takes a refused connection as final (for a member of a replicated pool).
    pub(crate) fn reconnect_within(mut self, window: Option<Duration>) -> MemnodeSession {
        if let Some(w) = window {
            self.window = w.min(self.window);
            self.refusal_is_final = true;
        }
        self
    }

    /// One more connection attached to the session.
    pub(crate) fn attach(&self) -> Result<Connection, ClientError> {
        Connection::connect(&self.endpoint, &self.token, Some(self.id), &self.opts)
    }

    /// A new connection to the session in place of one that failed with `cause` (a transient
    /// error), retried with backoff from 5 ms to 500 ms for the reconnection window: as long as
    /// the session's lease keeps it on the memnode, or shorter for a member of a replicated pool
    /// (which also gives up at the first refused connection). The error, when none comes, says
    /// why the data is out of reach.
    pub(crate) fn reattach(&self, cause: &ClientError) -> Result<Connection, StoreError> {
        let window = self.window;
        let deadline = Instant::now() + window;
        let mut backoff = Duration::from_millis(5);
        // While it lasts, a line every few seconds says what the program waits for.
        let started = Instant::now();
        let notice_every = gleaner_proto::patience::notice_every(window);
        let mut last_notice = started;
        // The first time is worth a warning; the run's summary counts the rest.
        if !self.warned.swap(true, Ordering::Relaxed) {
            log::warn!("{cause}; reconnecting to the session (further reconnections are counted in the stats, not logged)");
        } else {
            log::debug!("{cause}; reconnecting to the session");
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut opts = self.opts.clone();
            opts.connect_timeout = opts
                .connect_timeout
                .min(left.max(Duration::from_millis(100)));
            match Connection::connect(&self.endpoint, &self.token, Some(self.id), &opts) {
                Ok(conn) => {
                    self.reconnects.fetch_add(1, Ordering::Relaxed);
                    log::info!("reconnected to the memnode at {}", self.endpoint);
                    return Ok(conn);
                }
                Err(e) if self.refusal_is_final && e.is_refused() => {
                    return Err(StoreError::Lost(format!(
                        "nothing listens at {} any more ({e}); the connection had failed: {cause}",
                        self.endpoint
                    )))
                }
                Err(e) if e.is_transient() && Instant::now() + backoff < deadline => {
                    if last_notice.elapsed() >= notice_every {
                        last_notice = Instant::now();
                        log::warn!(
                            "still reconnecting to the memnode at {}: {:.0} s so far; giving up \
                             after {:.0} s{} (last try: {e})",
                            self.endpoint,
                            started.elapsed().as_secs_f64(),
                            window.as_secs_f64(),
                            if window >= self.lease {
                                ", the session's lease"
                            } else {
                                ""
                            }
                        );
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                Err(e @ ClientError::AuthRejected { .. }) => {
                    return Err(StoreError::Lost(format!(
                        "the memnode at {} no longer has this program's session ({e}); the \
                         connection had failed: {cause}",
                        self.endpoint
                    )))
                }
                Err(e) => {
                    return Err(StoreError::Lost(format!(
                        "the memnode at {} could not be reached again within {:.1} s{} ({e}); \
                         the connection had failed: {cause}",
                        self.endpoint,
                        window.as_secs_f64(),
                        if window >= self.lease {
                            " (the session's lease)"
                        } else {
                            ""
                        }
                    )))
                }
            }
        }
    }

    /// Broken connections replaced so far.
    pub(crate) fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// The memnode's address.
    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The memnode's total capacity in pages.
    pub(crate) fn capacity_pages(&self) -> u64 {
        self.capacity_pages
    }

    /// Runs `f` on the session's first connection (None once the session is closed).
    pub(crate) fn with_control<T>(&self, f: impl FnOnce(&mut Connection) -> T) -> Option<T> {
        let mut control = self.control.lock().expect("control connection lock");
        control.as_mut().map(f)
    }

    /// Releases `(first page, count)` ranges on the memnode over the control connection,
    /// replacing it if it broke. Only space is at stake: a failure is logged.
    pub(crate) fn release(&self, ranges: &[(u64, u32)]) {
        self.with_control(|conn| {
            for chunk in ranges.chunks(gleaner_proto::MAX_FREE_RANGES) {
                let mut tries = 0;
                loop {
                    match conn.free(chunk) {
                        Ok(()) => break,
                        Err(e) if e.is_transient() && tries < MAX_RECONNECTS_PER_REQUEST => {
                            tries += 1;
                            match self.reattach(&e) {
                                Ok(fresh) => *conn = fresh,
                                Err(e) => {
                                    log::warn!(
                                        "releasing discarded pages on {}: {e}",
                                        self.endpoint
                                    );
                                    return;
                                }
                            }
                        }
                        Err(e) => {
                            log::warn!("releasing discarded pages on {}: {e}", self.endpoint);
                            break;
                        }
                    }
                }
            }
        });
    }

    /// Drops the memnode's copies `(page, version)` that are still at that version, over the
    /// control connection (replaced if it broke); returns how many it dropped.
    pub(crate) fn forget(&self, copies: &[(u64, u64)]) -> Result<u32, ClientError> {
        self.with_control(|conn| {
            let mut tries = 0;
            loop {
                match conn.forget(copies) {
                    Err(e) if e.is_transient() && tries < MAX_RECONNECTS_PER_REQUEST => {
                        tries += 1;
                        match self.reattach(&e) {
                            Ok(fresh) => *conn = fresh,
                            Err(_) => return Err(e),
                        }
                    }
                    Err(e) if e.server_code().is_none() || unknown_request(&e) => {
                        // An older memnode does not know the request and closed the
                        // connection (its answer names no request, or says so): give the
                        // session a new one for what follows.
                        if let Ok(fresh) = self.reattach(&e) {
                            *conn = fresh;
                        }
                        return Err(e);
                    }
                    r => return r,
                }
            }
        })
        .unwrap_or(Ok(0))
    }

    /// Ends the session: the memnode releases everything it holds for it.
    pub(crate) fn close(&self) {
        let conn = self.control.lock().map(|mut c| c.take());
        if let Ok(Some(conn)) = conn {
            if let Err(e) = conn.goodbye() {
                log::warn!("ending the memnode session: {e}");
            }
        }
    }
}

/// A session opened when it is first needed, or one already open. A fork child's shared-memory
/// store needs a session of its own only for the slabs its write-backs go to: a child that execs
/// or exits before it evicts anything (a shell's, nearly always) then never opens one, and
/// spares the fork the memnode's handshake (a good part of what paging cost a shell's
/// fork-and-exec: `bench/results/spawn/README.md`). A memnode that cannot be reached then fails the
/// first write-back instead of the fork: exit 86 either way, the pages the child holds never
/// replaced by zeros.
pub(crate) struct LazySession {
    endpoint: Endpoint,
    token: Token,
    opts: ConnectOptions,
    /// The memnode's capacity as the session that made this one was told it.
    capacity_pages: u64,
    session: OnceLock<MemnodeSession>,
    /// Held while the session is being opened: one thread opens it, the others wait for it.
    opening: Mutex<()>,
    /// Closed before it was ever opened: it is not opened any more.
    closed: AtomicBool,
}

impl LazySession {
    /// A session to open on `endpoint` with `token` and `opts` at its first use.
    fn unopened(
        endpoint: Endpoint,
        token: Token,
        opts: ConnectOptions,
        capacity_pages: u64,
    ) -> LazySession {
        LazySession {
            endpoint,
            token,
            opts,
            capacity_pages,
            session: OnceLock::new(),
            opening: Mutex::new(()),
            closed: AtomicBool::new(false),
        }
    }

    /// An open session.
    pub(crate) fn opened(session: MemnodeSession) -> LazySession {
        let lazy = LazySession::unopened(
            session.endpoint.clone(),
            session.token,
            session.opts.clone(),
            session.capacity_pages,
        );
        let _ = lazy.session.set(session);
        lazy
    }

    /// The session, opened now if it was not yet.
    pub(crate) fn get(&self) -> Result<&MemnodeSession, PagerError> {
        if let Some(s) = self.session.get() {
            return Ok(s);
        }
        let _opening = self.opening.lock().expect("session opening lock");
        if let Some(s) = self.session.get() {
            return Ok(s);
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(PagerError::Config(format!(
                "the session on memnode {} is closed",
                self.endpoint
            )));
        }
        let s =
            MemnodeSession::connect(self.endpoint.clone(), self.token, self.opts.clone(), None)?;
        Ok(self.session.get_or_init(|| s))
    }

    /// A new session on the same memnode with the same token and options, its client named
    /// `client_name`, opened at its first use.
    pub(crate) fn deferred_another(&self, client_name: &str) -> LazySession {
        let opts = ConnectOptions {
            client_name: client_name.to_string(),
            ..self.opts.clone()
        };
        LazySession::unopened(self.endpoint.clone(), self.token, opts, self.capacity_pages)
    }

    /// The memnode's address.
    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The memnode's total capacity in pages.
    pub(crate) fn capacity_pages(&self) -> u64 {
        self.session
            .get()
            .map_or(self.capacity_pages, MemnodeSession::capacity_pages)
    }

    /// Ends the session if it was opened; either way it is not opened from now on.
    pub(crate) fn close(&self) {
        let _opening = self.opening.lock().expect("session opening lock");
        self.closed.store(true, Ordering::Release);
        if let Some(s) = self.session.get() {
            s.close();
        }
    }
}

/// Whether the memnode refused a request as a kind it does not know (an older build: it then
/// closes the connection).
fn unknown_request(e: &ClientError) -> bool {
    e.server_code() == Some(ErrorCode::BadRequest) && e.to_string().contains("unknown message kind")
}

/// Reads a token file, turning I/O errors into a message that names the file.
pub(crate) fn load_token(path: &Path) -> Result<Token, PagerError> {
    gleaner_proto::read_token_file(path).map_err(|e| {
        PagerError::Config(format!(
            "cannot read the memnode token from {}: {e}",
            path.display()
        ))
    })
}

/// A client error as a store error: the memnode refusing for lack of room is `Full`, anything
/// else means the data cannot be had.
pub(crate) fn store_error(e: ClientError) -> StoreError {
    if e.server_code() == Some(ErrorCode::Full) {
        StoreError::Full(e.to_string())
    } else if e.server_code() == Some(ErrorCode::Late) {
        StoreError::Late(e.to_string())
    } else if e.server_code() == Some(ErrorCode::NotFound) {
        StoreError::Lost(format!("the memnode no longer holds it ({e})"))
    } else {
        StoreError::Lost(format!("the memnode could not be reached ({e})"))
    }
}

/// Far copies of resident pages, waiting to be dropped on the memnode ([`PageStore::forget`]):
/// the page was written since it came back (its copy is stale), or the region tracks writes
/// asynchronously, and over a socket a far copy is never compared with the page. Kept, such
/// copies take the memnode's room for nothing. A fault only notes the page and the version it
/// fetched; the threads that write back send the notes in batches of [`FORGET_BATCH`] (off the
/// fault path), and all of them at once when the memnode refused a write for lack of room. The
/// memnode drops a copy only if it is still at the version noted, so a note that arrives after
/// the page was written back again drops nothing. Shared by the socket store and the pool.
#[derive(Default)]
pub(crate) struct Forgets {
    pending: Mutex<Vec<(u64, u64)>>,
    /// A memnode does not know `Forget` (an older build): copies are kept, as before.
    unsupported: AtomicBool,
    /// Copies the memnodes dropped.
    dropped: AtomicU64,
}

/// Notes of copies to drop sent in one request: one round trip per 64 fetched pages, on an
/// evicting thread (around a microsecond per page on loopback), keeps the copies not dropped yet to
/// a quarter of a megabyte.
pub(crate) const FORGET_BATCH: usize = 64;

/// Sends one batch of `(page, version)` notes to the memnodes; returns the copies dropped.
pub(crate) type SendForgets<'a> = dyn FnMut(&[(u64, u64)]) -> Result<u32, ClientError> + 'a;

impl Forgets {
    /// Notes that `page`'s copy at `version` can go (version 0: never written, nothing to
    /// drop).
    pub(crate) fn note(&self, page: u64, version: u64) {
        if version != 0 && !self.unsupported.load(Ordering::Relaxed) {
            self.pending
                .lock()
                .expect("forget list lock")
                .push((page, version));
        }
    }

    /// Copies the memnodes dropped so far.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Sends the notes waiting through `send` (which returns the copies dropped), a batch at a
    /// time, while at least `at_least` (and at least one) wait. Only the memnodes' room is at
    /// stake: after a failure (logged once) no more notes are taken or sent, and the copies
    /// stay until the session ends or their pages are written again.
    pub(crate) fn send(&self, at_least: usize, send: &mut SendForgets<'_>) {
        loop {
            let batch: Vec<(u64, u64)> = {
                let mut pending = self.pending.lock().expect("forget list lock");
                if pending.len() < at_least.max(1) {
                    return;
                }
                let n = pending.len().min(FORGET_BATCH);
                pending.drain(..n).collect()
            };
            match send(&batch) {
                Ok(n) => {
                    self.dropped.fetch_add(u64::from(n), Ordering::Relaxed);
                }
                Err(e) => {
                    // An older memnode (it does not know the request), or one that no longer
                    // answers (its retries are spent): only room is at stake, so stop asking.
                    if !self.unsupported.swap(true, Ordering::Relaxed) {
                        log::warn!(
                            "the memnode could not drop the far copies of resident pages ({e}; \
                             an older build?): they keep its room from now on"
                        );
                    }
                    self.pending.lock().expect("forget list lock").clear();
                    return;
                }
            }
        }
    }
}

/// The store over the socket.
pub(crate) struct SocketStore {
    session: Arc<MemnodeSession>,
    /// Per region page: the version of its blob on the memnode (the codec layer's table, read
    /// here to name a far copy to drop).
    versions: Versions,
    /// The copy of the session the memnode made for the fork being prepared (`Fork`), which
    /// the child attaches to.
    child_session: Mutex<Option<(u64, SessionKey)>>,
    /// Far copies of fetched pages to drop.
    forgets: Arc<Forgets>,
}

impl SocketStore {
    /// The store of `session`; `versions` is the codec layer's version table.
    pub(crate) fn new(session: MemnodeSession, versions: Versions) -> SocketStore {
        SocketStore {
            session: Arc::new(session),
            versions,
            child_session: Mutex::new(None),
            forgets: Arc::default(),
        }
    }
}

impl BlobStore for SocketStore {
    fn handle(&self) -> Result<Box<dyn BlobHandle>, PagerError> {
        Ok(Box::new(SocketHandle {
            link: Link::open(&self.session)?,
            pending: None,
            room: vec![0; ENCODE_ROOM],
            forgets: self.forgets.clone(),
        }))
    }

    fn forget(&self, page: u64) {
        if (page as usize) < self.versions.len() {
            self.forgets.note(page, self.versions.get(page));
        }
    }

    fn release(&self, ranges: &[(u64, u32)]) {
        self.session.release(ranges);
    }

    fn close(&self) {
        self.session.close();
    }

    fn can_share_with_child(&self) -> bool {
        true
    }

    fn hold_for_child(&self, _alive: OwnedFd) -> Result<(), StoreError> {
        // The memnode keeps the snapshot, as a session of its own: nothing to hold here.
        let forked = self
            .session
            .with_control(|c| c.fork_session())
            .ok_or_else(|| StoreError::Lost("the memnode session is closed".into()))?
            .map_err(store_error)?;
        *self.child_session.lock().expect("child session lock") = Some(forked);
        Ok(())
    }

    fn fork_child(&self, client_name: &str) -> Result<Box<dyn BlobStore>, PagerError> {
        let forked = self
            .child_session
            .lock()
            .expect("child session lock")
            .take()
            .ok_or_else(|| PagerError::Config("no session was copied for this child".into()))?;
        Ok(Box::new(SocketStore {
            session: Arc::new(self.session.attach_other(client_name, forked)?),
            // This process's copy of the parent's versions: those of the copied session.
            versions: self.versions.clone(),
            child_session: Mutex::new(None),
            forgets: Arc::default(),
        }))
    }

    fn describe(&self) -> String {
        self.session.endpoint().to_string()
    }

    fn capacity_pages(&self) -> u64 {
        self.session.capacity_pages()
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            data_path: "socket",
            reconnects: self.session.reconnects(),
            copies_dropped: self.forgets.dropped(),
            ..StoreStats::default()
        }
    }
}

/// What [`Link::finish_read`] calls for each page read: `(index, page, version, blob)`.
pub(crate) type ReadEntry<'a> = dyn FnMut(usize, u64, u64, &[u8]) -> Result<(), StoreError> + 'a;

/// A connection to a session that replaces itself when it breaks (see the module
/// documentation): each request is retried on a new connection within the session's lease.
pub(crate) struct Link {
    conn: Connection,
    /// To replace `conn` when it fails.
    session: Arc<MemnodeSession>,
}

impl Link {
    /// A new connection attached to `session` (retried like any other if the first try fails
    /// transiently).
    pub(crate) fn open(session: &Arc<MemnodeSession>) -> Result<Link, PagerError> {
        let conn = match session.attach() {
            Ok(conn) => conn,
            Err(e) if e.is_transient() => session.reattach(&e).map_err(|_| e)?,
            Err(e) => return Err(e.into()),
        };
        Ok(Link {
            conn,
            session: session.clone(),
        })
    }

    /// Replaces the connection, which failed with `cause`, by a new one to the same session;
    /// `tries` counts the replacements of one request.
    fn reconnect(&mut self, cause: &ClientError, tries: &mut u32) -> Result<(), StoreError> {
        if *tries >= MAX_RECONNECTS_PER_REQUEST {
            return Err(StoreError::Lost(format!(
                "the connection to the memnode failed {tries} times over for one request; the \
                 last failure: {cause}"
            )));
        }
        *tries += 1;
        self.conn = self.session.reattach(cause)?;
        Ok(())
    }

    /// Sends a read of `pages`, on a new connection if need be.
    pub(crate) fn send_read(
        &mut self,
        pages: &[u64],
        tries: &mut u32,
    ) -> Result<PendingRead, StoreError> {
        loop {
            match self.conn.start_read(pages) {
                Ok(p) => return Ok(p),
                Err(e) if e.is_transient() => self.reconnect(&e, tries)?,
                Err(e) => return Err(store_error(e)),
            }
        }
    }

    /// Like [`Link::send_read`], as a prefetch the memnode drops if it waits longer than
    /// `deadline_us` for its link.
    pub(crate) fn send_prefetch(
        &mut self,
        pages: &[u64],
        deadline_us: u32,
        tries: &mut u32,
    ) -> Result<PendingRead, StoreError> {
        loop {
            match self.conn.start_prefetch(pages, deadline_us) {
                Ok(p) => return Ok(p),
                Err(e) if e.is_transient() => self.reconnect(&e, tries)?,
                Err(e) => return Err(store_error(e)),
            }
        }
    }

    /// Completes a read sent with [`Link::send_read`] (the same `pages`), asking again on a new
    /// connection if this one breaks: `f(i, page, version, blob)` for each page, in order.
    pub(crate) fn finish_read(
        &mut self,
        mut pending: PendingRead,
        pages: &[u64],
        tries: &mut u32,
        f: &mut ReadEntry<'_>,
    ) -> Result<(), StoreError> {
        loop {
            let batch = match self.conn.finish_read(pending, pages) {
                Ok(batch) => batch,
                Err(e) if e.is_transient() => {
                    // Reads change nothing on the memnode: ask again on a new connection.
                    self.reconnect(&e, tries)?;
                    pending = self.send_read(pages, tries)?;
                    continue;
                }
                Err(e) => return Err(store_error(e)),
            };
            for (i, (page, version, blob)) in batch.iter().enumerate() {
                f(i, page, version, blob)?;
            }
            return Ok(());
        }
    }

    /// The buffer to build a write batch in ([`PageBatch::begin`], [`PageBatch::push`]).
    pub(crate) fn batch(&mut self) -> &mut Vec<u8> {
        self.conn.write_buffer()
    }

    /// Sends the batch built in [`Link::batch`], again on a new connection if this one breaks:
    /// whether or not the memnode stored it before the connection broke, storing the same
    /// blobs again leaves it in the same state (and an older copy never replaces a newer one).
    /// With a `bell`, its `on_ring` is called each time its file becomes readable while the
    /// memnode's answer is awaited (`on_ring` resets it).
    pub(crate) fn write_batch(&mut self, mut bell: Option<Bell<'_>>) -> Result<(), StoreError> {
        let mut tries = 0;
        loop {
            let pending = match self.conn.start_built_batch() {
                Ok(pending) => pending,
                Err(e) if e.is_transient() => {
                    self.move_batch_to_new_connection(&e, &mut tries)?;
                    continue;
                }
                Err(e) => return Err(store_error(e)),
            };
            if let Some(bell) = bell.as_mut() {
                self.watch_until_answered(bell.fd, &mut *bell.on_ring);
            }
            match self.conn.finish_built_batch(pending) {
                Ok(()) => return Ok(()),
                Err(e) if e.is_transient() => self.move_batch_to_new_connection(&e, &mut tries)?,
                Err(e) => return Err(store_error(e)),
            }
        }
    }

    /// Calls `on_bell` whenever `bell` rings until the memnode's answer has arrived, or for
    /// [`BELL_WATCH`] at most, and no longer than the connection's reply timeout: after that
    /// the answer is awaited alone, under that timeout (which a memnode that never answers must
    /// still meet: watching for longer let a stall outlast `--memnode-timeout` unnoticed while
    /// only a write-back waited).
    fn watch_until_answered(&self, bell: BorrowedFd<'_>, on_bell: &mut dyn FnMut()) {
        let since = Instant::now();
        let watch = BELL_WATCH.min(self.conn.reply_timeout());
        while let Some(left) = watch.checked_sub(since.elapsed()) {
            match self.conn.wait_readable(bell, left) {
                Ok((false, true)) => on_bell(),
                // Answered, or out of time.
                Ok(_) => return,
                Err(e) => {
                    log::debug!("watching the eviction bell failed ({e}); waiting without");
                    return;
                }
            }
        }
    }

    /// After a transient failure `cause` of a write batch: a new connection, with the batch
    /// moved into its send buffer, to be sent again.
    fn move_batch_to_new_connection(
        &mut self,
        cause: &ClientError,
        tries: &mut u32,
    ) -> Result<(), StoreError> {
        let batch = std::mem::take(self.conn.write_buffer());
        self.reconnect(cause, tries)?;
        *self.conn.write_buffer() = batch;
        Ok(())
    }
}

/// How long a write batch's wait for the memnode's answer also watches the eviction bell
/// ([`Link::write_batch`]) before waiting for the answer alone.
const BELL_WATCH: Duration = Duration::from_secs(5);

/// One thread's connection.
struct SocketHandle {
    link: Link,
    /// The read sent by `request`, with its ids.
    pending: Option<(PendingRead, Vec<u64>)>,
    /// Where the codec encodes a page's blob, before it joins the batch.
    room: Vec<u8>,
    /// The store's far copies to drop, sent from here after a write-back.
    forgets: Arc<Forgets>,
}

impl BlobHandle for SocketHandle {
    fn request(&mut self, pages: &[u64]) -> Result<(), StoreError> {
        assert!(self.pending.is_none(), "a read is already outstanding");
        let p = self.link.send_read(pages, &mut 0)?;
        self.pending = Some((p, pages.to_vec()));
        Ok(())
    }

    fn request_prefetch(
        &mut self,
        pages: &[u64],
        deadline: std::time::Duration,
    ) -> Result<(), StoreError> {
        assert!(self.pending.is_none(), "a read is already outstanding");
        let us = u32::try_from(deadline.as_micros()).unwrap_or(u32::MAX - 1);
        let p = self.link.send_prefetch(pages, us, &mut 0)?;
        self.pending = Some((p, pages.to_vec()));
        Ok(())
    }

    fn receive(
        &mut self,
        f: &mut dyn FnMut(usize, u64, FarCopy<'_>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let (p, ids) = self.pending.take().expect("receive without a request");
        // The version the memnode echoes is not passed on: the codec layer opens the blob with
        // the one it recorded, so a memnode that lies about it is caught.
        self.link
            .finish_read(p, &ids, &mut 0, &mut |i, page, _, blob| {
                f(i, page, FarCopy::Blob(blob))
            })
    }

    fn begin_stage(&mut self) {
        PageBatch::begin(self.link.batch());
    }

    fn room(&mut self) -> &mut [u8] {
        &mut self.room
    }

    fn push(&mut self, page: u64, copy: Encoded) -> Result<(), StoreError> {
        let Encoded::Blob { len, version } = copy else {
            unreachable!("a socket store keeps no words: every page leaves as a blob")
        };
        // The version travels in the clear too, so the memnode keeps the newest of two copies
        // of a page (a batch a replaced connection delivers late).
        PageBatch::push(self.link.batch(), page, version, &self.room[..len]);
        Ok(())
    }

    fn follows_compressor_choice(&self) -> bool {
        true
    }

    fn commit_watching(&mut self, bell: Option<Bell<'_>>) -> Result<(), StoreError> {
        if let Err(e) = self.link.write_batch(bell) {
            if matches!(e, StoreError::Full(_)) {
                // Room the copies of resident pages take, for the batch's next try.
                let session = &self.link.session;
                self.forgets.send(1, &mut |copies| session.forget(copies));
            }
            return Err(e);
        }
        let session = &self.link.session;
        self.forgets
            .send(FORGET_BATCH, &mut |copies| session.forget(copies));
        Ok(())
    }
}
