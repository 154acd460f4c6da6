//! The program's heap in managed memory.
//!
//! Blocks of up to [`slab::MAX_SMALL`] bytes (with at most 16-byte alignment) come from size
//! classes on pages of their own (`slab.rs`: hot small objects pack together, away from large
//! values). Other small blocks come from a TLSF allocator whose pools are 64 MiB chunks carved
//! from the arena; blocks of [`BIG`] bytes or more take whole pages from the arena, so freeing
//! them releases their memory locally and on the memnode. Every TLSF or big block carries a
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

use gleaner_pager::PAGE_SIZE;

use crate::arena;
use crate::lock::SpinLock;
use crate::slab;

/// Blocks at least this large bypass TLSF and take whole pages.
pub(crate) const BIG: usize = 256 * 1024;
/// Size of each TLSF pool carved from the arena.
const POOL: usize = 64 << 20;
const HEADER: usize = 16;

type Tlsf = rlsf::Tlsf<'static, u32, u32, 24, 32>;

static TLSF: SpinLock<Tlsf> = SpinLock::new(Tlsf::new());

fn align_up(x: usize, a: usize) -> usize {
    (x + a - 1) & !(a - 1)
}

/// Allocates `size` bytes aligned to `align` (a power of two) in managed memory.
/// Returns NULL when the arena is exhausted.
pub(crate) fn alloc(size: usize, align: usize) -> *mut c_void {
    if size <= slab::MAX_SMALL && align <= slab::ALIGN {
        if let Some(p) = slab::alloc(size) {
            return p as *mut c_void;
        }
    }
    let align = align.max(HEADER);
    let Some(total) = size.checked_add(align + HEADER) else {
        return std::ptr::null_mut();
    };
    let Some(a) = arena::get() else {
        return std::ptr::null_mut();
    };
    let (start, tag, n) = if total >= BIG {
        match a.carve(total) {
            Some(s) => (s, 1, total.div_ceil(PAGE_SIZE) * PAGE_SIZE),
            None => return std::ptr::null_mut(),
        }
    } else {
        match small(total) {
            Some(s) => (s, 0, size),
            None => return std::ptr::null_mut(),
        }
    };
    let user = align_up(start + HEADER, align);
    // SAFETY: [start, start+total) is ours; user - HEADER >= start, and the header's 16 bytes end
    // at `user`, inside the block. Writing may fault; this is an application thread.
    unsafe {
        let h = (user - HEADER) as *mut usize;
        h.write(start | tag);
        h.add(1).write(n);
    }
    user as *mut c_void
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

/// Frees a managed block.
///
/// # Safety
/// `p` was returned by [`alloc`] and not freed.
pub(crate) unsafe fn free(p: *mut c_void) {
    if slab::block_size(p as usize).is_some() {
        // SAFETY: a live block of a size class (the caller's contract).
        unsafe { slab::free(p as usize) };
        return;
    }
    // SAFETY: the caller's contract.
    let (start, n) = unsafe { header(p) };
    if start & 1 == 1 {
        if let Some(a) = arena::get() {
            a.release(start & !1, n);
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
