//! Fault-handler threads: read userfaultfd events and resolve them.
//!
//! A handler never dereferences the region: it installs pages with `UFFDIO_COPY` from its own
//! buffers (the zero page below, or the connection's receive buffer) and changes protection with
//! ioctls. So it can never fault on memory that it is itself responsible for serving.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use gleaner_proto::{Connection, ErrorCode};
use gleaner_uffd::{Event, FaultKind, Installed};

use crate::evict::Evictor;
use crate::fatal::fatal;
use crate::prefetch::PrefetchInstall;
use crate::region::Shared;
use crate::state::PageState;
use crate::stats::Counters;
use crate::PAGE_SIZE;

/// The source for zero-filling a page that is written on first touch.
static ZERO_PAGE: [u8; PAGE_SIZE] = [0; PAGE_SIZE];

/// What one handler thread owns: its memnode connection and scratch state.
struct Handler {
    conn: Connection,
    /// Opened on the first direct reclaim (the last resort, or every fault in `direct` mode).
    evictor: Option<Evictor>,
    /// Prefetch candidates and the pages claimed for a prefetch.
    candidates: Vec<u64>,
    claimed: Vec<u64>,
    /// A copy of a fetched page, kept while a direct reclaim reuses the connection.
    stash: Box<[u8; PAGE_SIZE]>,
}

/// One handler thread's loop: wait for events (or the stop signal), resolve each.
pub(crate) fn run(shared: Arc<Shared>, conn: Connection) {
    let mut events = Vec::with_capacity(16);
    let mut h = Handler {
        conn,
        evictor: None,
        candidates: Vec::new(),
        claimed: Vec::new(),
        stash: Box::new([0; PAGE_SIZE]),
    };
    while shared.wait_for_events() {
        match shared.uffd.read_events(&mut events, 16) {
            Ok(_) => {}
            Err(e) => fatal(&format!("reading userfaultfd events failed: {e}")),
        }
        for ev in events.drain(..) {
            match ev {
                Event::Fault { kind, addr, tid } => {
                    let Some(page) = shared.page_of(addr) else {
                        log::warn!("fault at {addr:#x} outside the region; ignored");
                        continue;
                    };
                    log::trace!(
                        "fault {kind:?} at {addr:#x} (page {page}, {:?})",
                        shared.table.get(page)
                    );
                    shared.trace_fault(page, tid, kind);
                    match kind {
                        FaultKind::WriteProtect => on_write_protect(&shared, page),
                        FaultKind::MissingRead => on_missing(&shared, &mut h, page, tid, false),
                        FaultKind::MissingWrite => on_missing(&shared, &mut h, page, tid, true),
                        FaultKind::Minor => log::warn!("unexpected minor fault at {addr:#x}"),
                    }
                }
                other => log::warn!("unexpected userfaultfd event {other:?}; ignored"),
            }
        }
    }
}

/// A missing page was touched.
fn on_missing(shared: &Shared, h: &mut Handler, page: usize, tid: u32, write: bool) {
    let started = Instant::now();
    let c = &shared.counters;
    loop {
        match shared.table.get(page) {
            PageState::Absent => {
                if !shared
                    .table
                    .transition(page, PageState::Absent, PageState::Fetching)
                {
                    continue;
                }
                shared.take_slot(&mut h.conn, &mut h.evictor, None);
                // First touch never goes to the network. A read maps the shared zero page (no
                // memory used until written); a write gets a private zeroed page at once, which
                // saves the copy-on-write fault that would follow the zero page.
                let addr = shared.addr_of(page);
                let r = if write {
                    // SAFETY: ZERO_PAGE is static memory outside every registered range; `addr`
                    // is a page-aligned address inside this region's registered range.
                    unsafe {
                        shared
                            .uffd
                            .copy(addr, ZERO_PAGE.as_ptr(), PAGE_SIZE, false, true)
                    }
                } else {
                    shared.uffd.zeropage(addr, PAGE_SIZE, true)
                };
                install_outcome(shared, page, r);
                shared.installed(page, PageState::Dirty, false);
                Counters::add(&c.zero_fills, 1);
                return;
            }
            PageState::Remote => {
                if !shared
                    .table
                    .transition(page, PageState::Remote, PageState::Fetching)
                {
                    continue;
                }
                if let Some(st) = shared.prefetch.take_staged(page) {
                    // A prefetched page's first use: its data is here and it holds its slot.
                    install_clean_or_dirty(shared, page, &st.data[..], write, false);
                    Counters::add(&c.prefetch_hit_faults, 1);
                    h.candidates.clear();
                    shared
                        .prefetch
                        .on_fault(page, tid, Some(&st.window), &mut h.candidates);
                    issue_prefetch(shared, h);
                    return;
                }
                // The request goes out first; the budget bookkeeping (and asking the
                // prefetcher) overlaps with the memnode's answer.
                let ids = [page as u64];
                let pending = h
                    .conn
                    .start_read(&ids)
                    .unwrap_or_else(|e| lost(shared, page, &e));
                let charged = shared.try_take_slot(Some(page));
                h.candidates.clear();
                shared.prefetch.on_fault(page, tid, None, &mut h.candidates);
                let data = match h.conn.finish_read(pending, &ids) {
                    Ok(batch) => batch.get(0).1,
                    Err(e) => lost(shared, page, &e),
                };
                let data: &[u8] = if charged {
                    data
                } else {
                    // Only a direct reclaim makes room, and it needs the connection whose
                    // receive buffer holds the page: keep a copy meanwhile.
                    h.stash.copy_from_slice(data);
                    shared.take_slot(&mut h.conn, &mut h.evictor, Some(page));
                    &h.stash[..]
                };
                // A page seen rewritten goes in writable (no write-protect fault to follow).
                let writable = if write {
                    shared.writes.on_write_fetch(page);
                    true
                } else {
                    shared.writes.install_writable(page)
                };
                install_clean_or_dirty(shared, page, data, writable, false);
                Counters::add(&c.remote_faults, 1);
                Counters::add(&c.bytes_in, PAGE_SIZE as u64);
                shared.remote_latency.record(started.elapsed());
                issue_prefetch(shared, h);
                return;
            }
            PageState::Prefetching => {
                // Its prefetch is in flight: do not fetch it again. Claiming it makes the
                // prefetching handler install it (and wake this thread) on arrival.
                if shared
                    .table
                    .transition(page, PageState::Prefetching, PageState::Fetching)
                {
                    shared.prefetch.count_late();
                    return;
                }
            }
            PageState::Fetching | PageState::Marking => {
                // Another handler owns this page; its install (or unprotect) wakes our thread.
                Counters::add(&c.duplicate_faults, 1);
                return;
            }
            PageState::Clean | PageState::Dirty => {
                // Installed since this message was queued; the installer's wake may have raced
                // with the thread going to sleep, so wake again (idempotent).
                Counters::add(&c.duplicate_faults, 1);
                shared.wake(page);
                return;
            }
            PageState::Evicting | PageState::Discarding => {
                Counters::add(&c.waited_on_eviction, 1);
                shared.wait_while_busy(page);
            }
        }
    }
}

/// A write hit a write-protected (clean) page.
fn on_write_protect(shared: &Shared, page: usize) {
    let c = &shared.counters;
    loop {
        match shared.table.get(page) {
            PageState::Clean => {
                if !shared
                    .table
                    .transition(page, PageState::Clean, PageState::Marking)
                {
                    continue;
                }
                // Unprotect (and wake the writer) *before* publishing DIRTY: the evictor claims
                // only CLEAN or DIRTY pages, so it can never write-protect this page in between
                // and then see its protection lifted underneath it.
                if let Err(e) =
                    shared
                        .uffd
                        .write_protect(shared.addr_of(page), PAGE_SIZE, false, true)
                {
                    fatal(&format!("lifting write protection on page {page}: {e}"));
                }
                shared.writes.on_tracked_write(page);
                shared.table.release(page, PageState::Dirty);
                shared.policy.lock().expect("policy lock").on_access(page);
                Counters::add(&c.wp_faults, 1);
                return;
            }
            PageState::Evicting | PageState::Discarding => {
                // The page is being written back, dropped or discarded. Wait, then let the
                // thread retry: it finds the page back (eviction undone) or missing (refetch or
                // zero-fill).
                Counters::add(&c.waited_on_eviction, 1);
                shared.wait_while_busy(page);
                shared.wake(page);
                return;
            }
            PageState::Marking => {
                // Another handler is lifting the protection; that ioctl wakes our thread.
                Counters::add(&c.duplicate_faults, 1);
                return;
            }
            PageState::Fetching => {
                // A read fault's install maps the page write-protected and wakes the thread
                // *before* its handler publishes CLEAN; a write that follows at once lands here.
                // Nobody else will wake this thread: wait for CLEAN (a few instructions away on
                // the other handler), then lift the protection like any other WP fault.
                while shared.table.get(page) == PageState::Fetching {
                    std::thread::yield_now();
                }
            }
            PageState::Dirty | PageState::Remote | PageState::Absent | PageState::Prefetching => {
                // Stale message: already writable, or gone (the retry will fault as missing).
                Counters::add(&c.duplicate_faults, 1);
                shared.wake(page);
                return;
            }
        }
    }
}

/// Installs `data` as `page` (owned in FETCHING, its budget slot taken) and publishes it. A read
/// installs the page write-protected (clean: its memnode copy is valid, so it can later be
/// dropped with no write); a write, or a read of a page write prediction expects to be written,
/// installs it writable and dirty, saving the write-protect fault that would follow.
fn install_clean_or_dirty(
    shared: &Shared,
    page: usize,
    data: &[u8],
    write: bool,
    prefetched: bool,
) {
    // SAFETY: `data` is one page of handler-owned memory (a connection's receive buffer, a
    // staging buffer or the handler's own copy), outside every registered range; the
    // destination is an aligned page of the region.
    let r = unsafe {
        shared
            .uffd
            .copy(shared.addr_of(page), data.as_ptr(), PAGE_SIZE, !write, true)
    };
    install_outcome(shared, page, r);
    let state = if write {
        PageState::Dirty
    } else {
        PageState::Clean
    };
    shared.installed(page, state, prefetched);
}

/// Fetches the prefetcher's candidates (in `h.candidates`) that are still remote, in one batched
/// read after the demand fetch, and installs or stages them (see `prefetch.rs`).
fn issue_prefetch(shared: &Shared, h: &mut Handler) {
    if h.candidates.is_empty() {
        return;
    }
    let pages = shared.mapping.len() / PAGE_SIZE;
    h.claimed.clear();
    for &q in &h.candidates {
        if h.claimed.len() >= gleaner_proto::MAX_BATCH_PAGES {
            break;
        }
        let Ok(q) = usize::try_from(q) else { continue };
        if q >= pages || h.claimed.contains(&(q as u64)) {
            continue;
        }
        if shared.prefetch.is_staged(q) {
            // Already fetched and waiting for its first use.
            continue;
        }
        if !shared
            .table
            .transition(q, PageState::Remote, PageState::Prefetching)
        {
            continue;
        }
        // A prefetch never waits for room and never reclaims directly: past the point where
        // only that would make room, the rest of the window is dropped.
        if !shared.try_take_slot(None) {
            // Handing the page back must not undo a demand fault's claim (PREFETCHING →
            // FETCHING): then this handler owes that fault the page, over budget by one.
            if shared
                .table
                .transition(q, PageState::Prefetching, PageState::Remote)
            {
                break;
            }
            shared.resident.fetch_add(1, Ordering::AcqRel);
            h.claimed.push(q as u64);
            break;
        }
        h.claimed.push(q as u64);
    }
    if h.claimed.is_empty() {
        return;
    }
    shared.prefetch.count_issued(h.claimed.len());
    let batch = match h.conn.read_pages(&h.claimed) {
        Ok(b) => b,
        Err(e) => lost(shared, h.claimed[0] as usize, &e),
    };
    Counters::add(
        &shared.counters.bytes_in,
        (h.claimed.len() * PAGE_SIZE) as u64,
    );
    let marker_mode = shared.prefetch.install_mode() == PrefetchInstall::Marker;
    let last = h.claimed.len() - 1;
    let mut released = 0;
    // Marker mode: the pages installed at once (not the late ones, which their demand faults
    // counted), credited as used when the window's marker is used.
    let mut window = Vec::new();
    for (i, (id, data)) in batch.iter().enumerate() {
        let q = id as usize;
        if !marker_mode || i == last {
            let window = std::mem::take(&mut window);
            let window_len = window.len();
            // Staged before it is published REMOTE, so a fault that finds it REMOTE finds its
            // data staged too.
            released += shared.prefetch.stage(q, data, window);
            if shared
                .table
                .transition(q, PageState::Prefetching, PageState::Remote)
            {
                continue;
            }
            // A demand fault claimed it meanwhile: install it for that fault instead (taking a
            // slot again if the staging buffer dropped the entry, and its slot, meanwhile). The
            // fault reached the marker, which confirms the window.
            if !shared.prefetch.unstage(q) {
                shared.resident.fetch_add(1, Ordering::AcqRel);
            }
            shared.prefetch.credit_used(window_len);
        } else if shared
            .table
            .transition(q, PageState::Prefetching, PageState::Fetching)
        {
            window.push(q);
        }
        // Installed now: a page of the window (marker mode), or one a demand fault claimed
        // while the prefetch was in flight (state FETCHING: installed for that fault, and the
        // install wakes its thread).
        install_clean_or_dirty(shared, q, data, false, true);
    }
    if released > 0 {
        shared.resident.fetch_sub(released, Ordering::AcqRel);
        shared.notify_evict_progress();
    }
}

/// The page's data cannot be had: stop the program rather than hand it zeros.
fn lost(shared: &Shared, page: usize, e: &gleaner_proto::ClientError) -> ! {
    let what = if e.server_code() == Some(ErrorCode::NotFound) {
        "the memnode no longer holds it"
    } else {
        "the memnode could not be reached"
    };
    fatal(&format!(
        "page {page} of the region at {:#x} is needed but {what} ({e}); {} pages held only on \
         the memnode are lost",
        shared.mapping.addr(),
        shared.table.census()[PageState::Remote as usize] + 1
    ))
}

fn install_outcome(shared: &Shared, page: usize, r: Result<Installed, gleaner_uffd::UffdError>) {
    match r {
        Ok(Installed::Done) => {}
        // We own the page in FETCHING, so nothing else installs it; a present page here means
        // the program itself populated it behind the pager's back. Keep what is there.
        Ok(Installed::AlreadyPresent) => {
            log::warn!("page {page} was already present at install; kept");
            shared.wake(page);
        }
        Err(e) => fatal(&format!("installing page {page} failed: {e}")),
    }
}
