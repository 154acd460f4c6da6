//! The socket store: pages travel in batched `Read` and `Write` requests to the memnode, which
//! keeps the index. Works with any memnode, over TCP or a Unix socket. Each thread that uses the
//! store has its own connection attached to the session, so demand fetches never queue behind
//! write-backs. Pages travel as the codec's blobs (compressed, sealed); the client keeps only
//! each page's version, to open its blob with.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use gleaner_proto::{
    ClientError, ConnectOptions, Connection, Endpoint, ErrorCode, PageBatch, PendingRead,
    SessionKey, Token,
};

use super::{page_buf, zeroed_atomics, PageBuf, PageStore, StoreError, StoreHandle, StoreStats};
use crate::codec::{Codec, CodecCtx};
use crate::PagerError;

/// A memnode session: the address and credentials to attach more connections, and the first
/// connection, kept for session-wide requests (free, grants, goodbye).
pub(crate) struct Session {
    endpoint: Endpoint,
    token: Token,
    opts: ConnectOptions,
    id: (u64, SessionKey),
    capacity_pages: u64,
    control: Mutex<Option<Connection>>,
}

impl Session {
    /// Connects, authenticates and creates the session.
    pub(crate) fn open(
        endpoint: Endpoint,
        token: Token,
        opts: ConnectOptions,
    ) -> Result<Session, PagerError> {
        let first = Connection::connect(&endpoint, &token, None, &opts)?;
        let info = first.session();
        Ok(Session {
            endpoint,
            token,
            opts,
            id: (info.session_id, info.session_key),
            capacity_pages: info.capacity_bytes / gleaner_proto::PAGE_SIZE as u64,
            control: Mutex::new(Some(first)),
        })
    }

    /// One more connection attached to the session.
    pub(crate) fn attach(&self) -> Result<Connection, ClientError> {
        Connection::connect(&self.endpoint, &self.token, Some(self.id), &self.opts)
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
    } else if e.server_code() == Some(ErrorCode::NotFound) {
        StoreError::Lost(format!("the memnode no longer holds it ({e})"))
    } else {
        StoreError::Lost(format!("the memnode could not be reached ({e})"))
    }
}

/// The store over the socket.
pub(crate) struct SocketStore {
    session: Session,
    codec: Arc<Codec>,
    /// Per region page: the version of its blob on the memnode.
    versions: Arc<Box<[AtomicU64]>>,
}

impl SocketStore {
    /// The store of `session`, for a region of `region_pages` pages encoded by `codec`.
    pub(crate) fn new(session: Session, region_pages: usize, codec: Arc<Codec>) -> SocketStore {
        let versions = Arc::new(zeroed_atomics(region_pages));
        SocketStore {
            session,
            codec,
            versions,
        }
    }
}

impl PageStore for SocketStore {
    fn handle(&self) -> Result<Box<dyn StoreHandle>, PagerError> {
        Ok(Box::new(SocketHandle {
            conn: self.session.attach()?,
            pending: None,
            ctx: self.codec.ctx(),
            versions: self.versions.clone(),
            staged: Vec::new(),
            page: page_buf(),
        }))
    }

    fn release(&self, ranges: &[(u64, u32)]) {
        self.session.with_control(|conn| {
            for chunk in ranges.chunks(gleaner_proto::MAX_FREE_RANGES) {
                if let Err(e) = conn.free(chunk) {
                    log::warn!("releasing discarded pages on the memnode: {e}");
                }
            }
        });
    }

    fn close(&self) {
        self.session.close();
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
            codec: self.codec.stats(),
            ..StoreStats::default()
        }
    }
}

/// One thread's connection.
struct SocketHandle {
    conn: Connection,
    /// The read sent by `request`, with its ids.
    pending: Option<(PendingRead, Vec<u64>)>,
    ctx: CodecCtx,
    versions: Arc<Box<[AtomicU64]>>,
    /// The pages of the batch being built and their blobs' versions, published at commit.
    staged: Vec<(u64, u64)>,
    /// Where a page is decoded into, or filled before encoding.
    page: PageBuf,
}

impl StoreHandle for SocketHandle {
    fn request(&mut self, pages: &[u64]) -> Result<(), StoreError> {
        assert!(self.pending.is_none(), "a read is already outstanding");
        let p = self.conn.start_read(pages).map_err(store_error)?;
        self.pending = Some((p, pages.to_vec()));
        Ok(())
    }

    fn receive(&mut self, f: &mut dyn FnMut(usize, &[u8])) -> Result<(), StoreError> {
        let (p, ids) = self.pending.take().expect("receive without a request");
        let batch = self.conn.finish_read(p, &ids).map_err(store_error)?;
        for (i, (page, blob)) in batch.iter().enumerate() {
            let version = self
                .versions
                .get(page as usize)
                .map_or(0, |v| v.load(Ordering::Relaxed));
            self.ctx
                .decode(page, version, blob, &mut self.page[..])
                .map_err(|t| StoreError::Lost(t.to_string()))?;
            f(i, &self.page[..]);
        }
        Ok(())
    }

    fn reserve(&mut self, _pages: &[u64]) -> Result<(), StoreError> {
        Ok(())
    }

    fn stage(
        &mut self,
        pages: &[u64],
        fill: &mut dyn FnMut(usize, &mut [u8]) -> io::Result<()>,
    ) -> Result<(), StoreError> {
        let buf = self.conn.write_buffer();
        PageBatch::begin(buf);
        self.staged.clear();
        for (i, &page) in pages.iter().enumerate() {
            fill(i, &mut self.page[..]).map_err(|e| {
                StoreError::Lost(format!("reading page {page} for write-back failed: {e}"))
            })?;
            let (blob, version) = self.ctx.encode(page, &self.page[..]);
            PageBatch::push(buf, page, blob);
            self.staged.push((page, version));
        }
        Ok(())
    }

    fn commit(&mut self) -> Result<(), StoreError> {
        self.conn.write_built_batch().map_err(store_error)?;
        // Stored: the memnode now holds these versions (a refused batch stored nothing, and
        // its pages stay local until written back again).
        for &(page, version) in &self.staged {
            if let Some(v) = self.versions.get(page as usize) {
                v.store(version, Ordering::Relaxed);
            }
        }
        self.staged.clear();
        Ok(())
    }

    fn far_copy_matches(&mut self, _page: u64, _data: &[u8]) -> Option<bool> {
        None
    }
}
