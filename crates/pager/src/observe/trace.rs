//! The fault trace (`RegionConfig::trace`): every fault message, and the pages each access scan
//! saw written (`evict/access.rs`), for `gleaner trace replay`.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;
use std::sync::Mutex;

use gleaner_policy::trace::{Header, Kind, TraceWriter};
use gleaner_uffd::FaultKind;

use crate::PAGE_SIZE;

/// A trace file being written through a 1 MiB buffer.
pub(crate) struct FaultTrace(Mutex<TraceWriter<BufWriter<File>>>);

impl FaultTrace {
    /// Creates `path` (truncating it) for a region starting at `region_base`.
    pub(crate) fn create(path: &Path, region_base: usize) -> std::io::Result<FaultTrace> {
        let header = Header {
            page_size: PAGE_SIZE as u32,
            region_base: region_base as u64,
        };
        let w = gleaner_fds::make_held(|| File::create(path))
            .and_then(|f| TraceWriter::new(BufWriter::with_capacity(1 << 20, f), header))?;
        Ok(FaultTrace(Mutex::new(w)))
    }

    /// Appends a fault at `t_ns` since the region started.
    pub(crate) fn record(&self, t_ns: u64, page: usize, tid: u32, kind: FaultKind) {
        let kind = match kind {
            FaultKind::MissingRead => Kind::MissingRead,
            FaultKind::MissingWrite => Kind::MissingWrite,
            FaultKind::WriteProtect => Kind::WriteProtect,
            FaultKind::Minor => return,
        };
        let mut w = self.0.lock().expect("trace lock");
        if let Err(e) = w.record_fault(t_ns, page as u64, tid, kind) {
            log::warn!("fault trace: {e}");
        }
    }

    /// Appends the pages an access scan at `t_ns` saw written (`Kind::Referenced` records).
    pub(crate) fn record_referenced(&self, t_ns: u64, pages: &[usize]) {
        let mut w = self.0.lock().expect("trace lock");
        for &page in pages {
            if let Err(e) = w.record_fault(t_ns, page as u64, 0, Kind::Referenced) {
                log::warn!("fault trace: {e}");
                return;
            }
        }
    }

    /// Writes out what is buffered.
    pub(crate) fn flush(&self) {
        let mut w = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(e) = w.flush() {
            log::warn!("flushing the fault trace: {e}");
        }
    }
}
