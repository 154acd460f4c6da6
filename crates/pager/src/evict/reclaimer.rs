//! Who reclaims: the reclaim threads' loop, and a faulting thread charging the budget and
//! reclaiming directly when it must. What they share with the rest of the region (the
//! scheduler, the pool's wake-ups, the accounting) is `evict/reclaim.rs`'s [`Reclaim`].
//!
//! [`Reclaim`]: crate::evict::reclaim::Reclaim

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::Engine;
use crate::evict::batch::Evictor;
use crate::fatal::fatal;
use crate::observe::counters::RegionCounters;
use crate::store::StoreHandle;

/// How long a reclaim thread waits before its first retry after the memnode refused its batch
/// (full); each refusal in a row doubles the wait, up to [`REFUSED_RETRY_MAX`].
const REFUSED_RETRY_FIRST: Duration = Duration::from_millis(2);

/// The longest wait between retries while the memnode keeps refusing: a region over its budget gets
/// back to it at most this long after the memnode has room again. Retrying every 2 ms instead sent
/// a whole batch across the link to be refused every few milliseconds (over a 32 MB/s link, a large
/// share of it: `bench/results/full-tenant-retries/README.md`), taking it from the memnode's other
/// tenants; the region needs no retry meanwhile, as it keeps pages locally up to its overflow
/// allowance, and a fault that reaches the allowance tries the memnode itself ([`charge`]).
const REFUSED_RETRY_MAX: Duration = Duration::from_millis(256);

/// Charges one budget slot to a page about to be installed, reclaiming directly through
/// `store` first when the scheduler says so (the budget is exhausted, or the mode is
/// `direct`). While the memnode refuses writes the region may overflow the budget by the
/// configured allowance; past that it tries the memnode once more with a batch of its own
/// (room may have come back: another session freed pages, or the batch only rewrites pages
/// the memnode already holds), and stops the program if that batch is refused too, rather
/// than lose data.
pub(crate) fn charge(
    engine: &Engine,
    store: &mut dyn StoreHandle,
    evictor: &mut Option<Evictor>,
    refault: Option<usize>,
) {
    let b = &engine.budget;
    let mut waited = false;
    loop {
        if engine.try_charge(refault) || engine.stopping() {
            return;
        }
        let resident = b.resident();
        let past_overflow = b.memnode_full.load(Ordering::Relaxed) && resident >= b.limit();
        let need = engine.reclaim.direct_need(resident);
        if need > 0 || past_overflow {
            let refusals = engine.counters.evict_aborted.load(Ordering::Relaxed);
            let ev = evictor.get_or_insert_with(|| Evictor::new(engine, true));
            if reclaim_directly(engine, ev, store, need.max(1)) > 0 {
                b.notify_progress();
                continue;
            }
            if past_overflow
                && b.memnode_full.load(Ordering::Relaxed)
                && engine.counters.evict_aborted.load(Ordering::Relaxed) > refusals
            {
                fatal(&format!(
                    "the memnode is full and the region has used its local budget ({} \
                     pages) plus the overflow allowance ({} pages); there is nowhere left \
                     to keep the program's data",
                    b.pages(),
                    b.overflow
                ));
            }
        }
        // Nothing could be reclaimed right now (every resident page is busy, or the memnode
        // refused the write): wait for other threads to move.
        if !waited {
            waited = true;
            RegionCounters::add(&engine.counters.waited_on_budget, 1);
        }
        engine.reclaim.wake_pool();
        engine.budget.wait_progress(Duration::from_millis(10));
    }
}

/// Enters a batch unless eviction is paused (around `fork`). The increment comes before the
/// check, so `prepare_fork` (which sets the pause, then waits for no batch) and a batch never
/// both proceed.
fn enter_batch(shared: &Engine) -> bool {
    shared.reclaim.in_batch.fetch_add(1, Ordering::SeqCst);
    if shared.budget.evict_paused.load(Ordering::SeqCst) {
        shared.reclaim.in_batch.fetch_sub(1, Ordering::SeqCst);
        return false;
    }
    true
}

/// Leaves a batch entered with [`enter_batch`].
fn leave_batch(shared: &Engine) {
    shared.reclaim.in_batch.fetch_sub(1, Ordering::SeqCst);
}

/// Evicts one batch for an elastic budget's shrink (`evict/elastic.rs`), off the fault path;
/// returns the pages evicted (0 while eviction is paused around a fork, or when nothing could
/// be claimed or the memnode refused the write).
pub(crate) fn evict_for_shrink(
    engine: &Engine,
    ev: &mut Evictor,
    store: &mut dyn StoreHandle,
) -> usize {
    if !enter_batch(engine) {
        return 0;
    }
    let n = ev.evict_batch(engine, store);
    leave_batch(engine);
    if n > 0 {
        engine.budget.notify_progress();
    }
    n
}

/// A faulting thread reclaims `pages` pages synchronously (the budget is exhausted, or the mode
/// is `direct`). Returns the pages evicted.
fn reclaim_directly(
    shared: &Engine,
    ev: &mut Evictor,
    store: &mut dyn StoreHandle,
    pages: usize,
) -> usize {
    let r = &shared.reclaim;
    let started = Instant::now();
    let mut done = 0;
    while done < pages && !shared.stopping() {
        if !enter_batch(shared) {
            break;
        }
        // Where no reclaim thread runs (`--reclaim direct`), the access scan is due here.
        crate::evict::access_walk::scan_if_due(shared, ev.pagemap());
        let n = ev.evict_batch(shared, store);
        leave_batch(shared);
        if n == 0 {
            break;
        }
        done += n;
    }
    r.record_direct(done, started.elapsed().as_nanos() as u64);
    done
}

/// Reclaim thread `id`'s loop: run batches while the scheduler wants at least `id + 1` threads,
/// sleep otherwise.
pub(crate) fn run_pool_thread(shared: Arc<Engine>, id: usize, mut store: Box<dyn StoreHandle>) {
    let r = &shared.reclaim;
    // The first thread opens what eviction needs at once (a program that later sandboxes
    // itself, or runs out of descriptors, finds out at its start, not in mid-run); the others
    // only once the scheduler first wants them: each holds a pipe of a batch's size, which
    // counts against its user's pipe pages (`Pipe::new`), and on a large machine most of them
    // never run.
    let mut ev = (id == 0).then(|| Evictor::new(&shared, false));
    if id == 0 {
        r.first_thread_ready();
    }
    r.pool_thread_starts();
    let mut refused_pause = Duration::ZERO;
    loop {
        if shared.stopping() {
            break;
        }
        if id >= r.wanted(&shared.budget) {
            r.sleep_while_unwanted(id, &shared.budget, || shared.stopping());
            continue;
        }
        // What the program's allocator holds without needing it goes first, with no write-back.
        // (Outside a batch: the allocator's locks are taken around a fork, which waits for
        // batches to end.)
        if let Some(release) = shared.release_hook {
            let released = release(shared.batch.next());
            if released > 0 {
                r.record_released(released);
                continue;
            }
        }
        let ev = match ev {
            Some(ref mut ev) => ev,
            None => match Evictor::try_new(&shared, false) {
                Ok(made) => ev.insert(made),
                Err(e) => {
                    // The other threads go on; this one cannot help them.
                    log::warn!("reclaim thread {id} stops, it cannot evict: {e}");
                    break;
                }
            },
        };
        if !enter_batch(&shared) {
            shared.budget.wait_progress(Duration::from_millis(2));
            continue;
        }
        // The access scan, when due, before the batch picks its victims (`evict/access.rs`).
        crate::evict::access_walk::scan_if_due(&shared, ev.pagemap());
        let cpu0 = crate::cpus::thread_cpu_ns();
        let t0 = Instant::now();
        let refusals = shared.counters.evict_aborted.load(Ordering::Relaxed);
        let n = ev.evict_batch(&shared, &mut *store);
        let busy = t0.elapsed().as_nanos() as u64;
        leave_batch(&shared);
        r.record_pool_cpu(crate::cpus::thread_cpu_ns().saturating_sub(cpu0));
        if shared.counters.evict_aborted.load(Ordering::Relaxed) > refusals {
            // The memnode refused the batch (full): retry less and less often.
            refused_pause = (refused_pause * 2).clamp(REFUSED_RETRY_FIRST, REFUSED_RETRY_MAX);
            shared
                .budget
                .sleep_unless(refused_pause, || shared.stopping());
            continue;
        }
        refused_pause = Duration::ZERO;
        if n == 0 {
            // Nothing could be claimed (all candidates busy, or every victim was handed back):
            // let the other threads move, then look again.
            shared.budget.wait_progress(Duration::from_millis(2));
            continue;
        }
        r.record_pool_batch(id, n, busy);
    }
    r.pool_thread_stops();
}
