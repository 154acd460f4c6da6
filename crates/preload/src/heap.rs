//! The program's heap in managed memory.
//!
//! Blocks of up to [`slab::MAX_SMALL`] bytes (with at most 16-byte alignment) come from size
//! classes on pages of their own (`slab.rs`: hot small objects pack together, away from large
//! values). Other small blocks come from a TLSF allocator whose pools are 64 MiB chunks carved
//! from the arena; blocks of [`BIG`] bytes or more take whole pages from the arena, one more than
//! they need, and start at a cache line of their first page that changes from block to block (at
//! one fixed offset the kernel's copies into and out of them ran 1.5x slower). A freed one
//! is kept for the next big block of its size or smaller, within bounds (`retain.rs`), beyond
//! which its memory is released locally and on the memnode. Every TLSF or big block carries a
//! 16-byte header just before the pointer handed out: `[start, n]`. For a TLSF block `start` is
//! the TLSF block and `n` the size asked for; for a big block `start` is its first page tagged
//! with bit 0 and `n` the bytes carved. That is what lets `free` and `malloc_usable_size` work
//! without the alignment the block was made with. Size-class blocks have no header: their class
//! is found from their address.
//!
//! The header and TLSF's own block headers live in managed memory: only application threads touch
//! them (inside `malloc`/`free`), and a fault there is served like any other.

use std::alloc::Layout;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use gleaner_pager::PAGE_SIZE;
use gleaner_policy::hermes::large_block_offset;

use crate::arena;
use crate::lock::SpinLock;
use crate::slab;

/// Blocks at least this large bypass TLSF and take whole pages.
const BIG: usize = 256 * 1024;
/// Size of each TLSF pool carved from the arena.
const POOL: usize = 64 << 20;
const HEADER: usize = 16;
/// Large blocks so far (big ones here and the reserve's large ones): what spreads them over
/// their first page's cache lines ([`spread_offset`]).
static SPREAD_SEQ: AtomicU64 = AtomicU64::new(0);

type Tlsf = rlsf::Tlsf<'static, u32, u32, 24, 32>;

static TLSF: SpinLock<Tlsf> = SpinLock::new(Tlsf::new());

fn align_up(x: usize, a: usize) -> usize {
    (x + a - 1) & !(a - 1)
}

/// Allocates `size` bytes aligned to `align` (a power of two) in managed memory.
/// Returns NULL when the arena is exhausted.
pub(crate) fn alloc(size: usize, align: usize) -> *mut c_void {
    alloc_block(size, align).0
}

/// [`alloc`] of `size` bytes that read as zeros (`calloc`).
pub(crate) fn alloc_zeroed(size: usize) -> *mut c_void {
    let (p, fresh) = alloc_block(size, 16);
    if !p.is_null() && !fresh {
        // SAFETY: p points to at least `size` bytes just allocated.
        unsafe { std::ptr::write_bytes(p as *mut u8, 0, size) };
    }
    p
}

/// [`alloc`], and whether the block is fresh pages (which read as zeros).
fn alloc_block(size: usize, align: usize) -> (*mut c_void, bool) {
    let null = (std::ptr::null_mut(), false);
    if size <= slab::MAX_SMALL && align <= slab::ALIGN {
        if let Some(p) = slab::alloc(size) {
            return (p as *mut c_void, false);
        }
    }
    let align = align.max(HEADER);
    let Some(total) = size.checked_add(align + HEADER) else {
        return null;
    };
    let Some(a) = arena::get() else {
        return null;
    };
    let big = total >= BIG;
    // A big block aligned to a page or less takes a page more than it needs and starts at a
    // cache line of its first page; one aligned to more, right after its header, aligned.
    let spread = big && align <= PAGE_SIZE;
    let (start, tag, n, fresh) = if big {
        let total = if spread {
            let Some(t) = size.checked_add(PAGE_SIZE) else {
                return null;
            };
            t
        } else {
            total
        };
        // A freed big block kept for reuse first: its resident pages take no fault at first
        // touch (`retain.rs`).
        let bytes = total.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        match a.reuse(total) {
            Some(s) => (s, 1, bytes, false),
            None => match a.carve(total) {
                Some(s) => (s, 1, bytes, true),
                None => return null,
            },
        }
    } else {
        match small(total) {
            Some(s) => (s, 0, size, false),
            None => return null,
        }
    };
    let user = if spread {
        // Not right after the header: at one page offset for every big block, the kernel's
        // copies into and out of them (a socket's, a file's) ran 1.5x slower.
        start + spread_offset(align)
    } else {
        align_up(start + HEADER, align)
    };
    // SAFETY: [start, start+n) is ours; user - HEADER >= start (a spread block's offset is at
    // least a cache line), and the header's 16 bytes end at `user`, inside the block; the block's
    // `size` bytes follow within it (a spread block's pages are `size` plus a page, the most its
    // offset is; any other block is `size + align + HEADER`). Writing may fault; this is an
    // application thread.
    unsafe {
        let h = (user - HEADER) as *mut usize;
        h.write(start | tag);
        h.add(1).write(n);
    }
    (user as *mut c_void, fresh)
}

/// Where the next large block (a big block here, a large one of the reserve) starts in its
/// page-aligned pages, which hold a page more than the block: a cache line of the first page
/// that changes from block to block, aligned to `align` (at most a page), never before the
/// header's 16 bytes (`large_block_offset` says why not right after them).
pub(crate) fn spread_offset(align: usize) -> usize {
    let seq = SPREAD_SEQ.fetch_add(1, Ordering::Relaxed);
    large_block_offset(seq, align, PAGE_SIZE)
}

fn small(total: usize) -> Option<usize> {
    let layout = Layout::from_size_align(total, HEADER).ok()?;
    TLSF.with(|t| {
        if let Some(p) = t.allocate(layout) {
            return Some(p.as_ptr() as usize);
        }
        // Grow: a new pool from the arena (zero-filled pages, registered already).
        let len = POOL.max(total * 2);
        let pool = arena::get()?.carve(len)?;
        let slice = std::ptr::slice_from_raw_parts_mut(pool as *mut u8, len);
        // SAFETY: the pool is fresh arena memory nobody else references; TLSF takes ownership.
        unsafe { t.insert_free_block_ptr(NonNull::new(slice)?) };
        t.allocate(layout).map(|p| p.as_ptr() as usize)
    })
}

/// The usable size of managed block `p`: its class size (size-class blocks), the size asked for
/// (other small blocks) or everything up to the end of its pages (big blocks).
///
/// # Safety
/// `p` was returned by [`alloc`] and not freed.
pub(crate) unsafe fn size_of(p: *mut c_void) -> usize {
    if let Some(n) = slab::block_size(p as usize) {
        return n;
    }
    // SAFETY: the header sits just before every pointer `alloc` returns.
    let (start, n) = unsafe { header(p) };
    if start & 1 == 1 {
        (start & !1) + n - p as usize
    } else {
        n
    }
}

/// # Safety
/// `p` was returned by [`alloc`] and not freed.
unsafe fn header(p: *mut c_void) -> (usize, usize) {
    // SAFETY: the caller's contract; the header precedes the pointer.
    unsafe {
        let h = (p as usize - HEADER) as *const usize;
        (h.read(), h.add(1).read())
    }
}

/// Frees a managed block; a big one is kept for reuse (`retain.rs`).
///
/// # Safety
/// `p` was returned by [`alloc`] and not freed.
pub(crate) unsafe fn free(p: *mut c_void) {
    // SAFETY: forwarded contract.
    unsafe { free_block(p, true) }
}

/// Frees a block that `realloc` outgrew: a big one is released at once, not kept. The blocks a
/// growing buffer leaves behind are each smaller than its next size (Python's lists grow by an
/// eighth), so no later allocation of that buffer fits them; kept, they would only hold budget.
///
/// # Safety
/// `p` was returned by [`alloc`] and not freed.
pub(crate) unsafe fn free_outgrown(p: *mut c_void) {
    // SAFETY: forwarded contract.
    unsafe { free_block(p, false) }
}

/// # Safety
/// `p` was returned by [`alloc`] and not freed.
unsafe fn free_block(p: *mut c_void, keep: bool) {
    if slab::block_size(p as usize).is_some() {
        // SAFETY: a live block of a size class (the caller's contract).
        unsafe { slab::free(p as usize) };
        return;
    }
    // SAFETY: the caller's contract.
    let (start, n) = unsafe { header(p) };
    if start & 1 == 1 {
        if let Some(a) = arena::get() {
            if keep {
                a.retire(start & !1, n);
            } else {
                a.release(start & !1, n);
            }
        }
    } else {
        TLSF.with(|t| {
            // SAFETY: `start` is the TLSF block this pointer was carved from, allocated with
            // alignment HEADER.
            unsafe { t.deallocate(NonNull::new_unchecked(start as *mut u8), HEADER) }
        });
    }
}

/// Takes the heap lock before `fork` (so the child never inherits it held by a vanished thread).
pub(crate) fn lock_for_fork() {
    slab::lock_for_fork();
    TLSF.lock();
}

/// Releases it after `fork`, in parent and child.
///
/// # Safety
/// Only after [`lock_for_fork`].
pub(crate) unsafe fn unlock_after_fork() {
    // SAFETY: forwarded contract.
    unsafe {
        TLSF.unlock();
        slab::unlock_after_fork();
    }
}
