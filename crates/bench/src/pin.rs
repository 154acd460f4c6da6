//! `--pin-cpu N`: the threads that run the access pattern (and the init pass) on one CPU, so that
//! gleaner and the plain-memory run under Linux swap can be pinned alike.
//!
//! Threads inherit the affinity of the thread that creates them, so pinning the thread that
//! spawns the stream threads pins those too. Pin *after* the region exists: its fault handlers,
//! evictor and embedded memnode are not the program's threads and keep their own placement.

use gleaner_sys::affinity;

/// The calling thread's affinity before it was pinned; restored on drop.
/// Not `Send`: it must be dropped on the thread it pinned.
pub struct Pinned {
    saved: affinity::CpuSet,
    _same_thread: std::marker::PhantomData<*const ()>,
}

/// Pins the calling thread to `cpu`; the returned guard puts the previous affinity back.
pub fn pin_current_thread(cpu: usize) -> Result<Pinned, String> {
    let saved = affinity::current().map_err(|e| format!("sched_getaffinity: {e}"))?;
    affinity::pin_to(cpu)
        .map_err(|e| format!("--pin-cpu {cpu}: {e} (is CPU {cpu} online and allowed?)"))?;
    Ok(Pinned {
        saved,
        _same_thread: std::marker::PhantomData,
    })
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Err(e) = affinity::set(&self.saved) {
            log::warn!("restoring the CPU affinity after --pin-cpu: {e}");
        }
    }
}
