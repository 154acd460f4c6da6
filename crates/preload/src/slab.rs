//! Small blocks by size class, each class on pages of its own.
//!
//! Why it matters for far memory: a program's small, hot objects (hash-table entries, keys,
//! object headers) must share pages with each other, not with its large, cold values. Mixed in
//! one heap (as a first-fit allocator lays them out, in allocation order), every page holds a
//! little metadata, so a walk over the metadata (redis rehashing its dictionary) touches every
//! page and no eviction order can keep the hot part local: redis at 50% local took far more
//! faults than under Linux swap, whose program (jemalloc) segregates sizes. Here, as in jemalloc,
//! each size class takes whole 64 KiB chunks and hands out equal blocks from them, so the metadata
//! of a program packs into few pages that stay hot.
//!
//! Blocks carry no header: a chunk's class is found from its address in a table indexed by chunk
//! number (one byte per 64 KiB of the first [`MAX_ARENA`] bytes of the arena). Free blocks sit on
//! an intrusive list per class (the first word of a free block holds the next one), reused last
//! in, first out. Chunks are never returned to the arena (classes are at most [`MAX_SMALL`]
//! bytes, so a chunk holds at least 18 blocks).
//!
//! Like the rest of the heap, blocks and free-list links live in managed memory and are touched
//! only by application threads (inside `malloc`/`free`).

use std::sync::atomic::{AtomicU8, Ordering};

use crate::arena;
use crate::lock::SpinLock;

/// The largest block served by a size class; larger ones go to the general heap.
pub(crate) const MAX_SMALL: usize = 3584;
/// Blocks are aligned to this many bytes (every class size is a multiple of it).
pub(crate) const ALIGN: usize = 16;
const CHUNK_SHIFT: u32 = 16;
const CHUNK: usize = 1 << CHUNK_SHIFT;
/// Chunks are carved from the arena this many at a time.
const CHUNKS_PER_POOL: usize = 64;
/// The part of the arena that can hold chunks (the class table's reach).
const MAX_ARENA: usize = 64 << 30;
const TABLE_LEN: usize = MAX_ARENA >> CHUNK_SHIFT;

/// The class sizes: every 16 bytes up to 256, then eight per doubling up to 1 KiB (as mimalloc
/// spaces its bins), then sixteen per doubling, so a small block wastes at most 1/8 of itself and
/// one above 1 KiB at most 1/16. Four per doubling (jemalloc's spacing) put the demo job's
/// 2081-byte objects in 2560-byte blocks, a fifth of each block wasted: its heap and the far
/// memory it needs grew with it;
/// eight per doubling still put them in 2304-byte blocks (10.7%), sixteen in 2176 (4.6%).
const SIZES: [usize; 60] = [
    16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256, 288, 320, 352, 384,
    416, 448, 480, 512, 576, 640, 704, 768, 832, 896, 960, 1024, 1088, 1152, 1216, 1280, 1344,
    1408, 1472, 1536, 1600, 1664, 1728, 1792, 1856, 1920, 1984, 2048, 2176, 2304, 2432, 2560, 2688,
    2816, 2944, 3072, 3200, 3328, 3456, 3584,
];

/// `CLASS_OF[(size + 15) / 16]` is the class of a request of `size` bytes (`size <= MAX_SMALL`).
static CLASS_OF: [u8; MAX_SMALL / ALIGN + 1] = class_table();

const fn class_table() -> [u8; MAX_SMALL / ALIGN + 1] {
    let mut t = [0u8; MAX_SMALL / ALIGN + 1];
    let mut units = 0;
    let mut class = 0;
    while units < t.len() {
        while SIZES[class] < units * ALIGN {
            class += 1;
        }
        t[units] = class as u8;
        units += 1;
    }
    t
}

/// For each chunk of the arena, 0 (not a slab chunk) or its class + 1.
static CHUNK_CLASS: [AtomicU8; TABLE_LEN] = [const { AtomicU8::new(0) }; TABLE_LEN];

/// One class's blocks: the free list and the unused tail of its current chunk.
#[derive(Clone, Copy)]
struct Class {
    free: usize,
    bump: usize,
    end: usize,
}

static CLASSES: [SpinLock<Class>; SIZES.len()] = [const {
    SpinLock::new(Class {
        free: 0,
        bump: 0,
        end: 0,
    })
}; SIZES.len()];

/// Chunks carved from the arena and not yet given to a class: `[next, end)`.
static POOL: SpinLock<(usize, usize)> = SpinLock::new((0, 0));

/// A block of at least `size` bytes (`size <= MAX_SMALL`), 16-byte aligned; None when the arena
/// (or the table's reach) is exhausted, so the caller falls back to the general heap.
pub(crate) fn alloc(size: usize) -> Option<usize> {
    debug_assert!(size <= MAX_SMALL);
    let class = CLASS_OF[size.div_ceil(ALIGN)] as usize;
    let block = SIZES[class];
    CLASSES[class].with(|c| {
        if c.free != 0 {
            let p = c.free;
            // SAFETY: `p` heads this class's free list, so it is a free block of this class
            // whose first word holds the next free block (written by `free`). An application
            // thread may fault here; that is served like any access.
            c.free = unsafe { (p as *const usize).read() };
            return Some(p);
        }
        if c.bump + block > c.end {
            let chunk = take_chunk(class)?;
            c.bump = chunk;
            c.end = chunk + CHUNK;
        }
        let p = c.bump;
        c.bump += block;
        Some(p)
    })
}

/// A fresh chunk for `class`, marked in the table.
fn take_chunk(class: usize) -> Option<usize> {
    let a = arena::get()?;
    let base = a.region().as_ptr() as usize;
    let chunk = POOL.with(|(next, end)| {
        if *next == *end {
            // Carve a pool with room to align it to a chunk boundary; the pages skipped before
            // the boundary are never touched, so they cost nothing.
            let len = (CHUNKS_PER_POOL + 1) * CHUNK;
            let start = a.carve(len)?;
            let aligned = (start - base).next_multiple_of(CHUNK) + base;
            if aligned - base + CHUNKS_PER_POOL * CHUNK > MAX_ARENA {
                return None;
            }
            *next = aligned;
            *end = aligned + CHUNKS_PER_POOL * CHUNK;
        }
        let c = *next;
        *next += CHUNK;
        Some(c)
    })?;
    CHUNK_CLASS[(chunk - base) >> CHUNK_SHIFT].store(class as u8 + 1, Ordering::Release);
    Some(chunk)
}

/// The class size of `p` if it is a block of a size class (`p` inside the arena).
pub(crate) fn block_size(p: usize) -> Option<usize> {
    let base = arena::get()?.region().as_ptr() as usize;
    let off = p.checked_sub(base)?;
    if off >= MAX_ARENA {
        return None;
    }
    match CHUNK_CLASS[off >> CHUNK_SHIFT].load(Ordering::Acquire) {
        0 => None,
        c => Some(SIZES[c as usize - 1]),
    }
}

/// Frees block `p` of a size class.
///
/// # Safety
/// `p` was returned by [`alloc`] and not freed since.
pub(crate) unsafe fn free(p: usize) {
    let base = arena::get()
        .expect("a slab block implies an arena")
        .region()
        .as_ptr() as usize;
    let class = CHUNK_CLASS[(p - base) >> CHUNK_SHIFT].load(Ordering::Acquire) as usize - 1;
    CLASSES[class].with(|c| {
        // SAFETY: `p` is a live block of this class (the caller's contract), at least 16 bytes
        // and 16-byte aligned: its first word can hold the link.
        unsafe { (p as *mut usize).write(c.free) };
        c.free = p;
    });
}

/// Takes every class lock, then the pool's, before `fork` (the order `alloc` nests them in).
pub(crate) fn lock_for_fork() {
    for c in &CLASSES {
        c.lock();
    }
    POOL.lock();
}

/// Releases them after `fork`, in parent and child.
///
/// # Safety
/// Only after [`lock_for_fork`].
pub(crate) unsafe fn unlock_after_fork() {
    // SAFETY: taken by lock_for_fork (the forwarded contract).
    unsafe { POOL.unlock() };
    for c in CLASSES.iter().rev() {
        // SAFETY: as above.
        unsafe { c.unlock() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_gets_the_smallest_class_that_holds_it() {
        for size in 0..=MAX_SMALL {
            let c = CLASS_OF[size.div_ceil(ALIGN)] as usize;
            assert!(SIZES[c] >= size.max(1), "size {size} in class {}", SIZES[c]);
            assert!(
                c == 0 || SIZES[c - 1] < size,
                "size {size} could use a smaller class"
            );
        }
        assert!(SIZES.iter().all(|s| s % ALIGN == 0 && CHUNK / s >= 18));
        assert_eq!(SIZES[SIZES.len() - 1], MAX_SMALL);
    }
}
