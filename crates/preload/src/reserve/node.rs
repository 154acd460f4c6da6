//! The reserve's word with the node daemon: this process is marked latency-critical (by pid,
//! through the daemon's socket), so the daemon's batch reclaimer spares its files and counts
//! its allocations in the free-memory watermark it keeps.

use gleaner_node::proto::{self, Class, Reply, Request};

/// Marks this process latency-critical with the daemon on the default socket (no daemon is
/// started for it: a latency-critical service must not wait on one).
pub(crate) fn register() -> Result<(), String> {
    let socket = gleaner_node::client::default_socket();
    let conn = std::os::unix::net::UnixStream::connect(&socket)
        .map_err(|e| format!("{}: {e}", socket.display()))?;
    conn.set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .ok();
    let mark = Request::Mark {
        pid: std::process::id() as i32,
        class: Class::LatencyCritical,
    };
    proto::send(&conn, &mark, None).map_err(|e| e.to_string())?;
    match proto::recv::<Reply>(&conn).map_err(|e| e.to_string())?.0 {
        Reply::Marked { .. } => Ok(()),
        Reply::Error { error } => Err(error),
        other => Err(format!("unexpected reply {other:?}")),
    }
}
