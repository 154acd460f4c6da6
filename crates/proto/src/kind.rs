//! The kind byte that names what a frame carries (read by the frame layer, `frame.rs`,
//! to check a header, and by the message layer, `message.rs`, to encode and decode).

/// The kind byte of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MessageKind {
    /// Server → client, first frame on every connection: the server's nonce.
    Challenge = 1,
    /// Client → server: the client's nonce, the session to create or attach to, and its proof.
    Auth = 2,
    /// Server → client: the session id and key, and the server's own proof.
    Welcome = 3,
    /// Client → server: read a batch of pages.
    Read = 4,
    /// Server → client: the pages asked for, in request order.
    Pages = 5,
    /// Client → server: store a batch of pages (all or nothing).
    Write = 6,
    /// Server → client: a write, free or goodbye succeeded for `count` items.
    Ack = 7,
    /// Client → server: forget page ranges and release their space.
    Free = 8,
    /// Client → server: liveness probe.
    Ping = 9,
    /// Server → client: answer to `Ping`.
    Pong = 10,
    /// Client → server: ask for the server's metrics.
    StatsRequest = 11,
    /// Server → client: metrics as JSON text.
    Stats = 12,
    /// Client → server: end the session now and release all its pages.
    Goodbye = 13,
    /// Server → client: the request failed.
    Error = 14,
    /// Client → server (Unix sockets only): grant the session a shared-memory slab.
    GrantRequest = 15,
    /// Server → client: a slab was granted; the frame carries its memfd (`SCM_RIGHTS`).
    Grant = 16,
    /// Client → server: start draining: tell every client (through its pings) to move its pages
    /// elsewhere, and exit once no session is left. Answered with `Ack{count = sessions}`.
    Drain = 17,
    /// Client → server: copy this session into a new session of the same tenant whose pages are
    /// the same blobs (a fork child's snapshot: neither session's later writes or frees reach
    /// the other), counted in full against the capacity. Answered with `Forked`, or `Error{Full}`.
    Fork = 18,
    /// Server → client: the new session's id and attach key (it has no connection yet: its
    /// lease runs until one attaches).
    Forked = 19,
    /// Client → server: read a batch of pages ahead of demand (a prefetch): served after the
    /// session's demand reads, and dropped (`Error{Late}`, nothing read) if it waited longer
    /// than its deadline for the memnode's link. Answered like `Read` otherwise.
    Prefetch = 20,
    /// Client → server: drop the stored copies of these pages whose version is the one given
    /// (copies the client fetched and no longer needs); a newer copy stays. Answered with
    /// `Ack{count = copies dropped}`.
    Forget = 21,
}

impl MessageKind {
    /// Maps a wire byte to a kind, if it is one this version knows.
    pub fn from_u8(b: u8) -> Option<Self> {
        use MessageKind::*;
        Some(match b {
            1 => Challenge,
            2 => Auth,
            3 => Welcome,
            4 => Read,
            5 => Pages,
            6 => Write,
            7 => Ack,
            8 => Free,
            9 => Ping,
            10 => Pong,
            11 => StatsRequest,
            12 => Stats,
            13 => Goodbye,
            14 => Error,
            15 => GrantRequest,
            16 => Grant,
            17 => Drain,
            18 => Fork,
            19 => Forked,
            20 => Prefetch,
            21 => Forget,
            _ => return None,
        })
    }
}
