//! Where the reserve's stats go: a live status file beside the pagers' (read by `gleaner
//! status`, rewritten every second by the management thread) and, at exit, a file in the run's
//! report directory (summed by `gleaner run` into the run's stats) or `GLEANER_RESERVE_STATS`.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// The live status file of this process.
fn status_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        gleaner_pager::status_dir().join(format!("reserve-{}.json", std::process::id()))
    })
}

fn document() -> Option<serde_json::Value> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    Some(serde_json::json!({
        "kind": "latency_critical",
        "pid": std::process::id(),
        "program": crate::program_name(),
        "updated_unix_s": now,
        "reserve": super::stats_json()?,
    }))
}

/// Rewrites the live status file (from the management thread).
pub(crate) fn publish() {
    let Some(doc) = document() else { return };
    let path = status_path();
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let tmp = path.with_extension("tmp");
    if gleaner_fds::write(&tmp, doc.to_string()).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

/// At exit: the final stats where the launcher (or the user) reads them; the live file goes.
pub(crate) fn finish() {
    // Only the process that kept the reserve (a fork child's exit says nothing of it).
    if super::active().is_none() {
        return;
    }
    let _ = std::fs::remove_file(status_path());
    let Some(doc) = document() else { return };
    let pid = std::process::id();
    let mut targets: Vec<PathBuf> = Vec::new();
    if let Some(dir) = crate::report_dir() {
        targets.push(dir.join(format!("reserve-{pid}.json")));
    }
    if let Some(p) = std::env::var_os("GLEANER_RESERVE_STATS").filter(|p| !p.is_empty()) {
        targets.push(PathBuf::from(
            p.to_string_lossy().replace("%p", &pid.to_string()),
        ));
    }
    for t in targets {
        if let Err(e) = gleaner_fds::write(&t, doc.to_string()) {
            eprintln!(
                "gleaner: writing the reserve's stats to {}: {e}",
                t.display()
            );
        }
    }
}

/// Tells the node daemon (`gleaner node`) that this process is latency-critical, so that its
/// batch reclaimer spares its files and sizes its watermark from this process's allocations.
/// With no daemon the process runs on its own reserve and says so, once.
pub(crate) fn link_node_daemon() {
    if let Err(e) = super::node::register() {
        eprintln!(
            "gleaner: {} (pid {}) is latency-critical but no node daemon (gleaner node) took \
             its registration ({e}): it runs on its own reserve, and no batch job's page cache \
             is dropped ahead of its allocations",
            crate::program_name(),
            std::process::id()
        );
    }
}
