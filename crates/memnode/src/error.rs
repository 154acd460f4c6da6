//! Errors of the server library.

use std::io;
use std::path::PathBuf;

use gleaner_proto::Endpoint;

/// Why a server could not start or keep running.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Another live server already listens there.
    #[error("cannot listen on {endpoint}: address in use (is another memnode running there?)")]
    AddressInUse {
        /// The address asked for.
        endpoint: Endpoint,
    },
    /// A non-socket file sits where the Unix socket should be created.
    #[error("cannot listen on unix:{}: the path exists and is not a socket", path.display())]
    NotASocket {
        /// The path asked for.
        path: PathBuf,
    },
    /// Binding or configuring the listening socket failed.
    #[error("cannot listen on {endpoint}: {source}")]
    Bind {
        /// The address asked for.
        endpoint: Endpoint,
        /// The operating system's reason.
        source: io::Error,
    },
    /// The configuration cannot work.
    #[error("invalid memnode configuration: {0}")]
    Config(String),
    /// Waiting for connections failed for good.
    #[error("accepting connections failed: {0}")]
    Accept(io::Error),
    /// A thread could not be started.
    #[error("cannot start thread {name}: {source}")]
    Thread {
        /// The thread's name.
        name: String,
        /// The operating system's reason.
        source: io::Error,
    },
}
