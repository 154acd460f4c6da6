//! The pool's link to the node daemon: register (with the memfd), follow grant changes, and
//! register again when the daemon restarts, for as long as the pool lives.

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::sync::Weak;
use std::time::Duration;

use gleaner_node::proto::{self, Kind, Reply, Request};

use crate::pool::PoolInner;

/// Runs until the pool is dropped. `first` hears once whether the first registration worked.
pub(crate) fn run(weak: Weak<PoolInner>, path: PathBuf, first: Sender<Result<u64, String>>) {
    let mut first = Some(first);
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(inner) = weak.upgrade() else { return };
        if inner.closing() {
            return;
        }
        let cfg = inner.cfg().clone();
        let attempt = (|| -> Result<UnixStream, String> {
            let s = gleaner_node::client::connect(&path, cfg.autostart)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let resident = gleaner_node::shared::resident_bytes(inner.memfd_fd()).unwrap_or(0);
            let req = Request::Register {
                version: proto::VERSION,
                kind: Kind::SoftPool,
                name: cfg.name.clone(),
                weight: cfg.weight,
                floor_bytes: cfg.floor,
                ceiling_bytes: cfg.ceiling,
                resident_bytes: resident,
            };
            proto::send(&s, &req, Some(inner.memfd_fd())).map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(Duration::from_secs(5))).ok();
            match proto::recv::<Reply>(&s).map_err(|e| e.to_string())?.0 {
                Reply::Registered { .. } => Ok(s),
                Reply::Error { error } => Err(format!("the daemon refused the pool: {error}")),
                other => Err(format!("unexpected reply {other:?}")),
            }
        })();
        let stream = match attempt {
            Ok(s) => s,
            Err(e) => {
                if let Some(tx) = first.take() {
                    log::warn!("soft pool {}: no node daemon: {e}", cfg.name);
                    let _ = tx.send(Err(e));
                }
                drop(inner);
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        stream.set_read_timeout(None).ok();
        inner.set_link(stream.try_clone().ok(), true);
        if let Some(tx) = first.take() {
            let _ = tx.send(Ok(0));
        }
        inner.wake();
        drop(inner);
        // Follow the daemon's pushes; the grant itself is in the control area.
        while let Ok((msg, _)) = proto::recv::<Reply>(&stream) {
            let Some(inner) = weak.upgrade() else { return };
            if let Reply::Limit { .. } = msg {
                inner.wake();
            }
        }
        let Some(inner) = weak.upgrade() else { return };
        inner.set_link(None, false);
        if inner.closing() {
            return;
        }
        drop(inner);
        std::thread::sleep(Duration::from_millis(100));
    }
}
