//! Taking turns with the program over descriptor numbers while gleaner makes a descriptor.
//!
//! The kernel gives a new descriptor the lowest free number, which may be one the program has
//! just closed and is about to fill by number: CPython's `subprocess` tests close descriptor 1
//! or 2, start a child, then `dup2` a saved copy back onto it. Between the moment gleaner makes a descriptor (a memnode
//! connection, a granted memfd, an eviction pipe, the watchdog's look at `/proc/self/fd`) and
//! the moment it moves it out of the way ([`crate::adopt`]) or closes it, that descriptor is not
//! recorded, and the program's `dup2` onto its number replaced gleaner's file with the
//! program's (gleaner then read the program's file, or closed it later: the program lost its
//! restored stderr and exited with status 1, silently), or the program's `close` of the number
//! closed gleaner's (Rust's directory reader aborts the process when its `closedir` fails).
//!
//! So the two take turns, Dekker-style, with two counters:
//!
//! * gleaner's code holds [`Making`] from just before it makes a descriptor until that
//!   descriptor is adopted or closed: it raises `MAKING`, then waits for the program's calls
//!   already under way to finish (`CALLING` back at 0);
//! * the interposed `close`, `close_range`, `dup2` and `dup3` hold [`ProgramCall`] while they
//!   run on the program's behalf: each waits while `MAKING` is raised, then raises `CALLING`,
//!   and backs off if gleaner raised `MAKING` meanwhile.
//!
//! With sequentially consistent counters one side always sees the other's raise, so a program
//! call never runs while a descriptor of gleaner's is unrecorded. gleaner goes first (a program
//! call that sees it waiting backs off), so it waits at most for the calls already in the
//! kernel. Neither side waits forever: a program thread stopped inside a call, or a signal
//! handler that faults on far memory in the middle of one, must not stop the pager, so
//! gleaner stops waiting after [`GLEANER_PATIENCE`]; and a program call goes on after
//! [`PROGRAM_PATIENCE`] (gleaner's windows last microseconds: only a bug would hold one that
//! long). Waiting costs a program call two atomic operations when nobody is making anything.
//!
//! A fork child inherits the counts of its parent's threads, which it does not have:
//! [`after_fork_in_child`] starts them over.
//!
//! Not covered: the program's own `open` is not interposed, so a program that closes a number
//! and at once opens a file expecting it (a shell's `close(0)` then `open("/dev/null")`) may
//! find it taken for the microseconds of a window, and get the next number.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// gleaner's code between making a descriptor and adopting or closing it ([`Making`]).
static MAKING: AtomicUsize = AtomicUsize::new(0);
/// The program's descriptor calls under way ([`ProgramCall`]).
static CALLING: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The [`Making`] windows this thread holds: a descriptor call made inside one is gleaner's
    /// own (closing what it just made, say), and must not wait for the window it is in.
    static HOLDING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The longest gleaner waits for the program's calls under way to finish.
pub const GLEANER_PATIENCE: Duration = Duration::from_millis(100);
/// The longest a program call waits for gleaner to finish making descriptors.
pub const PROGRAM_PATIENCE: Duration = Duration::from_secs(1);

/// gleaner is making a descriptor, until dropped: the program's `close`, `close_range`, `dup2`
/// and `dup3` wait meanwhile. Hold it from before the descriptor exists until it is adopted
/// ([`crate::adopt`]) or closed, and over nothing that blocks (a connection's handshake, a
/// read that waits for a peer). Nests, and may be held on several threads at once.
#[must_use = "the program's calls wait only while this is held"]
pub struct Making(());

/// Starts a [`Making`] window: waits (at most [`GLEANER_PATIENCE`]) for the program's
/// descriptor calls already under way.
pub fn making() -> Making {
    HOLDING.with(|h| h.set(h.get() + 1));
    MAKING.fetch_add(1, Ordering::SeqCst);
    wait_while(&CALLING, GLEANER_PATIENCE);
    Making(())
}

impl Drop for Making {
    fn drop(&mut self) {
        HOLDING.with(|h| h.set(h.get().saturating_sub(1)));
        // A window opened before a fork finds the child's count started over.
        let _ = MAKING.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }
}

/// A program's descriptor call under way (the interposed `close`, `close_range`, `dup2`,
/// `dup3`), until dropped. Not to be nested: a call that holds one and asks for another could
/// wait for gleaner while gleaner waits for it (both give up after their patience).
#[must_use = "gleaner waits for the call only while this is held"]
pub struct ProgramCall(());

/// Starts a program's descriptor call: waits while gleaner is making a descriptor (at most
/// [`PROGRAM_PATIENCE`] in all). A thread inside a [`Making`] window of its own does not wait.
pub fn program_call() -> ProgramCall {
    if HOLDING.with(|h| h.get()) > 0 {
        CALLING.fetch_add(1, Ordering::SeqCst);
        return ProgramCall(());
    }
    let started = Instant::now();
    loop {
        let patient = wait_while(&MAKING, PROGRAM_PATIENCE.saturating_sub(started.elapsed()));
        CALLING.fetch_add(1, Ordering::SeqCst);
        if !patient || MAKING.load(Ordering::SeqCst) == 0 {
            return ProgramCall(());
        }
        // gleaner started making one between the wait and the raise: it goes first.
        let _ = CALLING.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }
}

impl Drop for ProgramCall {
    fn drop(&mut self) {
        let _ = CALLING.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }
}

/// Waits while `count` is above 0, for at most `patience`: spinning briefly, then yielding the
/// CPU, then sleeping in short steps. Returns false if it gave up.
fn wait_while(count: &AtomicUsize, patience: Duration) -> bool {
    let mut started = None;
    let mut round = 0u32;
    while count.load(Ordering::SeqCst) > 0 {
        let since = *started.get_or_insert_with(Instant::now);
        if since.elapsed() >= patience {
            return false;
        }
        round += 1;
        if round < 64 {
            std::hint::spin_loop();
        } else if round < 256 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    true
}

/// For a fork child's first moments: the windows and calls its parent's other threads had open
/// are not the child's.
pub(crate) fn after_fork_in_child() {
    MAKING.store(0, Ordering::SeqCst);
    CALLING.store(0, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    use super::*;

    /// The counters are the process's: these tests take turns.
    static TURNS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn a_program_call_waits_for_a_window_and_a_window_for_a_call() {
        let _one = TURNS.lock().unwrap_or_else(|e| e.into_inner());
        // A window open: the call waits until it closes.
        let window = making();
        let called = Arc::new(AtomicBool::new(false));
        let caller = {
            let called = called.clone();
            std::thread::spawn(move || {
                let _call = program_call();
                called.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !called.load(Ordering::SeqCst),
            "the call ran inside the window"
        );
        drop(window);
        caller.join().unwrap();
        assert!(called.load(Ordering::SeqCst));

        // A call under way: the window waits until it ends.
        let call = program_call();
        let opened = Arc::new(AtomicBool::new(false));
        let maker = {
            let opened = opened.clone();
            std::thread::spawn(move || {
                let _window = making();
                opened.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(30));
        assert!(
            !opened.load(Ordering::SeqCst),
            "the window opened during the call"
        );
        drop(call);
        maker.join().unwrap();
        assert!(opened.load(Ordering::SeqCst));
        assert_eq!(MAKING.load(Ordering::SeqCst), 0);
        assert_eq!(CALLING.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn neither_side_waits_past_its_patience() {
        let _one = TURNS.lock().unwrap_or_else(|e| e.into_inner());
        // A call that never ends (a program thread stopped inside it): the window opens anyway.
        let call = program_call();
        let waited = std::thread::spawn(|| {
            let started = Instant::now();
            drop(making());
            started.elapsed()
        })
        .join()
        .unwrap();
        assert!(
            waited >= GLEANER_PATIENCE && waited < GLEANER_PATIENCE * 20,
            "{waited:?}"
        );
        drop(call);
        // A window that never closes: the call goes on after its patience.
        let window = making();
        let waited = std::thread::spawn(|| {
            let started = Instant::now();
            drop(program_call());
            started.elapsed()
        })
        .join()
        .unwrap();
        assert!(
            waited >= PROGRAM_PATIENCE && waited < PROGRAM_PATIENCE * 5,
            "{waited:?}"
        );
        // The thread inside a window makes its own calls without waiting.
        let started = Instant::now();
        drop(program_call());
        assert!(started.elapsed() < GLEANER_PATIENCE);
        drop(window);
        assert_eq!(MAKING.load(Ordering::SeqCst), 0);
        assert_eq!(CALLING.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_fork_child_does_not_wait_for_its_parents_windows() {
        let _one = TURNS.lock().unwrap_or_else(|e| e.into_inner());
        // Another thread of the parent is inside a window at the fork.
        let (opened, close) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let holder = std::thread::spawn(move || {
            let _window = making();
            opened.0.send(()).unwrap();
            let _ = close.1.recv();
        });
        opened.1.recv().unwrap();
        // SAFETY: the child only calls async-signal-safe functions (atomics, clock_gettime,
        // sched_yield, nanosleep) and `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            crate::after_fork_in_child();
            let started = Instant::now();
            drop(program_call());
            let quick = started.elapsed() < GLEANER_PATIENCE;
            // SAFETY: ends the child at once, running nothing of the parent's.
            unsafe { libc::_exit(if quick { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked, into a live local.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        close.0.send(()).unwrap();
        holder.join().unwrap();
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child's call waited for a window of a thread it does not have ({status:#x})"
        );
    }

    #[test]
    fn windows_and_calls_never_overlap_under_contention() {
        let _one = TURNS.lock().unwrap_or_else(|e| e.into_inner());
        // Each side marks itself inside; the other must never find it there.
        let inside_making = Arc::new(AtomicUsize::new(0));
        let inside_call = Arc::new(AtomicUsize::new(0));
        let overlaps = Arc::new(AtomicUsize::new(0));
        let mut threads = Vec::new();
        for side in 0..4 {
            let (mine, theirs) = if side % 2 == 0 {
                (inside_making.clone(), inside_call.clone())
            } else {
                (inside_call.clone(), inside_making.clone())
            };
            let overlaps = overlaps.clone();
            threads.push(std::thread::spawn(move || {
                let rounds = if side % 2 == 0 { 2_000 } else { 20_000 };
                for _ in 0..rounds {
                    let guard: Box<dyn std::any::Any> = if side % 2 == 0 {
                        Box::new(making())
                    } else {
                        Box::new(program_call())
                    };
                    mine.fetch_add(1, Ordering::SeqCst);
                    if theirs.load(Ordering::SeqCst) > 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    mine.fetch_sub(1, Ordering::SeqCst);
                    drop(guard);
                    std::thread::yield_now();
                }
            }));
        }
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    }
}
