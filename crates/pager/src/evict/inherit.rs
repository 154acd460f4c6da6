//! A fork child that outlives the process that forked it takes over that process's budget.
//!
//! A fork child (under `--fork far`) pages within a quarter of its parent's budget unless
//! `--fork-local-mem` says otherwise: parent and child both run, and four children should not
//! quadruple what the program may hold locally. A daemon is such a child whose parent exits
//! right after the fork (`memcached -d`, `redis-server --daemonize yes`), and it then ran on a
//! quarter of what the user gave `gleaner run` for the rest of its life. Once the parent is
//! gone its budget is free, so the child takes it: the watchdog looks every
//! second whether the child's parent changed (`getppid`: an orphan is adopted by init or a
//! subreaper), and if so raises the child's budget to its parent's as it was at the fork
//! (`watchdog::take_if_orphaned`). The budget only grows; an explicit `--fork-local-mem` is kept
//! as given.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// What a fork child inherits when its parent exits: the parent's pid and budget at the fork.
#[derive(Debug)]
pub(crate) struct Inheritance {
    parent: libc::pid_t,
    budget_pages: usize,
    taken: AtomicBool,
}

/// A region's inheritance, if it is a fork child that has one (set once, at the fork).
#[derive(Debug, Default)]
pub(crate) struct Heir(OnceLock<Inheritance>);

impl Heir {
    /// Records that this region's process, a fork child of `parent` (whose budget was
    /// `budget_pages` at the fork), takes that budget when `parent` exits.
    pub(crate) fn set(&self, parent: libc::pid_t, budget_pages: usize) {
        let _ = self.0.set(Inheritance {
            parent,
            budget_pages,
            taken: AtomicBool::new(false),
        });
    }

    /// The budget to take now, once: when the parent has exited.
    pub(crate) fn due(&self) -> Option<usize> {
        let i = self.0.get()?;
        if i.taken.load(Ordering::Relaxed) {
            return None;
        }
        // SAFETY: getppid has no preconditions.
        if unsafe { libc::getppid() } == i.parent {
            return None;
        }
        i.taken.store(true, Ordering::Relaxed);
        Some(i.budget_pages)
    }
}
