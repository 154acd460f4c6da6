//! The latency-critical reserve (Hermes, Middleware'21): memory that is already physically
//! backed when the program asks for it, so that `malloc` plus the first touch of the block does
//! not fall into the kernel's direct reclaim under memory pressure.
//!
//! On with `GLEANER_LATENCY_CRITICAL=1` (`gleaner run --latency-critical`). A management thread
//! (`thread.rs`) keeps two reserves pre-faulted with `MADV_POPULATE_WRITE` inside one address
//! window (`window.rs`), sized from what the program asked for per period (2 ms, Hermes's `f`).
//! It sleeps while they are stocked: a request that takes one under its low watermark, or finds
//! nothing ready, wakes it (`wake.rs`; one system call per sleep at most), and while nothing is
//! asked it looks only at a backed-off timeout (up to a second, for the stats):
//!
//! * small requests (under 128 KiB) come from a heap grown step by step (`heap.rs`, Algorithm 1);
//! * large ones from a segregated pool of pre-faulted chunks (`pool.rs`, Algorithm 2; sized from
//!   their rate over the thread's measured reaction time), else from the chunk the thread is
//!   faulting in (`forming.rs`: the request faults only what is left), `mlock`ed
//!   (with `GLEANER_RESERVE_MLOCK=1`) while the process's `RLIMIT_MEMLOCK` leaves room, and
//!   unlocked when handed out.
//!
//! A request the reserve has nothing ready for never waits: it goes to the default allocator (the
//! C library's, or with far memory on, the managed heap) and counts as a miss. Nor does a request
//! wait on a lock the thread may hold (`deferred.rs`): an allocation that finds the heap's, the
//! pool's or the window's lock held past a brief spin falls back (a miss, counted as `busy`), and
//! a `free` leaves its block on a lock-free list. A chunk freed past the pool's bound is left to
//! the thread to release (its `MADV_DONTNEED` is off the request path). With far memory
//! on, the window is carved from the managed arena, so the reserve counts in the budget.
//!
//! Every block carries the same 16-byte header as the managed heap's: `[start | tag, total]`
//! (`tag` 0: a heap block of `total` bytes at `start`; 1: a pool chunk of `total` bytes). A
//! small block follows its header; a large one starts at a cache line of its chunk's first page
//! that changes from request to request (`large_block_offset`: at one fixed page offset the
//! kernel's socket copies into and out of the blocks ran 1.7x slower), so its chunk is a page
//! longer than the block.
//!
//! The reserve is bounded (`GLEANER_RESERVE_MAX`, 64 MiB by default): the heap's ready bytes and
//! the pool's chunks together never pass it (the heap takes a quarter, the pool the rest). A
//! fork child inherits the blocks (and frees them into its copy) but not the thread: its new
//! requests go to the default allocator.

mod deferred;
mod forming;
mod heap;
mod node;
mod pool;
pub(crate) mod report;
mod stats;
mod thread;
mod wake;
mod window;

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

use gleaner_pager::PAGE_SIZE;
use gleaner_policy::hermes::{chunk_len, LARGE};
use gleaner_proto::units::{format_size, parse_size};

use deferred::Deferred;
use forming::Forming;
use heap::{SmallHeap, Taken};
use pool::{Chunk, Pool};
use stats::{Phase, Stats, PHASES};
use wake::Waker;
use window::Window;

pub(crate) use window::contains;

const HEADER: usize = 16;
/// The default bound on the reserve.
const DEFAULT_MAX: usize = 64 << 20;

/// The reserve of this process.
pub(crate) struct Reserve {
    window: Window,
    heap: SmallHeap,
    pool: Pool,
    /// The chunk the thread is faulting in, which a request that finds the pool empty takes.
    forming: Forming,
    /// Chunks freed past the pool's bound, for the thread to release.
    trim: Deferred,
    /// The heap's and the pool's shares of the bound.
    heap_bound: usize,
    pool_bound: usize,
    /// `RLIMIT_MEMLOCK`'s soft limit: the most the pool keeps locked.
    memlock_limit: usize,
    period: std::time::Duration,
    stats: Stats,
    /// The thread's sleep word: requests that find the reserve low wake it.
    waker: Waker,
    /// The low watermarks (the thread's refill thresholds, set after each refill): a request
    /// that leaves the heap's ready bytes or the pool's bytes under its mark wakes the thread.
    heap_low: AtomicUsize,
    pool_low: AtomicUsize,
    /// A request found nothing ready since the thread last refilled.
    missed: AtomicBool,
    /// The CPU the last request that woke the thread (or missed) ran on, `u32::MAX` before
    /// one did: the thread refills elsewhere when it can (`thread::Placement`).
    requester_cpu: AtomicU32,
    /// Whether the thread avoids that CPU (`GLEANER_RESERVE_AFFINITY`: `avoid`, the default,
    /// or `any`).
    avoid_requester_cpu: bool,
    /// Where the thread is in its loop ([`Phase`] as u8; `Asleep` covers its whole sleep, and a
    /// miss tells `Woken` from it by whether its wake-up found the thread asleep).
    phase: AtomicU8,
    /// The clock the thread's scheduling delay is measured by ([`Reserve::now_ns`]).
    started: std::time::Instant,
}

static RESERVE: OnceLock<Reserve> = OnceLock::new();
/// Whether this process keeps the reserve: set at start, cleared in a fork child (which has no
/// management thread; its requests go elsewhere). A flag, not a pid compared with `getpid`: that
/// is a system call, and one per `malloc` made a loop of small allocations 7x slower.
static OWNER: AtomicBool = AtomicBool::new(false);

/// Whether new requests go to the reserve: it exists and this is the process that keeps it.
fn active() -> Option<&'static Reserve> {
    let r = RESERVE.get()?;
    OWNER.load(Ordering::Relaxed).then_some(r)
}

/// The reserve, if this process has one (or inherited one).
pub(crate) fn get() -> Option<&'static Reserve> {
    RESERVE.get()
}

/// Starts the reserve if `GLEANER_LATENCY_CRITICAL=1`; `far`: the managed arena is up and the
/// window is carved from it. Returns whether it started.
pub(crate) fn start(far: bool) -> Result<bool, String> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    match var("GLEANER_LATENCY_CRITICAL").as_deref() {
        None | Some("0") => return Ok(false),
        Some("1") => {}
        Some(v) => return Err(format!("GLEANER_LATENCY_CRITICAL={v}: give 1 or 0")),
    }
    let size = |k: &str, default: usize| -> Result<usize, String> {
        var(k).map_or(Ok(default), |v| {
            parse_size(&v)
                .map(|n| n as usize)
                .map_err(|e| format!("{k}: {e}"))
        })
    };
    let bound = size("GLEANER_RESERVE_MAX", DEFAULT_MAX)?;
    if bound < 2 * LARGE {
        return Err(format!(
            "GLEANER_RESERVE_MAX: at least {} (two large chunks)",
            format_size(2 * LARGE as u64)
        ));
    }
    let period_us = var("GLEANER_RESERVE_PERIOD_US")
        .map_or(Ok(2000), |v| {
            v.parse::<u64>()
                .map_err(|e| format!("GLEANER_RESERVE_PERIOD_US: {e}"))
        })?
        .max(100);
    let avoid_requester_cpu = match var("GLEANER_RESERVE_AFFINITY").as_deref() {
        None | Some("avoid") => true,
        Some("any") => false,
        Some(v) => return Err(format!("GLEANER_RESERVE_AFFINITY={v}: give avoid or any")),
    };
    // Address space only: far memory on, a share of the arena; off, a NORESERVE mapping.
    let window_len = size(
        "GLEANER_RESERVE_WINDOW",
        if far { 4 << 30 } else { 64 << 30 },
    )?;
    let window = Window::new(window_len, far)?;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the live local.
    unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    let heap_bound = (bound / 4).max(LARGE);
    let reserve = Reserve {
        window,
        heap: SmallHeap::new(),
        pool: Pool::new(),
        forming: Forming::new(),
        trim: Deferred::new(),
        heap_bound,
        pool_bound: bound - heap_bound,
        // Off unless asked (`GLEANER_RESERVE_MLOCK=1`): mlock and munlock take the address
        // space's lock for writing and split the window's mapping per chunk, which stalled the
        // program's own faults for milliseconds (p99 of 256 KiB allocations 3.6 ms against
        // 0.5 ms without the reserve, in bench/hermes.py's first run). Managed pages are never
        // locked: the pager must be free to evict them.
        memlock_limit: if far || var("GLEANER_RESERVE_MLOCK").as_deref() != Some("1") {
            0
        } else {
            usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX)
        },
        period: std::time::Duration::from_micros(period_us),
        stats: Stats::default(),
        waker: Waker::new(),
        // Until the thread's first refill: wake it at the first request.
        heap_low: AtomicUsize::new(usize::MAX),
        pool_low: AtomicUsize::new(0),
        missed: AtomicBool::new(false),
        requester_cpu: AtomicU32::new(u32::MAX),
        avoid_requester_cpu,
        phase: AtomicU8::new(Phase::Starting as u8),
        started: std::time::Instant::now(),
    };
    if RESERVE.set(reserve).is_err() {
        return Ok(false);
    }
    OWNER.store(true, Ordering::Relaxed);
    let r = RESERVE.get().expect("just set");
    thread::stock(r);
    thread::spawn(r)?;
    Ok(true)
}

/// A block of `size` bytes aligned to `align` from the reserve (zeroed if `zero`), or None: the
/// caller then serves the request from the default allocator.
pub(crate) fn alloc(size: usize, align: usize, zero: bool) -> Option<*mut c_void> {
    let r = active()?;
    r.alloc(size, align, zero)
}

impl Reserve {
    fn alloc(&self, size: usize, align: usize, zero: bool) -> Option<*mut c_void> {
        let large = size >= LARGE;
        let align = align.max(HEADER);
        let total = size.checked_add(align + HEADER);
        let (Some(total), true) = (total, align <= PAGE_SIZE) else {
            self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        self.stats.demand(size, large);
        let (start, tag, len, fresh) = if large {
            self.large(size)?
        } else {
            match self.heap.take(total) {
                Taken::Block(start) => {
                    if self.heap.free_bytes() < self.heap_low.load(Ordering::Relaxed) {
                        self.wake();
                    }
                    (start, 0, total, false)
                }
                Taken::Empty => {
                    self.stats.small_misses.fetch_add(1, Ordering::Relaxed);
                    let at = self.phase.load(Ordering::Relaxed);
                    let at = match self.miss() {
                        true => Phase::Asleep as u8,
                        false if at == Phase::Asleep as u8 => Phase::Woken as u8,
                        false => at,
                    };
                    self.stats.small_misses_at[usize::from(at).min(PHASES.len() - 1)]
                        .fetch_add(1, Ordering::Relaxed);
                    self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                Taken::Busy => return self.busy(),
            }
        };
        if !fresh {
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
        }
        let user = if large {
            start + crate::heap::spread_offset(align)
        } else {
            (start + HEADER).next_multiple_of(align)
        };
        // SAFETY: [start, start+len) was just taken for this request; the header's 16 bytes end
        // at `user`, inside it (a large block's offset is at least a cache line), and the
        // block's `size` bytes follow within it (a large chunk is `size` plus a page, the most
        // the offset is).
        unsafe {
            let h = (user - HEADER) as *mut usize;
            h.write(start | tag);
            h.add(1).write(len);
            if zero && !fresh {
                std::ptr::write_bytes(user as *mut u8, 0, size);
            }
        }
        Some(user as *mut c_void)
    }

    /// A chunk for a large request of `size` bytes ([`large_chunk_len`]): from the pool (a hit),
    /// else the chunk the thread is faulting in (a miss that faults only the pages not yet in),
    /// else a fresh range of the window that the program faults in itself (a miss, which the
    /// pool takes back when freed), else nothing (the request falls back). Returns
    /// `(start, 1, len, fresh)`: `fresh` blocks read as zeros (what the thread faulted in is
    /// zero pages too).
    fn large(&self, size: usize) -> Option<(usize, usize, usize, bool)> {
        let len = large_chunk_len(size)?;
        let Ok(pooled) = self.pool.take(len) else {
            return self.busy();
        };
        if let Some(c) = pooled {
            if c.locked {
                // SAFETY: the chunk is the reserve's, locked by the thread; the program's
                // memory is its own to swap from now on (Hermes unlocks on hand-out).
                unsafe { libc::munlock(c.start as *const c_void, c.len) };
                self.stats.locked_bytes.fetch_sub(c.len, Ordering::Relaxed);
            }
            self.stats.large_hits.fetch_add(1, Ordering::Relaxed);
            if c.fresh {
                self.stats.fresh_hits.fetch_add(1, Ordering::Relaxed);
            }
            if self.pool.pooled() < self.pool_low.load(Ordering::Relaxed) {
                self.wake();
            }
            return Some((c.start, 1, c.len, false));
        }
        self.miss();
        if let Some((start, have)) = self.forming.take(len) {
            if have >= len {
                // The chunk the thread is faulting in: the request faults only what is left.
                self.stats.partial_hits.fetch_add(1, Ordering::Relaxed);
                return Some((start, 1, have, true));
            }
            // Faulted in by the thread, never handed out: fresh.
            self.put_back(Chunk {
                start,
                len: have,
                locked: false,
                fresh: true,
            });
        }
        if len <= self.pool_bound {
            match self.window.try_take(len) {
                Ok(Some(start)) => return Some((start, 1, len, true)),
                Ok(None) => {}
                Err(()) => {
                    self.stats.busy.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// A request found a lock held (by the thread, or another request) past a brief spin: it
    /// goes to the default allocator rather than wait out a holder that may be preempted.
    fn busy<T>(&self) -> Option<T> {
        self.stats.busy.fetch_add(1, Ordering::Relaxed);
        self.stats.misses.fetch_add(1, Ordering::Relaxed);
        self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// A chunk the program no longer uses goes back to the pool, or past the pool's bound to
    /// the thread, which releases it (a request never makes that system call).
    fn put_back(&self, c: Chunk) {
        if let Err(c) = self.pool.put(c, self.pool_bound) {
            // SAFETY: the chunk is unused and page-aligned; the trim list holds it until the
            // thread releases it.
            unsafe { self.trim.push(c.start, c.len) };
            self.wake();
        }
    }

    /// The thread: releases the chunks freed past the pool's bound.
    fn release_trimmed(&self) {
        for (start, len) in self.trim.take_all() {
            self.stats
                .released_bytes
                .fetch_add(len as u64, Ordering::Relaxed);
            self.window.give(start, len);
        }
    }

    /// A request found nothing ready: counted, and the thread woken. Returns whether the
    /// thread slept (this call woke it).
    fn miss(&self) -> bool {
        self.stats.misses.fetch_add(1, Ordering::Relaxed);
        if !self.missed.load(Ordering::Relaxed) {
            self.missed.store(true, Ordering::Relaxed);
        }
        let woke = self.wake();
        if !woke {
            // A wake-up notes the CPU itself; a miss while the thread is awake notes it here.
            self.note_requester_cpu();
        }
        woke
    }

    /// Wakes the management thread if it sleeps. A wake-up per request (the first version woke
    /// it at every miss) cost redis a sixth of its CPU time in system calls and context
    /// switches (perf); this one makes a system call only when the thread sleeps, so at most
    /// once per sleep, and costs a fence and a load otherwise.
    fn wake(&self) -> bool {
        let woke = self.waker.wake(|| self.now_ns());
        if woke {
            self.stats.need_wakeups.fetch_add(1, Ordering::Relaxed);
            self.note_requester_cpu();
        }
        woke
    }

    /// Records the CPU the calling request runs on (a vDSO call), for the thread to avoid.
    fn note_requester_cpu(&self) {
        // SAFETY: sched_getcpu takes no arguments and only returns a number (or -1).
        let cpu = unsafe { libc::sched_getcpu() };
        if let Ok(cpu) = u32::try_from(cpu) {
            if self.requester_cpu.load(Ordering::Relaxed) != cpu {
                self.requester_cpu.store(cpu, Ordering::Relaxed);
            }
        }
    }

    /// The thread: notes where it is in its loop.
    fn enter(&self, p: Phase) {
        self.phase.store(p as u8, Ordering::Relaxed);
    }

    /// Nanoseconds since the reserve started, never 0 (a vDSO clock read, no system call).
    fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64 + 1
    }

    /// Whether the reserve needs the thread: a request missed, or the heap or the pool is
    /// under its low watermark.
    fn needs_refill(&self) -> bool {
        self.missed.load(Ordering::Relaxed)
            || !self.trim.is_empty()
            || self.heap.free_bytes() < self.heap_low.load(Ordering::Relaxed)
            || self.pool.pooled() < self.pool_low.load(Ordering::Relaxed)
    }

    /// Frees a block of the reserve.
    ///
    /// # Safety
    /// `p` came from [`alloc`] (it lies in the window) and is not used any more.
    unsafe fn free(&self, p: *mut c_void) {
        // SAFETY: the caller's contract: the header precedes the pointer.
        let (start, len) = unsafe { header(p) };
        if start & 1 == 0 {
            // SAFETY: a heap block of `len` bytes at `start`, no longer used.
            unsafe { self.heap.give(start, len) };
            return;
        }
        self.put_back(Chunk {
            start: start & !1,
            len,
            locked: false,
            fresh: false,
        });
    }
}

/// The chunk that serves a large request of `size` bytes, and the chunks the thread forms for
/// requests of that size: whole pages, one more than the block needs, because the block starts
/// at a cache line of the first page (`crate::heap::spread_offset`) with its header before it.
fn large_chunk_len(size: usize) -> Option<usize> {
    chunk_len(size, PAGE_SIZE, PAGE_SIZE)
}

/// # Safety
/// `p` came from the reserve and is live.
unsafe fn header(p: *mut c_void) -> (usize, usize) {
    // SAFETY: the caller's contract; the header precedes the pointer.
    unsafe {
        let h = (p as usize - HEADER) as *const usize;
        (h.read(), h.add(1).read())
    }
}

/// Frees `p`, a block of the reserve (it lies in the window).
///
/// # Safety
/// `p` came from [`alloc`] and is not used any more.
pub(crate) unsafe fn free(p: *mut c_void) {
    if let Some(r) = RESERVE.get() {
        // SAFETY: forwarded contract.
        unsafe { r.free(p) }
    }
}

/// The usable size of `p`, a live block of the reserve: up to the end of its block.
///
/// # Safety
/// `p` came from [`alloc`] and is live.
pub(crate) unsafe fn size_of(p: *mut c_void) -> usize {
    // SAFETY: forwarded contract.
    let (start, len) = unsafe { header(p) };
    (start & !1) + len - p as usize
}

/// Notes a `realloc` of a reserve block of `old` usable bytes to `size`: kept in place, or
/// moved (`copied` bytes copied into a new block).
pub(crate) fn note_realloc(old: usize, size: usize, copied: Option<usize>) {
    let Some(r) = RESERVE.get() else { return };
    let s = &r.stats;
    let Some(n) = copied else {
        s.reallocs_kept.fetch_add(1, Ordering::Relaxed);
        return;
    };
    s.reallocs_moved.fetch_add(1, Ordering::Relaxed);
    if old.max(size) >= LARGE {
        s.reallocs_moved_large.fetch_add(1, Ordering::Relaxed);
    }
    s.realloc_copied_bytes
        .fetch_add(n as u64, Ordering::Relaxed);
}

/// Takes the reserve's locks before `fork`.
pub(crate) fn lock_for_fork() {
    if let Some(r) = RESERVE.get() {
        r.heap.lock();
        r.pool.lock();
        r.window.lock();
    }
}

/// Releases them after `fork`, in parent and child (`in_child`: the child stops taking new
/// requests, having no management thread).
///
/// # Safety
/// Only after [`lock_for_fork`].
pub(crate) unsafe fn unlock_after_fork(in_child: bool) {
    if in_child {
        OWNER.store(false, Ordering::Relaxed);
    }
    if let Some(r) = RESERVE.get() {
        // SAFETY: forwarded contract.
        unsafe {
            r.window.unlock();
            r.pool.unlock();
            r.heap.unlock();
        }
    }
}

/// The reserve's stats as JSON (the run's stats and `gleaner status`).
pub(crate) fn stats_json() -> Option<serde_json::Value> {
    let r = RESERVE.get()?;
    let s = &r.stats;
    let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    Some(serde_json::json!({
        "heap_ready_bytes": r.heap.free_bytes(),
        "pool_bytes": r.pool.pooled(),
        "reserve_bytes": r.heap.free_bytes() + r.pool.pooled(),
        "bound_bytes": r.heap_bound + r.pool_bound,
        "locked_bytes": s.locked_bytes.load(Ordering::Relaxed),
        "memlock_limit_bytes": r.memlock_limit,
        "far_memory": r.window.far(),
        "hits": n(&s.hits),
        "misses": n(&s.misses),
        "partial_hits": n(&s.partial_hits),
        "fresh_hits": n(&s.fresh_hits),
        "large_hits": n(&s.large_hits),
        "reallocs_kept": n(&s.reallocs_kept),
        "reallocs_moved": n(&s.reallocs_moved),
        "reallocs_moved_large": n(&s.reallocs_moved_large),
        "realloc_copied_bytes": n(&s.realloc_copied_bytes),
        "small_misses": n(&s.small_misses),
        "small_misses_at": PHASES
            .iter()
            .zip(&s.small_misses_at)
            .map(|(k, a)| (k.to_string(), serde_json::json!(n(a))))
            .collect::<serde_json::Map<_, _>>(),
        "start_stock_cpu_seconds": n(&s.stock_cpu_ns) as f64 / 1e9,
        "thread_heap_refill_seconds": n(&s.heap_refill_us) as f64 / 1e6,
        "thread_pool_refill_seconds": n(&s.pool_refill_us) as f64 / 1e6,
        "thread_pool_refill_max_us": n(&s.pool_refill_max_us),
        "busy": n(&s.busy),
        "fallbacks": n(&s.fallbacks),
        "populated_bytes": n(&s.populated_bytes),
        "populate_failures": n(&s.populate_failures),
        "populate_last_errno": n(&s.populate_last_errno),
        "released_bytes": n(&s.released_bytes),
        "thread_wakeups": n(&s.wakeups),
        "thread_wakeups_on_need": n(&s.need_wakeups),
        "thread_cpu_seconds": n(&s.thread_cpu_ns) as f64 / 1e9,
        "thread_populate_cpu_seconds": n(&s.populate_cpu_ns) as f64 / 1e9,
        "period_us": r.period.as_micros() as u64,
        "pool_target_bytes": s.pool_target.load(Ordering::Relaxed),
        "thread_reaction_us": n(&s.reaction_us),
        "thread_wake_delay_max_us": n(&s.wake_delay_max_us),
    }))
}
