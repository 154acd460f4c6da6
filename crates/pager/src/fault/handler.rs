//! Fault-handler threads: where they run, how they wait, and the loop that reads fault messages.
//!
//! # Placement
//!
//! By default there is one handler per CPU the process may run on, each pinned to its CPU. A
//! faulting thread goes to sleep in the kernel and wakes the handlers waiting on the
//! userfaultfd; the one pinned to the faulting thread's CPU runs at once in its place (a context
//! switch on the same CPU), resolves the fault and wakes the thread on that same CPU. A handler
//! on another CPU needs an inter-processor interrupt to wake, and its install another one to
//! wake the faulting thread; on the 2-vCPU test VM that path cost several times the same-CPU one
//! per fault (`docs/BENCHMARKS.md`, "What a userfaultfd fault costs: handler placement").
//!
//! # Waiting
//!
//! A handler blocks in `read` on the userfaultfd, made blocking for it, and the region stops it
//! through a doorbell (`fault/doorbell.rs`): one system call a fault. Where the kernel cannot tell
//! one read not to block (needed while a fork child's first thread serves faults beside the
//! starting handlers), handlers block in `poll` on the userfaultfd and the stop eventfd, then
//! read. With a spin time set, a handler first keeps reading the userfaultfd without blocking
//! for that long after its last message, which saves its own wake-up while faults keep coming,
//! at the price of a busy CPU.
//!
//! Every waiting handler is woken for a message; the one on the faulting CPU usually reads it first
//! (redis at 50% local: few wake-ups returned empty, a lower bound: a handler woken after another
//! took the message mostly sleeps again inside `poll`, and a scheduler trace of unpinned redis
//! found both handlers woken for nearly every fault). Waking only one handler per message
//! (`EPOLLEXCLUSIVE`) was measured and rejected: the kernel then wakes the longest-waiting handler,
//! not the one on the faulting CPU, and redis's GET throughput halved in a same-session run.
//! Sending a handler that served another CPU's thread (probed through `/proc/self/task/TID/stat`)
//! to the back of that order gained unpinned redis throughput and cost unpinned memcached, whose
//! workers fault from both CPUs, as much; exclusive wake-ups only while the probes saw one CPU
//! gained nothing beyond noise (`bench/results/cpu-cuts-ab/README.md`, the runs, and the patches in
//! git history).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cpus::pin_to;
use crate::observe::counters::RegionCounters;
use gleaner_uffd::Event;

use crate::engine::{Engine, Inside};
use crate::fatal::fatal;
use crate::fault::resolve::Handler;
use crate::store::StoreHandle;

/// Messages read per `read` call.
const BATCH: usize = 16;

/// How long a fork child's first thread sleeps between looks at the userfaultfd while its
/// handlers start ([`serve_until`]).
const START_NAP: Duration = Duration::from_micros(20);

/// One handler thread's loop: wait for messages (or the stop signal), resolve each.
pub(crate) fn run(
    engine: Arc<Engine>,
    store: Box<dyn StoreHandle>,
    cpu: Option<usize>,
    spin: Duration,
) {
    if let Some(cpu) = cpu {
        pin_to(cpu);
    }
    let mut events = Vec::with_capacity(BATCH);
    let mut more = Vec::with_capacity(BATCH);
    let mut h = Handler::new(store);
    let mut last_message = Instant::now();
    let uffd = &engine.mem.uffd;
    loop {
        let spinning = !spin.is_zero() && last_message.elapsed() < spin;
        let read = match &engine.doorbell {
            // A blocking descriptor: the read waits for a message itself, and only the
            // doorbell ends the loop.
            Some(_) if spinning => uffd.read_events_nowait(&mut events, BATCH),
            Some(_) => uffd.read_events(&mut events, BATCH),
            None => {
                if !spinning && !wait_for_events(&engine) {
                    return;
                }
                if engine.stopping() {
                    return;
                }
                uffd.read_events(&mut events, BATCH)
            }
        };
        match read {
            Ok(0) => {
                // Woken with the others, but another handler read the message first (or, in a
                // blocking read, a signal ended the wait).
                RegionCounters::add(&engine.counters.handler_empty_wakeups, 1);
                continue;
            }
            Ok(n) => {
                RegionCounters::add(&engine.counters.handler_wakeups, 1);
                RegionCounters::add(&engine.counters.handler_messages, n as u64);
                if !spin.is_zero() {
                    last_message = Instant::now();
                }
            }
            Err(e) => fatal(&format!("reading userfaultfd events failed: {e}")),
        }
        // A fork waits for the faults being served to finish, and holds the next ones back,
        // but for the forking thread's own (`engine.rs`'s `Gate`).
        let inside = pass_gate(&engine, &mut h, &mut events, &mut more);
        // The region is stopping and this handler's turn to go came in (`fault/doorbell.rs`).
        let rang = engine
            .doorbell
            .as_ref()
            .and_then(|bell| Some((bell, bell.take_ring(&mut events)?)));
        h.serve(&engine, &mut events);
        drop(inside);
        crate::observe::stuck::test_hang_here(crate::observe::stuck::HangSite::Handler);
        if let Some((bell, addr)) = rang {
            bell.answer(uffd, addr);
            return;
        }
    }
}

/// Enters the gate for `events`. While a fork holds it closed, serves the forking thread's
/// faults among them (and among the messages that come meanwhile, which join `events`): that
/// thread may fault in the C library's own fork code, and no other thread could serve it.
fn pass_gate<'e>(
    engine: &'e Engine,
    h: &mut Handler,
    events: &mut Vec<Event>,
    more: &mut Vec<Event>,
) -> Inside<'e> {
    loop {
        if let Some(inside) = engine.gate.try_enter() {
            return inside;
        }
        let Some(forker) = engine.gate.forker() else {
            std::thread::sleep(GATE_NAP);
            continue;
        };
        h.serve_forker(engine, forker, events);
        // Its next fault may be in a message not read yet: look, without blocking.
        let read = if engine.doorbell.is_some() {
            engine.mem.uffd.read_events_nowait(more, BATCH)
        } else {
            engine.mem.uffd.read_events(more, BATCH)
        };
        match read {
            Ok(0) => std::thread::sleep(GATE_NAP),
            Ok(_) => events.append(more),
            Err(e) => fatal(&format!("reading userfaultfd events failed: {e}")),
        }
    }
}

/// How long a handler sleeps between looks while a fork holds the gate closed.
const GATE_NAP: Duration = Duration::from_micros(50);

/// Serves faults on the calling thread until `done()` (checked at least every millisecond): a
/// fork child's only thread, while the threads it starts come up (the C library's thread
/// start-up may read far pages, which nobody else could fetch yet).
pub(crate) fn serve_until(engine: &Engine, store: Box<dyn StoreHandle>, done: impl Fn() -> bool) {
    let mut events = Vec::with_capacity(BATCH);
    let mut h = Handler::new(store);
    while !done() {
        let read = if engine.doorbell.is_some() {
            // A blocking descriptor (`fault/doorbell.rs`), on which `poll` reports only an error at
            // once: look without blocking, and sleep a little when nothing came. Spinning
            // instead kept a handler pinned to this CPU from starting for a whole scheduler
            // slice, on every fork (`bench/results/spawn/README.md`).
            let read = engine.mem.uffd.read_events_nowait(&mut events, BATCH);
            if matches!(read, Ok(0)) {
                std::thread::sleep(START_NAP);
                continue;
            }
            read
        } else {
            let mut fd = libc::pollfd {
                fd: engine.mem.uffd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll on one valid descriptor that lives across the call.
            if unsafe { libc::poll(&mut fd, 1, 1) } <= 0 {
                continue;
            }
            // A non-blocking descriptor: a handler may have read the message since `poll`
            // saw it.
            engine.mem.uffd.read_events(&mut events, BATCH)
        };
        if let Err(e) = read {
            fatal(&format!("reading userfaultfd events failed: {e}"));
        }
        h.serve(engine, &mut events);
    }
    // This thread goes on as the program's: its faults are no evicting thread's any more.
    if let Some(ev) = h.evictor.take() {
        engine.evictors.unregister(ev.slot());
    }
}

/// Blocks until the userfaultfd has messages (true) or the region is stopping (false).
fn wait_for_events(engine: &Engine) -> bool {
    loop {
        if engine.stopping() {
            return false;
        }
        let mut fds = [
            libc::pollfd {
                fd: engine.mem.uffd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: engine.stop.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll on two valid descriptors in an array that lives across the call.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if r > 0 && fds[0].revents & libc::POLLIN != 0 {
            return !engine.stopping();
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            fatal(&format!(
                "poll on the userfaultfd failed: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
}
