//! What a memnode server needs to run.

use std::time::Duration;

use gleaner_proto::{Endpoint, Token};

/// How long a new connection may take to authenticate before it is dropped.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a session outlives its last connection unless configured otherwise.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);
/// Most connections (authenticated or not) served at once unless configured otherwise.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// Configuration of one [`crate::Server`].
#[derive(Clone)]
pub struct ServerConfig {
    /// Where to listen. A TCP port of 0 picks a free port; see [`crate::Server::local_endpoint`].
    pub listen: Endpoint,
    /// Total bytes all sessions together may hold: a stored page's blob occupies its length, a
    /// shared-memory slab its pages × [`gleaner_proto::PAGE_SIZE`]. At least one page.
    pub capacity_bytes: u64,
    /// The shared secret clients must prove they hold.
    pub token: Token,
    /// How long a session whose connections all closed without `Goodbye` is kept for re-attach.
    pub lease: Duration,
    /// Read timeout while a new connection authenticates.
    pub handshake_timeout: Duration,
    /// Connections beyond this many are refused right after accept.
    pub max_connections: usize,
    /// Tenants besides the one of [`ServerConfig::token`] (which may use the whole capacity):
    /// each with its own token and a quota. A client's token decides its tenant.
    pub tenants: Vec<TenantConfig>,
    /// Serve page data at most at this many bytes per second in each direction, an emulated
    /// full-duplex link shared by every client, whose waiting requests are served in fair order
    /// by tenant weight (see `sched.rs`). None (default): no limit, no waiting.
    pub bandwidth_bytes_per_s: Option<u64>,
    /// How requests waiting for the link are ordered: fair (default) or first come first served.
    pub schedule: Schedule,
}

/// How requests waiting for a memnode's link (`--bandwidth`) are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Schedule {
    /// Start-time fair queuing by tenant weight on each direction of the link; within a
    /// session demand reads before prefetches; late prefetches dropped (default).
    #[default]
    Fair,
    /// First come first served, nothing dropped: the baseline the fair order is measured against.
    Fifo,
}

impl std::str::FromStr for Schedule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fair" => Ok(Schedule::Fair),
            "fifo" => Ok(Schedule::Fifo),
            _ => Err(format!(
                "`{s}` is not a schedule: use fair (by tenant weight, demand first) or fifo"
            )),
        }
    }
}

/// A tenant of a memnode: the clients that prove they hold its token, and what they may use.
#[derive(Clone)]
pub struct TenantConfig {
    /// Its name, for stats and messages.
    pub name: String,
    /// Its token.
    pub token: Token,
    /// The most bytes its sessions together may hold.
    pub quota_bytes: u64,
    /// Its share of the link when clients compete for it (`bandwidth_bytes_per_s`): requests
    /// waiting for the link are served in start-time fair order by weight.
    pub weight: u32,
}

impl ServerConfig {
    /// A configuration with the default lease, handshake timeout and connection limit.
    /// `capacity_bytes` is [`ServerConfig::capacity_bytes`].
    pub fn new(listen: Endpoint, capacity_bytes: u64, token: Token) -> Self {
        ServerConfig {
            listen,
            capacity_bytes,
            token,
            lease: DEFAULT_LEASE,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            tenants: Vec::new(),
            bandwidth_bytes_per_s: None,
            schedule: Schedule::Fair,
        }
    }
}

impl std::fmt::Debug for ServerConfig {
    // Hand-written so the token never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("listen", &self.listen)
            .field("capacity_bytes", &self.capacity_bytes)
            .field("token", &"<redacted>")
            .field("lease", &self.lease)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("max_connections", &self.max_connections)
            .finish()
    }
}
