//! The eviction watchdog: a thread that looks every [`WATCH_PERIOD`] for an eviction batch stuck
//! taking its victims into its pipe, and zero-fills its victims the program dropped
//! (`evict/evictors.rs` says why a batch can get stuck and why that loses nothing); and every
//! [`pinned::CHECK_PERIOD`] for buffers the program registered with io_uring in managed memory,
//! which stop it (`memory/pinned.rs`), and, in a fork child, whether its parent exited
//! (`evict/inherit.rs`); and, as often, whether a pager thread waits for a page of its own process's
//! far memory, which stops the program (`observe/stuck.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::Engine;
use crate::evict::evictors::{STUCK_AFTER, WATCH_PERIOD};
use crate::fatal::fatal;
use crate::memory::pinned;
use crate::observe::stuck::{self, StuckWatch};

/// The watchdog thread's loop, until the region stops. It runs at `SCHED_BATCH`, at the
/// program's nice value (at nice 19 its share of a busy CPU was still too small for a killed
/// process to end promptly: 2-287 ms beside two busy loops, against 2-8 ms at 0;
/// `bench/results/watchdog-class/README.md`): woken every 10 ms at the normal class, it preempted the thread it woke beside
/// (memcached pinned to one CPU: its reclaim thread in a batch, whose pages memcached's threads
/// then waited for), and memcached at 50% local lost throughput to a watchdog that never had
/// anything to do (`bench/results/evictors-ab/README.md`). A batch-class thread never preempts
/// another on waking. It was at the idle class (`SCHED_IDLE`), which never does either, but
/// whose share of a busy CPU is a sliver: a process ends only once each of its threads has run
/// to its end, and on a busy machine a process killed with `SIGKILL` (or one that exited)
/// waited up to a second for its idle-class watchdog to be given the CPU to die on (CPython's
/// `test_leak_fast_process_del_killed` expects a killed child reaped within 0.2 s). Its own
/// work is now paid at the normal weight, so its dear looks are spaced by their cost
/// (`pinned::next_look_in`) or done once (`observe/stuck.rs`: a thread's name).
pub(crate) fn run(engine: Arc<Engine>) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sets the calling thread's policy from a live parameter block.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } != 0 {
        log::debug!(
            "the eviction watchdog stays at the normal scheduling class: {}",
            std::io::Error::last_os_error()
        );
    }
    let mut looked = Instant::now();
    let mut pinned_due = looked + pinned::CHECK_PERIOD;
    let mut waits = StuckWatch::default();
    let mut rescued_before = engine.evictors.rescued();
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
            // Both read files in /proc, each open for a moment, without raising the
            // program's descriptor limit (`gleaner_fds::headroom`, which another thread of
            // the program would see): at its limit, a check is skipped.
            stuck::test_hang_here(stuck::HangSite::Watchdog);
            if looked >= pinned_due {
                // As often as its cost allows (`pinned::next_look_in`).
                let cpu = crate::cpus::thread_cpu_ns();
                stop_if_pinned(&engine);
                let cost = Duration::from_nanos(crate::cpus::thread_cpu_ns().saturating_sub(cpu));
                pinned_due = looked + pinned::next_look_in(cost);
            }
            take_if_orphaned(&engine);
            // Pager threads this watchdog's rescue freed since the last look were slow, not
            // hung: each capture that met pages the program dropped waited for a rescue (a
            // watch period), and a thread seen in such waits at every look is making progress.
            let rescued = engine.evictors.rescued();
            if rescued == rescued_before {
                stop_if_waiting_for_itself(&mut waits);
            } else {
                rescued_before = rescued;
                waits = StuckWatch::default();
            }
            stop_if_a_fork_never_ends(&engine);
        }
    }
}

/// Stops the program if it registered a buffer in managed memory with io_uring (`memory/pinned.rs`).
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

/// Stops the program if every fault handler has waited for a page of this process's managed
/// memory for [`stuck::OWN_CHECKS`] checks in a row, or one pager thread for
/// [`stuck::LONG_WAIT_CHECKS`] (`observe/stuck.rs`): the process would hang for good.
fn stop_if_waiting_for_itself(waits: &mut StuckWatch) {
    let Some(look) = waits.check(None) else {
        return;
    };
    if let Some(why) = look.hung(stuck::OWN_CHECKS, 0) {
        fatal(&format!(
            "{why}, so the process would hang for good (a gleaner bug: please report it with \
             this message)"
        ));
    }
}

/// How long a fork may hold the fault handlers back (`engine.rs`'s `Gate`) before the program
/// is stopped: a fork takes milliseconds (its page tables are copied in about a second for
/// 100 GiB resident).
const FORK_STUCK_AFTER: Duration = Duration::from_secs(10);

/// Stops the program if a fork has held the fault handlers back for [`FORK_STUCK_AFTER`]: the
/// forking thread waits for something that waits for a fault, which waits for the fork (a
/// thread holding the C library's list of stdio streams while it waits for a far page, at the
/// moment another thread forks); the process would hang for good.
fn stop_if_a_fork_never_ends(engine: &Engine) {
    let held = engine.gate.closed_for();
    if held >= FORK_STUCK_AFTER {
        fatal(&format!(
            "a fork has held this process's fault handlers back for {} s: the thread that \
             forks waits for another, which waits for a page that the fork holds back, so the \
             process would hang for good (a gleaner limit: please report it with this message)",
            held.as_secs()
        ));
    }
}

/// If the region's process outlived the process that forked it, raises its budget to that
/// process's (`evict/inherit.rs`): the budget, the reclaim scheduler's and the eviction policy's.
fn take_if_orphaned(engine: &Engine) {
    let Some(pages) = engine.heir.due() else {
        return;
    };
    let before = engine.budget.pages();
    if !engine.budget.grow(pages) {
        return;
    }
    engine.budget_changed(pages);
    log::info!(
        "pid {}: the process that forked it exited; its local budget of {pages} pages is this \
         process's now (it had {before})",
        std::process::id()
    );
}
