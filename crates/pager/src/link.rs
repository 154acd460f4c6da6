//! Connections from a region to its memnode session.
//!
//! The first connection creates the session; each handler thread and the evictor then attach
//! their own connection to it, so demand fetches never queue behind write-backs.

use std::path::Path;

use gleaner_proto::{ClientError, ConnectOptions, Connection, Endpoint, SessionKey, Token};

use crate::PagerError;

/// Everything needed to open more connections to one memnode session.
pub(crate) struct SessionTarget {
    endpoint: Endpoint,
    token: Token,
    opts: ConnectOptions,
    session: (u64, SessionKey),
    capacity_pages: u64,
}

impl SessionTarget {
    /// Connects, authenticates and creates the session. Returns the target and the first
    /// connection (which the caller keeps for session-wide requests such as `Goodbye`).
    pub(crate) fn open(
        endpoint: Endpoint,
        token: Token,
        opts: ConnectOptions,
    ) -> Result<(SessionTarget, Connection), PagerError> {
        let first = Connection::connect(&endpoint, &token, None, &opts)?;
        let info = first.session();
        Ok((
            SessionTarget {
                endpoint,
                token,
                opts,
                session: (info.session_id, info.session_key),
                capacity_pages: info.capacity_pages,
            },
            first,
        ))
    }

    /// Opens one more connection attached to the session.
    pub(crate) fn attach(&self) -> Result<Connection, ClientError> {
        Connection::connect(&self.endpoint, &self.token, Some(self.session), &self.opts)
    }

    /// The memnode's address.
    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The memnode's total capacity in pages.
    pub(crate) fn capacity_pages(&self) -> u64 {
        self.capacity_pages
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
