//! The C library's own allocator, which serves the runtime (the pager's threads and data) so that
//! it never lives in managed memory, and raw system calls for the mapping functions.
//!
//! `dlsym` may itself call `calloc` before the real functions are known; those early requests are
//! served from a small static bootstrap buffer that is never freed.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

type MallocFn = unsafe extern "C" fn(usize) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type CallocFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type ReallocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
type MemalignFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type UsableFn = unsafe extern "C" fn(*mut c_void) -> usize;

static MALLOC: AtomicUsize = AtomicUsize::new(0);
static FREE: AtomicUsize = AtomicUsize::new(0);
static CALLOC: AtomicUsize = AtomicUsize::new(0);
static REALLOC: AtomicUsize = AtomicUsize::new(0);
static MEMALIGN: AtomicUsize = AtomicUsize::new(0);
static USABLE: AtomicUsize = AtomicUsize::new(0);
/// 0: unresolved, 1: resolving (dlsym running), 2: ready.
static STATE: AtomicU8 = AtomicU8::new(0);

const BOOT_LEN: usize = 256 * 1024;
#[repr(align(16))]
struct Boot([u8; BOOT_LEN]);
static mut BOOT: Boot = Boot([0; BOOT_LEN]);
static BOOT_USED: AtomicUsize = AtomicUsize::new(0);

fn resolve() {
    match STATE.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            let sym = |name: &[u8]| {
                // SAFETY: RTLD_NEXT with a NUL-terminated name; returns the next definition
                // after this library (the C library's) or NULL.
                let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) };
                if p.is_null() {
                    abort_with(b"gleaner: cannot find the C library's allocator (dlsym)\n");
                }
                p as usize
            };
            MALLOC.store(sym(b"malloc\0"), Ordering::Release);
            FREE.store(sym(b"free\0"), Ordering::Release);
            CALLOC.store(sym(b"calloc\0"), Ordering::Release);
            REALLOC.store(sym(b"realloc\0"), Ordering::Release);
            MEMALIGN.store(sym(b"memalign\0"), Ordering::Release);
            USABLE.store(sym(b"malloc_usable_size\0"), Ordering::Release);
            STATE.store(2, Ordering::Release);
        }
        Err(_) => {
            while STATE.load(Ordering::Acquire) != 2 {
                std::hint::spin_loop();
            }
        }
    }
}

/// Whether the real functions are known (false while `dlsym` is still running).
pub(crate) fn ready() -> bool {
    STATE.load(Ordering::Acquire) == 2
}

/// Whether resolution is in progress on some thread (requests then go to the bootstrap buffer).
pub(crate) fn resolving() -> bool {
    STATE.load(Ordering::Acquire) == 1
}

/// Bump-allocates from the bootstrap buffer (for `dlsym`'s own allocations).
pub(crate) fn boot_alloc(size: usize, zero: bool) -> *mut c_void {
    let size = (size + 15) & !15;
    let off = BOOT_USED.fetch_add(size, Ordering::AcqRel);
    if off + size > BOOT_LEN {
        abort_with(b"gleaner: bootstrap allocation buffer exhausted\n");
    }
    let _ = zero; // static memory starts zeroed and is never reused
                  // SAFETY: the range [off, off+size) of the static buffer is handed out exactly once.
    unsafe { (std::ptr::addr_of_mut!(BOOT.0) as *mut u8).add(off).cast() }
}

/// Whether `p` came from the bootstrap buffer (such pointers are never freed).
pub(crate) fn is_boot(p: *mut c_void) -> bool {
    // SAFETY: only the address is taken; nothing is read.
    let base = unsafe { std::ptr::addr_of!(BOOT.0) } as usize;
    (p as usize) >= base && (p as usize) < base + BOOT_LEN
}

macro_rules! real_fn {
    ($name:ident, $slot:ident, $ty:ty) => {
        fn $name() -> $ty {
            if !ready() {
                resolve();
            }
            // SAFETY: the slot holds the address dlsym returned for a function of this type.
            unsafe { std::mem::transmute::<usize, $ty>($slot.load(Ordering::Acquire)) }
        }
    };
}
real_fn!(f_malloc, MALLOC, MallocFn);
real_fn!(f_free, FREE, FreeFn);
real_fn!(f_calloc, CALLOC, CallocFn);
real_fn!(f_realloc, REALLOC, ReallocFn);
real_fn!(f_memalign, MEMALIGN, MemalignFn);
real_fn!(f_usable, USABLE, UsableFn);

/// The C library's `malloc`.
pub(crate) unsafe fn malloc(size: usize) -> *mut c_void {
    // SAFETY: forwarding to the C library's malloc with the caller's argument.
    unsafe { f_malloc()(size) }
}
/// The C library's `free`.
pub(crate) unsafe fn free(p: *mut c_void) {
    // SAFETY: `p` came from the C library's allocator (the caller routes by address).
    unsafe { f_free()(p) }
}
/// The C library's `calloc`.
pub(crate) unsafe fn calloc(n: usize, size: usize) -> *mut c_void {
    // SAFETY: forwarding.
    unsafe { f_calloc()(n, size) }
}
/// The C library's `realloc`.
pub(crate) unsafe fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: `p` is NULL or came from the C library's allocator.
    unsafe { f_realloc()(p, size) }
}
/// The C library's `memalign`.
pub(crate) unsafe fn memalign(align: usize, size: usize) -> *mut c_void {
    // SAFETY: forwarding.
    unsafe { f_memalign()(align, size) }
}
/// The C library's `malloc_usable_size`.
pub(crate) unsafe fn usable_size(p: *mut c_void) -> usize {
    // SAFETY: `p` came from the C library's allocator.
    unsafe { f_usable()(p) }
}

/// The next definition after this library of the C function `name` (NUL-terminated): the C
/// library's, for the functions this library interposes beyond the allocator. Found once into
/// `slot`; a missing one aborts with a message (it is in every C library gleaner runs on).
pub(crate) fn next(slot: &AtomicUsize, name: &[u8]) -> *mut c_void {
    let known = slot.load(Ordering::Acquire);
    if known != 0 {
        return known as *mut c_void;
    }
    // SAFETY: RTLD_NEXT with a NUL-terminated name: the next definition after this library.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) };
    if p.is_null() {
        let mut msg = b"gleaner: cannot find the C library's ".to_vec();
        msg.extend_from_slice(&name[..name.len() - 1]);
        msg.push(b'\n');
        abort_with(&msg);
    }
    slot.store(p as usize, Ordering::Release);
    p
}

/// `mmap(2)` by system call, bypassing the interposed symbol.
pub(crate) unsafe fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: i32,
    flags: i32,
    fd: i32,
    off: i64,
) -> *mut c_void {
    // SAFETY: the raw mmap system call with the caller's arguments.
    let r = unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) };
    r as *mut c_void
}

/// `munmap(2)` by system call.
pub(crate) unsafe fn munmap(addr: *mut c_void, len: usize) -> i32 {
    // SAFETY: the raw munmap system call with the caller's arguments.
    unsafe { libc::syscall(libc::SYS_munmap, addr, len) as i32 }
}

/// `mremap(2)` by system call.
pub(crate) unsafe fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: i32,
    new_addr: *mut c_void,
) -> *mut c_void {
    // SAFETY: the raw mremap system call with the caller's arguments.
    unsafe {
        libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_addr) as *mut c_void
    }
}

/// `madvise(2)` by system call.
pub(crate) unsafe fn madvise(addr: *mut c_void, len: usize, advice: i32) -> i32 {
    // SAFETY: the raw madvise system call with the caller's arguments.
    unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) as i32 }
}

/// `mprotect(2)` by system call.
pub(crate) unsafe fn mprotect(addr: *mut c_void, len: usize, prot: i32) -> i32 {
    // SAFETY: the raw mprotect system call with the caller's arguments.
    unsafe { libc::syscall(libc::SYS_mprotect, addr, len, prot) as i32 }
}

/// Writes `msg` to stderr and aborts (used where nothing else is safe to call).
pub(crate) fn abort_with(msg: &[u8]) -> ! {
    // SAFETY: write(2) of a static byte string to fd 2; abort has no preconditions.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::abort()
    }
}

/// The runtime's global allocator: the C library's heap, never managed memory.
pub(crate) struct RuntimeAlloc;

// SAFETY: every method forwards to the C library's allocator, which satisfies GlobalAlloc's
// contract; alignments above 16 go through memalign, and realloc of such blocks copies.
unsafe impl std::alloc::GlobalAlloc for RuntimeAlloc {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        if resolving() {
            return boot_alloc(l.size().max(l.align()), false).cast();
        }
        // SAFETY: forwarding with a valid size/alignment.
        unsafe {
            if l.align() <= 16 {
                malloc(l.size()).cast()
            } else {
                memalign(l.align(), l.size()).cast()
            }
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, _l: std::alloc::Layout) {
        if is_boot(p.cast()) {
            return;
        }
        // SAFETY: `p` came from `alloc` above, i.e. from the C library.
        unsafe { free(p.cast()) }
    }

    unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
        if l.align() <= 16 && !resolving() {
            // SAFETY: forwarding.
            return unsafe { calloc(1, l.size()).cast() };
        }
        // SAFETY: alloc then zero the whole block.
        unsafe {
            let p = self.alloc(l);
            if !p.is_null() {
                std::ptr::write_bytes(p, 0, l.size());
            }
            p
        }
    }

    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, new: usize) -> *mut u8 {
        if l.align() <= 16 && !is_boot(p.cast()) && !resolving() {
            // SAFETY: `p` came from the C library's malloc.
            return unsafe { realloc(p.cast(), new).cast() };
        }
        // SAFETY: allocate, copy the smaller size, release the old block.
        unsafe {
            let n = self.alloc(std::alloc::Layout::from_size_align_unchecked(
                new,
                l.align(),
            ));
            if !n.is_null() {
                std::ptr::copy_nonoverlapping(p, n, l.size().min(new));
                self.dealloc(p, l);
            }
            n
        }
    }
}
