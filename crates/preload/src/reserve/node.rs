//! The reserve's word with the node daemon: this process is marked latency-critical (by pid,
//! through the daemon's socket), so the daemon's batch reclaimer spares its files and counts
//! its allocations in the free-memory watermark it keeps.

use gleaner_node::proto::Class;

/// Marks this process latency-critical with the daemon on the default socket (no daemon is
/// started for it: a latency-critical service must not wait on one).
pub(crate) fn register() -> Result<(), String> {
    let socket = gleaner_node::client::default_socket();
    gleaner_node::client::mark(
        &socket,
        std::process::id() as i32,
        Class::LatencyCritical,
        false,
    )
}
