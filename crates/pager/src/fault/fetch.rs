//! Bringing pages in from the store: installing a fetched page, prefetching the prefetcher's
//! candidates after a demand fault, and bringing every page home before `fork`.

use std::time::Instant;

use crate::engine::Engine;
use crate::fatal::fatal;
use crate::fault::prefetch::PrefetchInstall;
use crate::fault::state::PageState;
use crate::observe::counters::RegionCounters;
use crate::store::{StoreError, StoreHandle};
use crate::PAGE_SIZE;

/// Installs `data` as `page` (owned in FETCHING or PREFETCHING, its budget slot taken) and
/// publishes it. A read installs the page write-protected (clean: its far copy is kept, and it
/// can later be dropped with no write) unless its far copy is dropped here anyway; a write, or a
/// read of a page write prediction expects to be written, installs it writable and dirty, saving
/// the write-protect fault that would follow.
/// The far copy is dropped here where it is of no further use ([`Engine::drop_far_copy`]),
/// before the page is published.
pub(crate) fn install_fetched(
    engine: &Engine,
    page: usize,
    data: &[u8],
    writable: bool,
    prefetched: bool,
) {
    install_fetched_with(engine, page, writable, prefetched, |writable| {
        engine.mem.install(page, data, writable)
    });
}

/// [`install_fetched`] of a demand fault the handler times: returns the moment the page was
/// mapped, read before the faulting thread is woken ([`crate::memory::mem::Memory::install_timed`]).
pub(crate) fn install_fetched_timed(
    engine: &Engine,
    page: usize,
    data: &[u8],
    writable: bool,
) -> Instant {
    install_fetched_with(engine, page, writable, false, |writable| {
        engine.mem.install_timed(page, data, writable)
    })
}

/// The body of [`install_fetched`], with `install` mapping the page (writable or not); returns
/// what `install` returned.
fn install_fetched_with<R>(
    engine: &Engine,
    page: usize,
    writable: bool,
    prefetched: bool,
    install: impl FnOnce(bool) -> R,
) -> R {
    // Write protection only serves a page whose far copy stays: eviction learns from it whether
    // that copy is still good. A page that keeps none is written back at its next eviction
    // whatever it saw (asynchronous tracking with far copies dropped at fetch, the default),
    // so it goes in writable: a protected page costs the program's thread a fault in the
    // kernel at its first write (around a microsecond), and the pages a program fetches it mostly
    // writes again (memcached and redis update an item's header on every read of it).
    let writable = writable || !engine.keeps_far_copy(false, prefetched);
    let installed = install(writable);
    // Still ours (FETCHING) until published below.
    engine.drop_far_copy(page, writable, prefetched);
    let state = if writable {
        PageState::Dirty
    } else {
        PageState::Clean
    };
    engine.installed(page, state, prefetched);
    installed
}

/// The page's data cannot be had: stop the program rather than hand it zeros.
pub(crate) fn lost(engine: &Engine, page: usize, e: &StoreError) -> ! {
    fatal(&format!(
        "page {page} of the region at {:#x} is needed but {e}; {} pages held only on the \
         memnode are lost",
        engine.mem.mapping.addr(),
        engine.mem.table.census()[PageState::Remote as usize] + 1
    ))
}

/// The pages to prefetch and those claimed for it, buffers kept from one prefetch to the next
/// (by a fault handler, or the hint thread).
#[derive(Default)]
pub(crate) struct PrefetchBufs {
    /// The prefetcher's candidates (or a hinted range), filled by the caller.
    pub(crate) candidates: Vec<u64>,
    /// The candidates claimed for this prefetch.
    claimed: Vec<u64>,
}

/// Fetches the candidates in `bufs` that are still remote through `store`, in one batched read
/// (after the demand fetch, on a fault), and installs or stages them (see `fault/prefetch.rs`);
/// returns how many it fetched.
pub(crate) fn prefetch(
    engine: &Engine,
    store: &mut dyn StoreHandle,
    bufs: &mut PrefetchBufs,
) -> usize {
    if bufs.candidates.is_empty() {
        return 0;
    }
    let table = &engine.mem.table;
    let pages = engine.mem.pages();
    let most = engine.batch.prefetch_window_cap();
    bufs.claimed.clear();
    for &q in &bufs.candidates {
        if bufs.claimed.len() >= most {
            break;
        }
        let Ok(q) = usize::try_from(q) else { continue };
        if q >= pages || bufs.claimed.contains(&(q as u64)) {
            continue;
        }
        if engine.prefetch.is_staged(q) {
            // Already fetched and waiting for its first use.
            continue;
        }
        if !table.transition(q, PageState::Remote, PageState::Prefetching) {
            continue;
        }
        // A prefetch never waits for room and never reclaims directly: past the point where
        // only that would make room, the rest of the window is dropped.
        if !engine.try_charge(None) {
            // Handing the page back must not undo a demand fault's claim (PREFETCHING →
            // FETCHING): then this handler owes that fault the page, over budget by one.
            if table.transition(q, PageState::Prefetching, PageState::Remote) {
                break;
            }
            engine.budget.charge_over();
            bufs.claimed.push(q as u64);
            break;
        }
        bufs.claimed.push(q as u64);
    }
    if bufs.claimed.is_empty() {
        return 0;
    }
    engine.prefetch.count_issued(bufs.claimed.len());
    let claimed = std::mem::take(&mut bufs.claimed);
    let sent = match engine.prefetch.deadline() {
        Some(deadline) => store.request_prefetch(&claimed, deadline),
        None => store.request(&claimed),
    };
    if let Err(e) = sent {
        lost(engine, claimed[0] as usize, &e);
    }
    RegionCounters::add(
        &engine.counters.bytes_in,
        (claimed.len() * PAGE_SIZE) as u64,
    );
    let marker_mode = engine.prefetch.install_mode() == PrefetchInstall::Marker;
    let last = claimed.len() - 1;
    let mut released = 0;
    // Marker mode: the pages installed at once (not the late ones, which their demand faults
    // counted), credited as used when the window's marker is used.
    let mut window = Vec::new();
    let r = store.receive(&mut |i, data| {
        let q = claimed[i] as usize;
        if !marker_mode || i == last {
            let window = std::mem::take(&mut window);
            let window_len = window.len();
            // Staged before it is published REMOTE, so a fault that finds it REMOTE finds its
            // data staged too.
            released += engine.prefetch.stage(q, data, window);
            if table.transition(q, PageState::Prefetching, PageState::Remote) {
                return;
            }
            // A demand fault claimed it meanwhile: install it for that fault instead (taking a
            // slot again if the staging buffer dropped the entry, and its slot, meanwhile). The
            // fault reached the marker, which confirms the window.
            if !engine.prefetch.unstage(q) {
                engine.budget.charge_over();
            }
            engine.prefetch.credit_used(window_len);
        } else if table.transition(q, PageState::Prefetching, PageState::Fetching) {
            window.push(q);
        }
        // Installed now: a page of the window (marker mode), or one a demand fault claimed
        // while the prefetch was in flight (state FETCHING: installed for that fault, and the
        // install wakes its thread). Writable if write prediction expects it to be written.
        install_fetched(engine, q, data, engine.writes.install_writable(q), true);
    });
    let fetched = match r {
        Ok(()) => claimed.len(),
        Err(StoreError::Late(_)) => {
            // Dropped at the memnode, nothing read: the pages go back to REMOTE (and their
            // slots back to the budget), except those a demand fault claimed meanwhile, which
            // this handler owes an install: fetched now, on demand.
            engine.prefetch.count_dropped_late(claimed.len());
            let mut owed = Vec::new();
            for &q in &claimed {
                if table.transition(q as usize, PageState::Prefetching, PageState::Remote) {
                    released += 1;
                } else {
                    owed.push(q);
                }
            }
            if !owed.is_empty() {
                if let Err(e) = store.request(&owed) {
                    lost(engine, owed[0] as usize, &e);
                }
                let r = store.receive(&mut |i, data| {
                    let q = owed[i] as usize;
                    install_fetched(engine, q, data, engine.writes.install_writable(q), false);
                });
                if let Err(e) = r {
                    lost(engine, owed[0] as usize, &e);
                }
            }
            owed.len()
        }
        Err(e) => lost(engine, claimed[0] as usize, &e),
    };
    bufs.claimed = claimed;
    if released > 0 {
        engine.budget.release(released);
        engine.budget.notify_progress();
    }
    fetched
}

/// Fetches `ids` (pages the caller holds in FETCHING) and installs them clean, over budget.
pub(crate) fn bring_home(engine: &Engine, store: &mut dyn StoreHandle, ids: &[u64]) {
    if let Err(e) = store.request(ids) {
        fatal(&format!(
            "bringing pages home before fork failed: {e}; pages held only on the memnode are lost"
        ));
    }
    let r = store.receive(&mut |i, data| {
        let page = ids[i] as usize;
        engine.mem.install(page, data, false);
        engine.budget.charge_over();
        engine.installed(page, PageState::Clean, false);
    });
    if let Err(e) = r {
        fatal(&format!(
            "bringing pages home before fork failed: {e}; pages held only on the memnode are lost"
        ));
    }
    RegionCounters::add(&engine.counters.bytes_in, (ids.len() * PAGE_SIZE) as u64);
}
