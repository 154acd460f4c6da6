//! Opening a pool: its memory and evacuator (`pool.rs`), then its link to the node daemon
//! (`link.rs`), which registers it and registers it again after a daemon restart.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use crate::pool::{Pool, PoolConfig, Reconstructor};

impl Pool {
    /// Creates a pool whose misses run `recon`. With `cfg.node`, registers with the daemon (up
    /// to 2 s for the first answer; after that, in the background, again after any restart).
    pub fn new(cfg: PoolConfig, recon: Reconstructor) -> io::Result<Pool> {
        let pool = Pool::create(cfg, recon)?;
        if let Some(path) = pool.inner.cfg().node.clone() {
            let (tx, rx) = std::sync::mpsc::channel();
            let weak = Arc::downgrade(&pool.inner);
            std::thread::Builder::new()
                .name("soft-link".into())
                .spawn(move || crate::link::run(weak, path, tx))?;
            let _ = rx.recv_timeout(Duration::from_secs(2));
        }
        Ok(pool)
    }
}
