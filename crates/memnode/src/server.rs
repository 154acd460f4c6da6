//! The server: binds, accepts connections (one thread each), reaps sessions whose lease ran out,
//! and shuts everything down cleanly on request.
//!
//! ```no_run
//! # fn demo(token: gleaner_proto::Token) -> Result<(), gleaner_memnode::ServerError> {
//! use gleaner_memnode::{Server, ServerConfig};
//! let server = Server::bind(ServerConfig::new("127.0.0.1:0".parse().unwrap(), 4 << 20, token))?;
//! println!("listening on {}", server.local_endpoint());
//! let stop = server.shutdown_handle();
//! let runner = std::thread::spawn(move || server.run());
//! // ... serve clients ...
//! stop.shutdown();
//! let summary = runner.join().unwrap()?;
//! println!("{summary}");
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use gleaner_proto::units::format_size;
use gleaner_proto::{Endpoint, ErrorCode, Message, Stream, PAGE_SIZE};

use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::listener::{Accepted, Listener, Waker};
use crate::session::{SessionTable, Tenant};
use crate::shared::Shared;
use crate::stats::{bump, ServerCounters, StatsSnapshot};
use crate::store::{Capacity, Released};

/// A bound memnode, ready to [`run`](Server::run).
pub struct Server {
    shared: Arc<Shared>,
    listener: Listener,
    waker: Waker,
}

/// Stops a running [`Server`] from any thread (a signal handler thread, a test).
#[derive(Clone)]
pub struct ShutdownHandle {
    shared: Arc<Shared>,
    waker: Waker,
}

impl ShutdownHandle {
    /// Asks the server to stop: it stops accepting, shuts every connection down, joins its
    /// threads and returns from [`Server::run`]. Idempotent; returns at once.
    pub fn shutdown(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Whether shutdown was requested.
    pub fn is_shutting_down(&self) -> bool {
        self.shared.is_stopping()
    }

    /// The server's current stats (the same document a `StatsRequest` returns).
    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats()
    }
}

impl fmt::Debug for ShutdownHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShutdownHandle")
            .field("shutting_down", &self.is_shutting_down())
            .finish()
    }
}

/// What a server did over its life, returned by [`Server::run`].
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// How long it ran.
    pub uptime: Duration,
    /// Connections accepted.
    pub connections: u64,
    /// Sessions created.
    pub sessions: u64,
    /// Requests served.
    pub requests: u64,
    /// Frame bytes received.
    pub bytes_in: u64,
    /// Frame bytes sent.
    pub bytes_out: u64,
    /// Refused handshakes.
    pub auth_failures: u64,
    /// Connections dropped for malformed input.
    pub malformed_frames: u64,
    /// Sessions still alive at shutdown (their pages were dropped).
    pub sessions_at_exit: u64,
    /// Pages still held at shutdown (stored pages plus pages of shared-memory slabs).
    pub pages_at_exit: u64,
    /// Bytes of capacity those pages held (blob lengths plus slab sizes).
    pub bytes_at_exit: u64,
}

impl fmt::Display for RunSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "memnode stopped after {:.1} s: {} connections, {} sessions, {} requests, \
             {} in, {} out, {} auth failures, {} malformed frames; \
             dropped {} live sessions holding {} pages ({})",
            self.uptime.as_secs_f64(),
            self.connections,
            self.sessions,
            self.requests,
            format_size(self.bytes_in),
            format_size(self.bytes_out),
            self.auth_failures,
            self.malformed_frames,
            self.sessions_at_exit,
            self.pages_at_exit,
            format_size(self.bytes_at_exit),
        )
    }
}

impl Server {
    /// Binds the listening socket. Nothing is served until [`Server::run`].
    pub fn bind(config: ServerConfig) -> Result<Server, ServerError> {
        if config.capacity_bytes < PAGE_SIZE as u64 {
            return Err(ServerError::Config(format!(
                "capacity must be at least one page ({PAGE_SIZE} bytes), not {} bytes",
                config.capacity_bytes
            )));
        }
        if config.max_connections == 0 {
            return Err(ServerError::Config(
                "max_connections must be at least 1".into(),
            ));
        }
        let (listener, waker) = Listener::bind(&config.listen)?;
        let capacity = Arc::new(Capacity::new(config.capacity_bytes));
        let mut tenants = vec![Arc::new(Tenant {
            name: "default".into(),
            token: config.token,
            weight: 1,
            capacity: capacity.clone(),
            queue: Default::default(),
        })];
        for t in &config.tenants {
            if tenants
                .iter()
                .any(|x| x.name == t.name || x.token == t.token)
            {
                return Err(ServerError::Config(format!(
                    "tenant {} repeats another tenant's name or token",
                    t.name
                )));
            }
            tenants.push(Arc::new(Tenant {
                name: t.name.clone(),
                token: t.token,
                weight: t.weight,
                capacity: Arc::new(Capacity::quota(t.quota_bytes, capacity.clone(), &t.name)),
                queue: Default::default(),
            }));
        }
        let shared = Arc::new(Shared {
            link: config
                .bandwidth_bytes_per_s
                .map(|rate| crate::sched::Link::new(rate, config.schedule)),
            capacity,
            tenants,
            sessions: SessionTable::new(),
            counters: ServerCounters::default(),
            started: Instant::now(),
            stopping: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            waker: waker.clone(),
            conns: Mutex::new(HashMap::new()),
            config,
        });
        Ok(Server {
            shared,
            listener,
            waker,
        })
    }

    /// The address actually bound: the real port when port 0 was asked for; Unix endpoints
    /// display as `unix:/path`.
    pub fn local_endpoint(&self) -> &Endpoint {
        self.listener.local_endpoint()
    }

    /// The configured capacity in bytes.
    pub fn capacity_bytes(&self) -> u64 {
        self.shared.capacity.total()
    }

    /// A handle that stops [`Server::run`] from another thread.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            shared: Arc::clone(&self.shared),
            waker: self.waker.clone(),
        }
    }

    /// Serves until [`ShutdownHandle::shutdown`] is called, then stops accepting, shuts every
    /// connection down, joins all threads, removes the Unix socket file and returns a summary.
    /// Fails only if accepting connections fails for good (the cleanup still happens).
    pub fn run(self) -> Result<RunSummary, ServerError> {
        let shared = &self.shared;
        let reaper = {
            let shared = Arc::clone(shared);
            spawn("memnode-reaper".into(), move || reap(&shared))?
        };
        let mut handlers: Vec<JoinHandle<()>> = Vec::new();
        let mut next_id = 0u64;
        let result = loop {
            if shared.is_stopping() {
                break Ok(());
            }
            match self.listener.accept() {
                // Only shutdown wakes the loop.
                Ok(Accepted::Woken) => break Ok(()),
                Ok(Accepted::Conn(stream, peer)) => {
                    next_id += 1;
                    handlers.retain(|h| !h.is_finished());
                    if let Some(h) = self.start_connection(next_id, stream, peer) {
                        handlers.push(h);
                    }
                }
                Err(e) if is_transient_accept_error(&e) => {
                    log::error!("accept failed (retrying in 100 ms): {e}");
                    thread::sleep(Duration::from_millis(100));
                }
                Err(e) => break Err(ServerError::Accept(e)),
            }
        };
        shared.stopping.store(true, Ordering::Release);
        let open: Vec<Stream> = shared.conns().drain().map(|(_, s)| s).collect();
        if !open.is_empty() {
            log::info!("shutting down {} open connection(s)", open.len());
        }
        for s in &open {
            let _ = s.shutdown();
        }
        for h in handlers {
            let _ = h.join();
        }
        reaper.thread().unpark();
        let _ = reaper.join();
        self.listener.remove_socket_file();
        let remaining = shared.sessions.take_all();
        let at_exit = remaining
            .iter()
            .map(|s| s.end(s.capacity()))
            .fold(Released::default(), |a, b| a + b);
        let c = &shared.counters;
        let summary = RunSummary {
            uptime: shared.started.elapsed(),
            connections: c.connections_accepted.load(Ordering::Relaxed),
            sessions: c.sessions_created.load(Ordering::Relaxed),
            requests: c.requests(),
            bytes_in: c.bytes_in.load(Ordering::Relaxed),
            bytes_out: c.bytes_out.load(Ordering::Relaxed),
            auth_failures: c.auth_failures.load(Ordering::Relaxed),
            malformed_frames: c.malformed_frames.load(Ordering::Relaxed),
            sessions_at_exit: remaining.len() as u64,
            pages_at_exit: at_exit.pages,
            bytes_at_exit: at_exit.bytes,
        };
        result.map(|()| summary)
    }

    /// Registers a new connection and starts its thread; refuses it beyond the connection limit.
    fn start_connection(&self, id: u64, stream: Stream, peer: String) -> Option<JoinHandle<()>> {
        let shared = &self.shared;
        bump(&shared.counters.connections_accepted, 1);
        let registered = {
            let mut conns = shared.conns();
            if conns.len() >= shared.config.max_connections {
                Err(conns.len())
            } else {
                match clone_stream(&stream) {
                    Ok(clone) => {
                        conns.insert(id, clone);
                        Ok(())
                    }
                    Err(e) => {
                        log::warn!("{peer}: cannot register connection: {e}");
                        return None;
                    }
                }
            }
        };
        if let Err(open) = registered {
            bump(&shared.counters.connections_refused, 1);
            log::warn!("{peer}: refusing connection: {open} connections already open");
            let mut stream = stream;
            let _ = Message::Error {
                code: ErrorCode::Internal,
                message: "too many connections",
            }
            .send(&mut stream, 0, &mut Vec::new());
            let _ = stream.shutdown();
            return None;
        }
        let thread_shared = Arc::clone(shared);
        let started = spawn(format!("memnode-conn-{id}"), move || {
            crate::conn::handle(&thread_shared, stream, &peer);
            thread_shared.conns().remove(&id);
        });
        match started {
            Ok(h) => Some(h),
            Err(e) => {
                log::error!("{e}; dropping the connection");
                if let Some(s) = shared.conns().remove(&id) {
                    let _ = s.shutdown();
                }
                None
            }
        }
    }
}

/// Releases sessions whose lease ran out, until shutdown.
fn reap(shared: &Shared) {
    let lease = shared.config.lease;
    let tick = (lease / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    while !shared.is_stopping() {
        thread::park_timeout(tick);
        if shared.is_draining() && shared.sessions.snapshot().is_empty() {
            log::info!("drained: no session is left; stopping");
            shared.stopping.store(true, Ordering::Release);
            shared.waker.wake();
            return;
        }
        for s in shared.sessions.take_expired(lease) {
            let freed = s.end(s.capacity());
            bump(&shared.counters.sessions_released_by_lease, 1);
            log::info!(
                "session {} ({:?}) released: no connection for {:?} (the lease); freed {} pages \
                 ({})",
                s.id(),
                s.client(),
                lease,
                freed.pages,
                format_size(freed.bytes)
            );
        }
    }
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, ServerError> {
    thread::Builder::new()
        .name(name.clone())
        .spawn(f)
        .map_err(|source| ServerError::Thread { name, source })
}

fn clone_stream(s: &Stream) -> io::Result<Stream> {
    Ok(match s {
        Stream::Tcp(t) => Stream::Tcp(t.try_clone()?),
        Stream::Unix(u) => Stream::Unix(u.try_clone()?),
    })
}

/// Accept errors that come from resource exhaustion and may clear up.
fn is_transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EPROTO)
    )
}
