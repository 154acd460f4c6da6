//! The eviction watchdog: a thread that looks every [`WATCH_PERIOD`] for an eviction batch stuck
//! taking its victims into its pipe, and zero-fills its victims the program dropped
//! (`evictors.rs` says why a batch can get stuck and why that loses nothing); and every
//! [`pinned::CHECK_PERIOD`] for buffers the program registered with io_uring in managed memory,
//! which stop it (`pinned.rs`), and, in a fork child, whether its parent exited
//! (`inherit.rs`).

use std::sync::Arc;
use std::time::Instant;

use crate::engine::Engine;
use crate::evictors::{STUCK_AFTER, WATCH_PERIOD};
use crate::fatal::fatal;
use crate::pinned;

/// The watchdog thread's loop, until the region stops. It runs at the idle scheduling class:
/// woken every 10 ms at the normal class, it preempted the thread it woke beside
/// (memcached pinned to one CPU: its reclaim thread in a batch, whose pages memcached's threads
/// then waited for), and memcached at 50% local lost 10-30% of its throughput to a watchdog that
/// never had anything to do (`bench/results/evictors-ab/`). An idle-class thread never preempts
/// another and still gets a sliver of a busy CPU.
pub(crate) fn run(engine: Arc<Engine>) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sets the calling thread's policy from a live parameter block.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        log::debug!(
            "the eviction watchdog stays at the normal scheduling class: {}",
            std::io::Error::last_os_error()
        );
    }
    let mut looked = Instant::now();
    loop {
        let mut fd = libc::pollfd {
            fd: engine.stop.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one valid descriptor that lives across the call.
        unsafe { libc::poll(&mut fd, 1, WATCH_PERIOD.as_millis() as i32) };
        if engine.stopping() {
            return;
        }
        engine.evictors.rescue(&engine.mem, STUCK_AFTER, |page| {
            engine.note_dropped_behind_back(page);
        });
        if looked.elapsed() >= pinned::CHECK_PERIOD {
            looked = Instant::now();
            stop_if_pinned(&engine);
            take_if_orphaned(&engine);
        }
    }
}

/// Stops the program if it registered a buffer in managed memory with io_uring (`pinned.rs`).
fn stop_if_pinned(engine: &Engine) {
    let mapping = &engine.mem.mapping;
    let buffers = pinned::registered_buffers();
    if let Some((addr, len)) = pinned::first_overlapping(&buffers, mapping.addr(), mapping.len()) {
        fatal(&format!(
            "the program registered a buffer in far memory with io_uring ({len} bytes at \
             {addr:#x}): the kernel pins it and writes into it directly, which a pager cannot \
             follow, so what it wrote may be lost. Allocate such buffers with \
             mmap(MAP_SHARED | MAP_ANONYMOUS), which stays local, or run the program without \
             gleaner (docs/compatibility.md)"
        ));
    }
}

/// If the region's process outlived the process that forked it, raises its budget to that
/// process's (`inherit.rs`): the budget, the reclaim scheduler's and the eviction policy's.
fn take_if_orphaned(engine: &Engine) {
    let Some(pages) = engine.heir.due() else {
        return;
    };
    let before = engine.budget.pages();
    if !engine.budget.grow(pages) {
        return;
    }
    engine.reclaim.set_budget(pages);
    engine
        .policy
        .lock()
        .expect("eviction policy lock")
        .set_capacity(pages);
    log::info!(
        "pid {}: the process that forked it exited; its local budget of {pages} pages is this \
         process's now (it had {before})",
        std::process::id()
    );
}
