//! Finding a pager that waits for itself: a pager thread parked in the kernel's userfaultfd
//! wait (`handle_userfault`) for a page of its own process's managed memory.
//!
//! No pager thread may ever touch managed memory on its own account: the pages there are
//! fetched by the pager's fault handlers, so a handler that faults may wait for itself, and once
//! every fault handler does, nothing serves a fault again and the process hangs for good. The
//! rule is kept by design (the runtime allocates from the C library's heap, the dynamic
//! linker's records stay out of managed memory, every signal is blocked on pager threads, the
//! group list of `setgroups` is copied), but a way around it that nobody has thought of would
//! hang a program silently. (An evicting thread may wait for a handler a moment, on a page the
//! program dropped while it was being taken: a handler serves that at once, and the watchdog
//! rescues it; so may any pager thread, as long as a handler is left to serve it.) So two
//! watchers look for the sign that none is left, every fault handler waiting (or any pager
//! thread waiting far longer than anything could make it, [`LONG_WAIT_CHECKS`]):
//!
//! * the process's own watchdog thread (the eviction watchdog) stops the process with exit 86 and a
//!   message naming the threads, once they have waited for [`OWN_CHECKS`] checks in a row (a
//!   check at which its rescue of evicting threads freed pages since the last starts the count
//!   again: those waits end, one watch period each);
//! * `gleaner run` looks at every process of the run the same way, and ends one whose handlers
//!   have waited for [`LAUNCHER_CHECKS`]: the backstop for a process where even the watchdog
//!   waits.
//!
//! A thread of the pager is known by its name (`thread.rs` names them; the fault handlers
//! `gleaner-fault*`) and its wait by `/proc/PID/task/TID/wchan`.

use crate::observe::procfs;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// Checks (one a second) every fault handler may be seen waiting before the process's own
/// watchdog stops it. A fault a handler serves takes microseconds; a memnode that does not
/// answer is waited for in a socket, not here.
pub const OWN_CHECKS: u32 = 3;

/// Checks (one a second) before `gleaner run` ends a process whose fault handlers all wait:
/// later than [`OWN_CHECKS`], so that a watchdog that can still act stops the process itself.
pub const LAUNCHER_CHECKS: u32 = 8;

/// Checks (one a second) any one pager thread may be seen waiting before its process is taken
/// for hung even though a fault handler is left: past twice the reply timeout (30 s by default)
/// after which a handler gives a memnode that does not answer up and reconnects, the longest a
/// pager thread could wait for a handler. A deadlock that leaves a handler free but never
/// serves the fault (an evicting thread that faults on a page of its own batch, which the
/// handlers leave to it) is found here, late rather than never.
pub const LONG_WAIT_CHECKS: u32 = 75;

/// How much later than the process's own watchdog `gleaner run` takes a process for hung by
/// [`LONG_WAIT_CHECKS`].
pub const LAUNCHER_LONG_WAIT_EXTRA: u32 = 15;

/// The name every fault handler's begins with.
const HANDLER_PREFIX: &str = "gleaner-fault";

/// The kernel function a thread waits in for a userfaultfd to resolve its fault.
const WAIT_SYMBOL: &str = "handle_userfault";

/// A pager thread seen waiting for a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// The thread's id.
    pub tid: u32,
    /// The thread's name (`gleaner-fault0`, ...).
    pub name: String,
    /// How many checks in a row it has been seen waiting.
    pub checks: u32,
}

/// Which pager threads of one process wait for a page, check after check.
#[derive(Debug, Default)]
pub struct StuckWatch {
    /// tid -> checks in a row seen waiting.
    seen: HashMap<u32, u32>,
    /// tid -> what its name said ([`Kind`]), so that a look reads the names of the program's
    /// threads once, not every second: a JVM's thousand threads cost the watchdog 1.7% of a CPU.
    kinds: HashMap<u32, Kind>,
}

/// What a thread's name says about it, as far as the watch is concerned.
#[derive(Debug, Clone, PartialEq)]
enum Kind {
    /// A pager thread, by this name (a pager thread names itself as it starts, for good).
    Pager(String),
    /// Not a pager thread, read once: read again at the next look, in case the first read came
    /// between a new pager thread's start and its naming itself.
    OtherOnce,
    /// Not a pager thread, read at two looks in a row: not read again.
    Other,
}

/// One look at a process: its fault handlers, and its pager threads waiting for a page.
#[derive(Debug, Default, PartialEq)]
pub struct Look {
    /// How many fault-handler threads it has.
    pub handlers: usize,
    /// Its pager threads waiting now, with their checks in a row.
    pub waiting: Vec<Waiting>,
}

impl Look {
    /// Whether every fault handler has waited at least `checks` checks in a row: then no thread
    /// is left to serve a fault. Returns the one that has waited longest.
    pub fn all_handlers_waiting(&self, checks: u32) -> Option<&Waiting> {
        let long = |w: &&Waiting| w.name.starts_with(HANDLER_PREFIX) && w.checks >= checks;
        if self.handlers == 0 || self.waiting.iter().filter(long).count() < self.handlers {
            return None;
        }
        self.waiting.iter().filter(long).max_by_key(|w| w.checks)
    }

    /// The pager thread that has waited longest, if for `checks` checks or more.
    pub fn longest_wait(&self, checks: u32) -> Option<&Waiting> {
        self.waiting
            .iter()
            .filter(|w| w.checks >= checks)
            .max_by_key(|w| w.checks)
    }

    /// Why the process is taken for hung, if it is: every fault handler has waited `handlers`
    /// checks, or one pager thread [`LONG_WAIT_CHECKS`] (`extra` added: the launcher looks
    /// later than the process's own watchdog).
    pub fn hung(&self, handlers: u32, extra: u32) -> Option<String> {
        if let Some(w) = self.all_handlers_waiting(handlers) {
            return Some(format!(
                "every fault handler has waited {} s or more for a page of the process's own \
                 far memory, which only they can fetch (waiting: {})",
                w.checks,
                self.names()
            ));
        }
        let w = self.longest_wait(LONG_WAIT_CHECKS + extra)?;
        Some(format!(
            "its pager thread {} has waited {} s for a page of the process's own far memory, \
             which only the pager can fetch (waiting: {})",
            w.name,
            w.checks,
            self.names()
        ))
    }

    /// The names of the threads waiting, for messages: `gleaner-fault0, gleaner-fault1`.
    pub fn names(&self) -> String {
        let mut names: Vec<&str> = self.waiting.iter().map(|w| w.name.as_str()).collect();
        names.sort_unstable();
        names.join(", ")
    }
}

impl StuckWatch {
    /// Takes one look at process `pid` (`None`: this process). `None` when the process is gone.
    pub fn check(&mut self, pid: Option<u32>) -> Option<Look> {
        let root = match pid {
            Some(pid) => format!("/proc/{pid}/task"),
            None => "/proc/self/task".to_string(),
        };
        let tasks = procfs::entry_names(&root).ok()?;
        let tids: Vec<u32> = tasks
            .iter()
            .filter_map(|t| t.to_str().and_then(|n| n.parse().ok()))
            .collect();
        // Threads gone since the last look (a tid reused later is read afresh; one reused
        // within a look's interval, after the kernel's pids wrapped around, is not).
        let listed: std::collections::HashSet<u32> = tids.iter().copied().collect();
        self.kinds.retain(|tid, _| listed.contains(tid));
        let mut handlers = 0;
        let mut now = Vec::new();
        for tid in tids {
            let known = self.kinds.get(&tid).cloned();
            let kind = match known {
                Some(k @ (Kind::Pager(_) | Kind::Other)) => k,
                again => {
                    let Ok(name) = gleaner_fds::read_to_string(format!("{root}/{tid}/comm")) else {
                        continue;
                    };
                    let name = name.trim();
                    let kind = if name.starts_with("gleaner-") {
                        Kind::Pager(name.to_string())
                    } else if again == Some(Kind::OtherOnce) {
                        Kind::Other
                    } else {
                        Kind::OtherOnce
                    };
                    self.kinds.insert(tid, kind.clone());
                    kind
                }
            };
            let Kind::Pager(name) = kind else {
                continue;
            };
            let name = name.as_str();
            handlers += usize::from(name.starts_with(HANDLER_PREFIX));
            let waits = gleaner_fds::read_to_string(format!("{root}/{tid}/wchan"))
                .is_ok_and(|w| w.trim() == WAIT_SYMBOL);
            if waits {
                now.push((tid, name.to_string()));
            }
        }
        Some(Look {
            handlers,
            waiting: self.observe(&now),
        })
    }

    /// Records one look: `waiting` are the pager threads waiting now (tid, name). Returns them
    /// with their count of checks in a row; a thread not waiting starts over.
    fn observe(&mut self, waiting: &[(u32, String)]) -> Vec<Waiting> {
        self.seen
            .retain(|tid, _| waiting.iter().any(|(t, _)| t == tid));
        waiting
            .iter()
            .map(|(tid, name)| {
                let checks = self.seen.entry(*tid).or_insert(0);
                *checks += 1;
                Waiting {
                    tid: *tid,
                    name: name.clone(),
                    checks: *checks,
                }
            })
            .collect()
    }
}

/// Which pager threads the test hook makes wait for themselves ([`arm_test_hang`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestHang {
    /// Every fault handler: the process's watchdog must stop it.
    Handlers,
    /// Every fault handler and the watchdog itself: `gleaner run` must end it.
    HandlersAndWatchdog,
}

/// The test hook's mode (0: off, 1: [`TestHang::Handlers`], 2: [`TestHang::HandlersAndWatchdog`]).
static TEST_HANG: AtomicU8 = AtomicU8::new(0);
/// The page the hook's threads read, which no handler serves.
static TEST_PAGE: AtomicUsize = AtomicUsize::new(usize::MAX);

/// A test hook, for the tests of the watchers above and nothing else (the preload library's
/// `GLEANER_TEST_HANG`): the page at `page_addr` (one of the region's that the program never
/// touches) is never served, and every fault handler once it has served a fault, and with
/// [`TestHang::HandlersAndWatchdog`] the watchdog too, reads it: they wait in the kernel for a
/// page only they could fetch, as pager threads that broke the rule would.
pub fn arm_test_hang(mode: TestHang, page_addr: usize) {
    TEST_PAGE.store(page_addr & !(crate::PAGE_SIZE - 1), Ordering::Relaxed);
    TEST_HANG.store(
        match mode {
            TestHang::Handlers => 1,
            TestHang::HandlersAndWatchdog => 2,
        },
        Ordering::Release,
    );
}

/// Whether `addr` is the test hook's page, whose faults are left unserved.
#[inline]
pub(crate) fn is_test_page(addr: usize) -> bool {
    addr & !(crate::PAGE_SIZE - 1) == TEST_PAGE.load(Ordering::Relaxed)
}

/// Who reaches [`test_hang_here`].
pub(crate) enum HangSite {
    /// A fault handler, after serving a batch of faults.
    Handler,
    /// The watchdog, at its periodic checks.
    Watchdog,
}

/// The test hook's wait, if it is armed for this thread (see [`arm_test_hang`]).
#[inline]
pub(crate) fn test_hang_here(site: HangSite) {
    let mode = TEST_HANG.load(Ordering::Relaxed);
    if mode == 0 {
        return;
    }
    let take = match site {
        HangSite::Handler => true,
        HangSite::Watchdog => mode == 2,
    };
    if take {
        let page = TEST_PAGE.load(Ordering::Relaxed) as *const u8;
        // SAFETY: a page of the region's mapping (readable, never freed while the region
        // lives); the read faults and waits for a handler, which is the point.
        unsafe { std::ptr::read_volatile(page) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_look_reads_the_program_threads_names_twice_then_no_more() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = std::sync::mpsc::channel::<()>();
        let handler = std::thread::Builder::new()
            // Not a handler's name: another test of this binary counts none.
            .name("gleaner-test9".into())
            .spawn(move || {
                // Named by now (a thread names itself as it starts, before this runs).
                started_tx.send(()).unwrap();
                let _ = rx.recv();
            })
            .unwrap();
        started.recv().unwrap();
        let mut watch = StuckWatch::default();
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() } as u32;
        watch.check(None).unwrap();
        assert_eq!(watch.kinds.get(&me), Some(&Kind::OtherOnce));
        assert!(
            watch
                .kinds
                .values()
                .any(|k| *k == Kind::Pager("gleaner-test9".into())),
            "{:?}",
            watch.kinds
        );
        watch.check(None).unwrap();
        assert_eq!(watch.kinds.get(&me), Some(&Kind::Other), "read twice");
        // A thread gone is forgotten.
        tx.send(()).unwrap();
        handler.join().unwrap();
        watch.check(None).unwrap();
        assert!(
            !watch
                .kinds
                .values()
                .any(|k| *k == Kind::Pager("gleaner-test9".into())),
            "{:?}",
            watch.kinds
        );
    }

    fn w(tid: u32, name: &str) -> (u32, String) {
        (tid, name.to_string())
    }

    #[test]
    fn a_thread_counts_checks_in_a_row_and_starts_over_once_it_moves_on() {
        let mut watch = StuckWatch::default();
        assert_eq!(watch.observe(&[w(1, "gleaner-fault0")])[0].checks, 1);
        let second = watch.observe(&[w(1, "gleaner-fault0"), w(2, "gleaner-recl0")]);
        assert_eq!(second.iter().map(|w| w.checks).collect::<Vec<_>>(), [2, 1]);
        // Thread 1 served its page and went on: a later wait counts from one again.
        assert_eq!(watch.observe(&[w(2, "gleaner-recl0")])[0].checks, 2);
        assert_eq!(watch.observe(&[w(1, "gleaner-fault0")])[0].checks, 1);
    }

    #[test]
    fn a_process_is_stuck_only_when_every_fault_handler_has_waited() {
        let waiting = |list: &[(u32, &str, u32)]| {
            list.iter()
                .map(|&(tid, name, checks)| Waiting {
                    tid,
                    name: name.into(),
                    checks,
                })
                .collect::<Vec<_>>()
        };
        // A reclaim thread waiting for a handler, which is free to serve it: not stuck.
        let one = Look {
            handlers: 2,
            waiting: waiting(&[(3, "gleaner-recl0", 9)]),
        };
        assert_eq!(one.all_handlers_waiting(3), None);
        // One handler of two waiting: the other serves its fault.
        let half = Look {
            handlers: 2,
            waiting: waiting(&[(1, "gleaner-fault0", 9), (3, "gleaner-recl0", 9)]),
        };
        assert_eq!(half.all_handlers_waiting(3), None);
        // Both, but one not for long enough yet.
        let both = Look {
            handlers: 2,
            waiting: waiting(&[(1, "gleaner-fault0", 5), (2, "gleaner-fault1", 2)]),
        };
        assert_eq!(both.all_handlers_waiting(3), None);
        assert_eq!(both.all_handlers_waiting(2).map(|w| w.tid), Some(1));
        assert_eq!(both.names(), "gleaner-fault0, gleaner-fault1");
        assert_eq!(
            Look::default().all_handlers_waiting(0),
            None,
            "no handlers: no pager"
        );
        assert!(both
            .hung(2, 0)
            .unwrap()
            .starts_with("every fault handler has waited 5 s"));
        assert_eq!(half.hung(3, 0), None);
        // One thread long past any wait a memnode could cause, with a handler left.
        let long = Look {
            handlers: 2,
            waiting: waiting(&[(3, "gleaner-recl0", LONG_WAIT_CHECKS)]),
        };
        assert!(long
            .hung(3, 0)
            .unwrap()
            .contains("gleaner-recl0 has waited 75 s"));
        assert_eq!(long.hung(3, 1), None, "the launcher looks later");
    }

    #[test]
    fn this_processs_threads_are_read_and_none_of_them_waits() {
        let mut watch = StuckWatch::default();
        assert_eq!(watch.check(None), Some(Look::default()));
        assert_eq!(watch.check(Some(u32::MAX)), None, "no such process");
    }
}
