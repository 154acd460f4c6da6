//! Helpers shared by the integration tests: an in-process server on a real socket, temporary
//! directories, page patterns.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gleaner_memnode::{
    RunSummary, Server, ServerConfig, ServerError, ShutdownHandle, StatsSnapshot,
};
use gleaner_proto::{
    generate_token, ClientError, ConnectOptions, Connection, Endpoint, ErrorCode, SessionKey,
    Token, PAGE_SIZE,
};

/// A server running on its own thread, stopped (and joined) on drop.
pub struct TestServer {
    pub endpoint: Endpoint,
    pub token: Token,
    handle: ShutdownHandle,
    thread: Option<JoinHandle<Result<RunSummary, ServerError>>>,
}

impl TestServer {
    /// Starts a server on `listen` with a capacity of `capacity_pages` full pages (that many ×
    /// `PAGE_SIZE` bytes) and the given lease.
    pub fn start(listen: &str, capacity_pages: u64, lease: Duration) -> TestServer {
        let mut config = ServerConfig::new(
            listen.parse().unwrap(),
            capacity_pages * PAGE_SIZE as u64,
            generate_token(),
        );
        config.lease = lease;
        TestServer::start_with(config)
    }

    /// Starts a TCP loopback server with a 10 s lease and a capacity of `capacity_pages` full
    /// pages.
    pub fn tcp(capacity_pages: u64) -> TestServer {
        TestServer::start("127.0.0.1:0", capacity_pages, Duration::from_secs(10))
    }

    pub fn start_with(config: ServerConfig) -> TestServer {
        let token = config.token;
        let server = Server::bind(config).expect("bind");
        let endpoint = server.local_endpoint().clone();
        let handle = server.shutdown_handle();
        let thread = std::thread::spawn(move || server.run());
        TestServer {
            endpoint,
            token,
            handle,
            thread: Some(thread),
        }
    }

    pub fn opts(name: &str) -> ConnectOptions {
        ConnectOptions {
            connect_timeout: Duration::from_secs(5),
            reply_timeout: Duration::from_secs(10),
            client_name: name.to_string(),
        }
    }

    /// A new session.
    pub fn connect(&self) -> Connection {
        Connection::connect(&self.endpoint, &self.token, None, &Self::opts("test"))
            .expect("connect")
    }

    /// Attaches to an existing session.
    pub fn attach(&self, id: u64, key: SessionKey) -> Result<Connection, ClientError> {
        Connection::connect(
            &self.endpoint,
            &self.token,
            Some((id, key)),
            &Self::opts("attach"),
        )
    }

    /// Stats over the wire (a throwaway session that says goodbye).
    pub fn stats(&self) -> StatsSnapshot {
        let mut c = Connection::connect(&self.endpoint, &self.token, None, &Self::opts("stats"))
            .expect("stats connect");
        let json = c.stats().expect("stats");
        c.goodbye().expect("goodbye");
        serde_json::from_str(&json).expect("stats JSON")
    }

    /// Stats straight from the server (no connection, no session).
    pub fn local_stats(&self) -> StatsSnapshot {
        self.handle.stats()
    }

    /// Stops the server and returns its summary.
    pub fn stop(mut self) -> RunSummary {
        self.handle.shutdown();
        let t = self.thread.take().unwrap();
        join_within(t, Duration::from_secs(10)).expect("server run")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.handle.shutdown();
            let _ = join_within(t, Duration::from_secs(10));
        }
    }
}

/// Joins `t`, panicking if it takes longer than `limit`.
pub fn join_within<T>(t: JoinHandle<T>, limit: Duration) -> T {
    let deadline = Instant::now() + limit;
    while !t.is_finished() {
        assert!(
            Instant::now() < deadline,
            "thread did not finish within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    t.join().expect("thread panicked")
}

/// Polls `cond` until it holds or `limit` passes; returns whether it held.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A page whose every byte depends on `seed` and its offset.
pub fn page(seed: u64) -> Vec<u8> {
    let mut rng = gleaner_sys::rng::XorShift64::new(seed);
    (0..PAGE_SIZE).map(|_| rng.next_u64() as u8).collect()
}

/// Bytes per page, as the `u64` the stats use.
pub const P: u64 = PAGE_SIZE as u64;

/// A blob of `len` bytes whose every byte depends on `seed` and its offset.
pub fn blob(seed: u64, len: usize) -> Vec<u8> {
    let mut b = page(seed);
    b.resize(len, (seed as u8) ^ 0x5A);
    b
}

/// Writes `(id, blob(seed, len))` triples.
pub fn write_blobs(conn: &mut Connection, blobs: &[(u64, u64, usize)]) -> Result<(), ClientError> {
    let data: Vec<(u64, Vec<u8>)> = blobs
        .iter()
        .map(|&(id, seed, len)| (id, blob(seed, len)))
        .collect();
    conn.write_pages(data.iter().map(|(id, d)| (*id, d.as_slice())))
}

/// Reads the ids of `blobs` and asserts each equals `blob(seed, len)`, length included.
pub fn assert_blobs(conn: &mut Connection, blobs: &[(u64, u64, usize)]) {
    let ids: Vec<u64> = blobs.iter().map(|b| b.0).collect();
    let batch = conn.read_pages(&ids).expect("read");
    assert_eq!(batch.len(), blobs.len());
    for ((got_id, _, data), &(id, seed, len)) in batch.iter().zip(blobs) {
        assert_eq!(got_id, id);
        assert_eq!(data.len(), len, "blob {id} has the wrong length");
        assert!(
            data == blob(seed, len).as_slice(),
            "blob {id} has wrong contents"
        );
    }
}

/// Writes `(id, page(seed))` pairs.
pub fn write(conn: &mut Connection, pages: &[(u64, u64)]) -> Result<(), ClientError> {
    let data: Vec<(u64, Vec<u8>)> = pages.iter().map(|&(id, seed)| (id, page(seed))).collect();
    conn.write_pages(data.iter().map(|(id, d)| (*id, d.as_slice())))
}

/// Reads `ids` and asserts each equals `page(seed)`.
pub fn assert_pages(conn: &mut Connection, pages: &[(u64, u64)]) {
    let ids: Vec<u64> = pages.iter().map(|p| p.0).collect();
    let batch = conn.read_pages(&ids).expect("read");
    assert_eq!(batch.len(), pages.len());
    for ((got_id, _, data), &(id, seed)) in batch.iter().zip(pages) {
        assert_eq!(got_id, id);
        assert!(
            data == page(seed).as_slice(),
            "page {id} has wrong contents"
        );
    }
}

/// Asserts a read of `ids` fails with `NotFound` and returns the server's message.
pub fn assert_not_found(conn: &mut Connection, ids: &[u64]) -> String {
    match conn.read_pages(ids) {
        Err(ClientError::Server {
            code: ErrorCode::NotFound,
            message,
            ..
        }) => message,
        Err(e) => panic!("expected NotFound for {ids:?}, got {e}"),
        Ok(_) => panic!("expected NotFound for {ids:?}, got pages"),
    }
}

/// A temporary directory removed on drop. Short paths, so Unix socket paths fit.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "gm-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
