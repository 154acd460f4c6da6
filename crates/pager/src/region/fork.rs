//! Fork with far memory: the parent's side ([`Region::prepare_fork`], [`Region::after_fork`])
//! and the child's ([`Region::continue_in_child`], trimming what it inherited to its budget).
//! `docs/architecture.md` ("Fork with far memory") says what each mode promises.

use std::sync::atomic::Ordering;

use gleaner_uffd::{Uffd, UffdOptions};

use super::{Launch, Region};
use crate::config::ForkMode;
use crate::engine::{Engine, Tracking};
use crate::fatal::fatal;
use crate::fault::state::{PageState, PageTable};
use crate::memory::mem::Memory;
use crate::observe::counters::RegionCounters;
use crate::{PagerError, PAGE_SIZE};

/// The pid of the process that forked last (set in [`Region::prepare_fork`], read in the child).
static FORKED_BY: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

impl Region {
    /// Makes the region safe to `fork`; call [`Region::after_fork`] in the parent and
    /// [`Region::continue_in_child`] in the child. Pauses eviction and waits for the faults in
    /// service. Then, with `fork = far` on a store that can share a snapshot (shared memory),
    /// the store keeps every far copy as it is now for as long as the child may read it; else
    /// every page held only on the memnode is brought back into local memory (over the budget
    /// for a while), so that a child, which then has no pager, sees exactly this process's
    /// memory.
    pub fn prepare_fork(&self) {
        // The child learns its parent's pid from here, not from `getppid`: the parent may have
        // exited before the child's handler runs (a daemon's launcher).
        FORKED_BY.store(std::process::id() as libc::pid_t, Ordering::SeqCst);
        self.pause_eviction_for_fork();
        let e = &*self.engine;
        if self.cfg.fork == ForkMode::Far {
            if e.store.can_share_with_child() {
                // No install may be half done in the child: handlers finish theirs and hold the
                // next faults until the fork is over.
                e.gate.close();
                // Both ends close-on-exec: the read end stays with the parent's store, the
                // write end goes to the child.
                // Held in both processes: the child must not close its end (the parent would
                // free the blobs the child reads).
                let pipe = {
                    let _making = gleaner_fds::making();
                    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map(
                        |(alive, child_end)| {
                            (gleaner_fds::adopt(alive), gleaner_fds::adopt(child_end))
                        },
                    )
                };
                let held = pipe
                    .map_err(|err| format!("no pipe for the child ({err})"))
                    .and_then(|(alive, child_end)| {
                        e.store
                            .hold_for_child(alive)
                            .map_err(|err| err.to_string())?;
                        Ok(child_end)
                    });
                match held {
                    Ok(child_end) => {
                        *self.child_end.lock().expect("child end lock") = Some(child_end);
                        return;
                    }
                    Err(why) => {
                        e.gate.open();
                        log::warn!("this fork brings the far pages home: {why}");
                    }
                }
            } else {
                // Said once per process, and only where there is something to bring: a shell
                // that is itself a fork child forks for every pipeline, mostly with nothing far.
                let far = e.mem.table.census()[PageState::Remote as usize];
                static SAID: std::sync::Once = std::sync::Once::new();
                if far > 0 {
                    SAID.call_once(|| {
                        log::warn!(
                            "fork brings this process's far pages home ({far} pages, {} MiB): \
                             {} cannot give a fork child a snapshot now (a pool with a lost or \
                             draining memnode, or a fork child's own store)",
                            (far * crate::PAGE_SIZE) >> 20,
                            e.store.describe()
                        )
                    });
                }
            }
        }
        self.bring_home();
    }

    /// The first step of [`Region::prepare_fork`], which may be taken before it: pauses
    /// eviction (until [`Region::after_fork`] in the parent) and waits for the batches in
    /// progress. Pages the caller then touches stay resident through the fork (the preload
    /// library touches what the C library rewrites in the child before the child's pager runs).
    pub fn pause_eviction_for_fork(&self) {
        let e = &*self.engine;
        e.budget.evict_paused.store(true, Ordering::SeqCst);
        while e.reclaim.in_batch.load(Ordering::SeqCst) > 0 {
            std::thread::yield_now();
        }
    }

    /// Brings every page held only on the memnode into local memory (eviction paused).
    fn bring_home(&self) {
        let e = &*self.engine;
        let table = &e.mem.table;
        let mut store = match e.store.handle() {
            Ok(h) => h,
            Err(err) => fatal(&format!(
                "bringing pages home before fork: cannot reach the memnode ({err}); pages held \
                 only on the memnode are lost"
            )),
        };
        let mut batch = Vec::with_capacity(gleaner_proto::MAX_BATCH_PAGES);
        // Until a pass finds nothing remote: a prefetch in flight during a pass publishes its
        // pages REMOTE (staged) after the pass went by them.
        loop {
            // Only pages below it were ever touched; past it a page is absent, or being
            // zero-filled for its first touch (a fork child sees zeros there either way). Each
            // pass over the whole arena (16 Mi pages for 64 GiB) took tens of milliseconds a
            // fork (`bench/results/spawn/README.md`).
            let pages = table.touched_end();
            let mut page = 0;
            while page < pages {
                batch.clear();
                while page < pages && batch.len() < gleaner_proto::MAX_BATCH_PAGES {
                    if table.transition(page, PageState::Remote, PageState::Fetching) {
                        if e.prefetch.forget(page) {
                            // Fetched again below; its staged copy's slot is given back.
                            e.budget.release(1);
                        }
                        batch.push(page as u64);
                    }
                    page += 1;
                }
                if !batch.is_empty() {
                    crate::fault::fetch::bring_home(e, &mut *store, &batch);
                }
            }
            // Faults in flight on other threads finish their installs before the child is made.
            for p in 0..pages {
                while matches!(
                    table.get(p),
                    PageState::Fetching | PageState::Evicting | PageState::Prefetching
                ) {
                    std::thread::yield_now();
                }
            }
            if (0..pages).all(|p| table.get(p) != PageState::Remote) {
                break;
            }
        }
    }

    /// Resumes eviction after `fork` (in the parent); the region returns under its budget.
    pub fn after_fork(&self) {
        // Closing our end of the child's pipe: from now on only the child holds it.
        drop(self.child_end.lock().expect("child end lock").take());
        // Every page resident now may be shared with the child until it is evicted.
        self.engine.mem.table.mark_resident_forked();
        self.engine.gate.open();
        self.engine
            .budget
            .evict_paused
            .store(false, Ordering::SeqCst);
        self.engine.reclaim.wake_pool();
    }

    /// In a fork child, in the fork's child handler (the child's only thread, before the
    /// program goes on): when the parent shared a snapshot of its far pages for this child
    /// ([`Region::prepare_fork`]), the child's own region over the same memory, with its own
    /// userfaultfd, threads, memnode session and budget
    /// ([`crate::RegionConfig::fork_local_budget`]), already trimmed to that budget. `None` when
    /// the fork brought the pages home: the child's memory is then plain memory.
    ///
    /// `self` (the parent's region, as the child inherited it, without its threads) must never
    /// be used again: the child's region takes over its mapping and page table.
    pub fn continue_in_child(&'static self) -> Result<Option<Region>, PagerError> {
        let Some(child_end) = self.child_end.lock().expect("child end lock").take() else {
            return Ok(None);
        };
        // Held open until this process exits or execs (close-on-exec): the parent keeps the
        // snapshot that long.
        std::mem::forget(child_end);
        let old = &*self.engine;
        let cfg = self.cfg.fork_child_config();
        let (addr, len) = (old.mem.mapping.addr(), old.mem.mapping.len());
        // The first thing: until the new userfaultfd covers the memory, a missing page reads as
        // zeros.
        let uffd = Uffd::open(UffdOptions {
            features: self.uffd_features,
            allow_user_mode_only: cfg.allow_user_mode_only,
        })?;
        // Pages the program mapped something else over are not the region's: the kernel
        // would refuse to register a file mapping.
        let table = old.mem.table.clone();
        let mut start = 0;
        let pages = len / PAGE_SIZE;
        while start < pages {
            let foreign = table.get(start) == PageState::Foreign;
            let mut end = start + 1;
            while end < pages && (table.get(end) == PageState::Foreign) == foreign {
                // Past the last page ever touched every page is absent: one run to the end.
                if !foreign && end >= table.touched_end() {
                    end = pages;
                    break;
                }
                end += 1;
            }
            if !foreign {
                uffd.register(addr + start * PAGE_SIZE, (end - start) * PAGE_SIZE, true)?;
            }
            start = end;
        }
        let resident = adopt_inherited_pages(&table, addr, old.tracking);
        let store = old.store.fork_child(&format!(
            "pager pid {} (fork child) region {len}",
            std::process::id()
        ))?;
        let budget = cfg.local_budget / PAGE_SIZE;
        let region = Region::launch(
            cfg,
            Launch {
                mem: Memory {
                    mapping: old.mem.mapping.clone(),
                    uffd,
                    table,
                },
                store,
                budget,
                tracking: old.tracking,
                uffd_features: self.uffd_features,
                trace: None,
                trace_out: None,
                embedded: None,
                resident,
                fork_child: true,
            },
        )?;
        // A child on the default share of its parent's budget takes the parent's whole budget
        // once the parent exits (`evict/inherit.rs`); one given `--fork-local-mem` keeps that.
        if self.cfg.fork_local_budget.is_none() {
            region
                .engine
                .heir
                .set(FORKED_BY.load(Ordering::SeqCst), old.budget.pages());
        }
        Ok(Some(region))
    }
}

/// Brings a fork child within its budget before the program goes on: the pages it
/// inherited beyond it (in the eviction policy's order) are written to the child's store and
/// dropped, in batches. No program thread runs meanwhile, so no write can race: the pages
/// are copied and dropped directly, without the eviction path's capture (which would first
/// give the child its own copy of every page it shares with the parent). Until this is done
/// each inherited page is mapped in both processes; as the parent rewrites or evicts its
/// side, the child's becomes memory of its own, so it must be quick.
pub(super) fn trim_inherited(e: &Engine) -> Result<(), PagerError> {
    let table = &e.mem.table;
    let over = e.budget.resident().saturating_sub(e.budget.pages());
    let mut picked = Vec::with_capacity(over);
    e.policy
        .lock()
        .expect("policy lock")
        .pick(over, &mut picked);
    let mut store = e.store.handle()?;
    for chunk in picked.chunks(gleaner_proto::MAX_BATCH_PAGES) {
        let victims: Vec<usize> = chunk
            .iter()
            .copied()
            .filter(|&p| {
                table.transition(p, PageState::Dirty, PageState::Evicting)
                    || table.transition(p, PageState::Clean, PageState::Evicting)
            })
            .collect();
        let ids: Vec<u64> = victims.iter().map(|&p| p as u64).collect();
        let written = store.reserve(&ids).and_then(|()| {
            store.stage(&ids, &mut |i| {
                // SAFETY: a resident page of the region (EVICTING: no other thread of this
                // process touches it; no program thread runs yet), alive until the commit.
                unsafe {
                    std::slice::from_raw_parts(e.mem.addr_of(victims[i]) as *const u8, PAGE_SIZE)
                }
            })?;
            store.commit()
        });
        if let Err(err) = written {
            // No room on the memnode: the rest stays resident, over the budget for now.
            log::warn!("a fork child keeps its inherited pages over its budget: {err}");
            let mut policy = e.policy.lock().expect("policy lock");
            for &p in &victims {
                table.release(p, PageState::Dirty);
                policy.on_install(p, false);
            }
            return Ok(());
        }
        let runs = crate::runs::runs(victims.iter().copied());
        if let Err(err) = e.mem.mapping.discard_ranges(&runs) {
            fatal(&format!("dropping a fork child's inherited pages: {err}"));
        }
        for &p in &victims {
            table.clear_forked(p);
            table.release(p, PageState::Remote);
        }
        e.budget.release(victims.len());
        RegionCounters::add(&e.counters.evicted_dirty, victims.len() as u64);
    }
    Ok(())
}

/// Settles a fork child's inherited page table (on the child's only thread, which therefore
/// owns every page): every page is left in a stable state and the resident ones are returned
/// (for the child's budget and eviction order), marked as shared with the parent. A page some
/// thread of the parent owned at the fork (only a program thread discarding memory can: the
/// handlers and eviction were stopped) is taken as it is found: resident if it is mapped, else
/// absent (what a discard leaves). Under synchronous tracking every resident page counts as
/// written (the child's page table lost the write protection).
fn adopt_inherited_pages(table: &PageTable, addr: usize, tracking: Tracking) -> Vec<usize> {
    let mut resident = Vec::new();
    for page in 0..table.touched_end() {
        match table.get(page) {
            PageState::Absent | PageState::Remote | PageState::Foreign => continue,
            PageState::Clean | PageState::Dirty => {}
            _ => {
                let mut vec = 0u8;
                // SAFETY: mincore on one page of our own mapping, writing one byte.
                let r = unsafe {
                    libc::mincore(
                        (addr + page * PAGE_SIZE) as *mut libc::c_void,
                        PAGE_SIZE,
                        &mut vec,
                    )
                };
                if r != 0 || vec & 1 == 0 {
                    table.release(page, PageState::Absent);
                    continue;
                }
                table.release(page, PageState::Dirty);
            }
        }
        if tracking == Tracking::Sync {
            table.release(page, PageState::Dirty);
        }
        table.mark_forked(page);
        resident.push(page);
    }
    resident
}
