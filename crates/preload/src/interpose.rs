//! The exported C symbols that replace the C library's allocator and anonymous-mapping calls.
//!
//! Routing: a pointer inside the arena is managed; anything else belongs to the C library (blocks
//! allocated before the arena existed, or by runtime code). New allocations go to managed memory
//! once the arena is up, unless the calling thread is inside gleaner's own runtime.

// The exported functions replace C library calls: their contract is the C library's (its manual
// pages), the same for every caller, so no `# Safety` section is repeated on each.
#![allow(clippy::missing_safety_doc)]

use std::ffi::c_void;

use gleaner_pager::PAGE_SIZE;

use crate::{arena, heap, loader, real, reserve};

fn managed_allocations() -> bool {
    arena::get().is_some() && !crate::in_runtime()
}

/// A block from the latency-critical reserve (`reserve/`), where one runs and the request is the
/// program's own (not gleaner's runtime, not the dynamic linker's); None sends the request on.
fn from_reserve(size: usize, align: usize, zero: bool, caller: usize) -> Option<*mut c_void> {
    if reserve::get().is_none() || crate::in_runtime() || loader::is_loader(caller) {
        return None;
    }
    reserve::alloc(size, align, zero)
}

/// Sets this thread's `errno`.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

// The allocation entry points learn their caller, so that the dynamic linker's requests stay
// out of managed memory (`loader.rs`): each is a trampoline. At a function's first instruction
// the caller's return address is the word on top of the stack (x86-64) or in the link register
// (AArch64); each passes it as the argument after the function's own and jumps to the
// allocator, which returns to the caller.

/// `malloc(3)`: [`malloc_from`] with the caller's address.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    core::arch::naked_asm!(
        "mov rsi, qword ptr [rsp]",
        "jmp {f}",
        f = sym malloc_from,
    )
}

/// `calloc(3)`: [`calloc_from`] with the caller's address.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    core::arch::naked_asm!(
        "mov rdx, qword ptr [rsp]",
        "jmp {f}",
        f = sym calloc_from,
    )
}

/// `realloc(3)`: [`realloc_from`] with the caller's address.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    core::arch::naked_asm!(
        "mov rdx, qword ptr [rsp]",
        "jmp {f}",
        f = sym realloc_from,
    )
}

/// `malloc(3)`: [`malloc_from`] with the caller's address.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    core::arch::naked_asm!("mov x1, x30", "b {f}", f = sym malloc_from)
}

/// `calloc(3)`: [`calloc_from`] with the caller's address.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    core::arch::naked_asm!("mov x2, x30", "b {f}", f = sym calloc_from)
}

/// `realloc(3)`: [`realloc_from`] with the caller's address.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    core::arch::naked_asm!("mov x2, x30", "b {f}", f = sym realloc_from)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("the preload library's allocator trampolines exist for x86-64 and AArch64 only");

/// `malloc(3)`, called from `caller` (the trampoline above exports it as `malloc`).
pub(crate) unsafe extern "C" fn malloc_from(size: usize, caller: usize) -> *mut c_void {
    if real::resolving() {
        return real::boot_alloc(size, false);
    }
    if let Some(p) = from_reserve(size, 16, false, caller) {
        return p;
    }
    if managed_allocations() && !loader::is_loader(caller) {
        let p = heap::alloc(size, 16);
        if p.is_null() {
            set_errno(libc::ENOMEM);
        }
        return p;
    }
    // SAFETY: forwarding.
    unsafe { real::malloc(size) }
}

/// `free(3)`.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() || real::is_boot(p) {
        return;
    }
    if reserve::contains(p as usize) {
        // SAFETY: a pointer in the reserve's window is one reserve::alloc returned.
        unsafe { reserve::free(p) };
        return;
    }
    if arena::contains(p as usize) {
        // SAFETY: a managed pointer is one heap::alloc returned (the caller's contract for free).
        unsafe { heap::free(p) }
    } else {
        // SAFETY: not managed, so it came from the C library.
        unsafe { real::free(p) }
    }
}

/// `calloc(3)`, called from `caller` (the trampoline above exports it as `calloc`).
pub(crate) unsafe extern "C" fn calloc_from(n: usize, size: usize, caller: usize) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    if real::resolving() {
        return real::boot_alloc(total, true);
    }
    if let Some(p) = from_reserve(total, 16, true, caller) {
        return p;
    }
    if managed_allocations() && !loader::is_loader(caller) {
        let p = heap::alloc_zeroed(total);
        if p.is_null() {
            set_errno(libc::ENOMEM);
        }
        return p;
    }
    // SAFETY: forwarding.
    unsafe { real::calloc(n, size) }
}

/// `realloc(3)`, called from `caller` (the trampoline above exports it as `realloc`). A
/// block keeps the memory it was made in (managed or not), except that the dynamic linker's
/// requests never move a block into managed memory.
pub(crate) unsafe extern "C" fn realloc_from(
    p: *mut c_void,
    size: usize,
    caller: usize,
) -> *mut c_void {
    if p.is_null() {
        // SAFETY: realloc(NULL, n) is malloc(n).
        return unsafe { malloc_from(size, caller) };
    }
    if real::is_boot(p) {
        // SAFETY: copy out of the bootstrap buffer (its blocks are at most the buffer's size).
        unsafe {
            let n = malloc_from(size, caller);
            if !n.is_null() {
                std::ptr::copy_nonoverlapping(p as *const u8, n as *mut u8, size);
            }
            return n;
        }
    }
    if reserve::contains(p as usize) {
        // SAFETY: a live block of the reserve.
        let old = unsafe { reserve::size_of(p) };
        if size <= old && size > old / 2 {
            reserve::note_realloc(old, size, None);
            return p;
        }
        // SAFETY: a new block from wherever malloc serves it; the old one is copied and freed.
        unsafe {
            let n = malloc_from(size, caller);
            if !n.is_null() {
                std::ptr::copy_nonoverlapping(p as *const u8, n as *mut u8, old.min(size));
                reserve::free(p);
                reserve::note_realloc(old, size, Some(old.min(size)));
            }
            return n;
        }
    }
    if !arena::contains(p as usize) {
        // SAFETY: a C-library block stays with the C library.
        return unsafe { real::realloc(p, size) };
    }
    // SAFETY: `p` is a live managed block.
    let old = unsafe { heap::size_of(p) };
    if size <= old && size > old / 2 {
        return p;
    }
    let n = heap::alloc(size, 16);
    if n.is_null() {
        set_errno(libc::ENOMEM);
        return n;
    }
    // SAFETY: both blocks are live and at least min(old, size) long; then the old one is freed.
    unsafe {
        std::ptr::copy_nonoverlapping(p as *const u8, n as *mut u8, old.min(size));
        if size > old {
            heap::free_outgrown(p);
        } else {
            heap::free(p);
        }
    }
    n
}

/// `reallocarray(3)`.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: forwarding.
        Some(total) => unsafe { realloc_from(p, total, 0) },
        None => {
            set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

fn aligned(align: usize, size: usize) -> *mut c_void {
    if let Some(p) = from_reserve(size, align, false, 0) {
        return p;
    }
    if managed_allocations() {
        return heap::alloc(size, align);
    }
    // SAFETY: forwarding.
    unsafe { real::memalign(align, size) }
}

/// `posix_memalign(3)`.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<usize>()) {
        return libc::EINVAL;
    }
    let p = aligned(align, size);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller passes a valid out pointer.
    unsafe { *out = p };
    0
}

/// The alignment `memalign` and `aligned_alloc` serve for `align`, as the C library of this
/// system (glibc 2.36) does: rounded up to a power of two, `EINVAL` past the largest. Until
/// 2026-11-28 a non-power of two got `EINVAL` here, where the program got memory without
/// gleaner.
fn memalign_alignment(align: usize) -> Option<usize> {
    align.max(1).checked_next_power_of_two()
}

/// `aligned_alloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    // SAFETY: the same contract.
    unsafe { memalign(align, size) }
}

/// `memalign(3)`.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    let Some(align) = memalign_alignment(align) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    aligned(align, size)
}

/// `valloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    aligned(PAGE_SIZE, size)
}

/// `pvalloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    aligned(PAGE_SIZE, size.div_ceil(PAGE_SIZE).max(1) * PAGE_SIZE)
}

/// `malloc_usable_size(3)`.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    if p.is_null() || real::is_boot(p) {
        return 0;
    }
    if reserve::contains(p as usize) {
        // SAFETY: a live block of the reserve.
        return unsafe { reserve::size_of(p) };
    }
    if arena::contains(p as usize) {
        // SAFETY: a live managed block.
        unsafe { heap::size_of(p) }
    } else {
        // SAFETY: a C-library block.
        unsafe { real::usable_size(p) }
    }
}

/// Whether a mapping request can be served from the arena: private, anonymous, no fixed address,
/// and no promise about where it lies (`MAP_32BIT`: the first 2 GiB, where JITs keep pointers in
/// 32 bits; the arena lies far above, and such a mapping was handed an address above 4 GiB
/// until 2026-11-28).
fn manageable(flags: i32, fd: i32) -> bool {
    let unsupported = libc::MAP_SHARED
        | libc::MAP_FIXED
        | libc::MAP_FIXED_NOREPLACE
        | libc::MAP_HUGETLB
        | libc::MAP_GROWSDOWN
        | libc::MAP_STACK
        | libc::MAP_32BIT;
    flags & libc::MAP_ANONYMOUS != 0
        && flags & libc::MAP_PRIVATE != 0
        && flags & unsupported == 0
        && fd == -1
}

/// `mmap(2)`: private anonymous mappings come from the arena.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: i32,
    flags: i32,
    fd: i32,
    off: i64,
) -> *mut c_void {
    if len > 0 && managed_allocations() {
        let a = arena::get().expect("checked");
        if manageable(flags, fd) {
            if let Some(p) = a.carve(len) {
                let rw = libc::PROT_READ | libc::PROT_WRITE;
                if prot != rw {
                    // SAFETY: changing protection of arena pages just carved for this caller.
                    unsafe { real::mprotect(p as *mut c_void, len, prot) };
                }
                return p as *mut c_void;
            }
            // Arena exhausted: fall through to an ordinary (local) mapping.
        } else if flags & libc::MAP_FIXED != 0
            && (addr as usize).is_multiple_of(PAGE_SIZE)
            && arena::contains(addr as usize)
            && arena::contains(addr as usize + len - 1)
        {
            let len = len.div_ceil(PAGE_SIZE) * PAGE_SIZE;
            if flags & libc::MAP_ANONYMOUS != 0 && flags & libc::MAP_SHARED == 0 {
                // A fixed anonymous mapping over managed memory: fresh zero pages in place,
                // without the old mapping's advice.
                a.discard(addr as usize, len);
                a.advise_fork(addr as usize, len, false);
                // SAFETY: protection change on arena pages the caller owns.
                unsafe { real::mprotect(addr, len, prot) };
                return addr;
            }
            // A file or shared mapping over managed memory (the JVM maps its class-data
            // archive into space it reserved so): the pager gives the pages up and the kernel's
            // mapping replaces them, until the program unmaps it.
            a.surrender(addr as usize, len);
            // SAFETY: forwarding to the system call, over pages the pager no longer touches.
            let p = unsafe { real::mmap(addr, len, prot, flags, fd, off) };
            if p == libc::MAP_FAILED {
                // Nothing was mapped: the pages are the region's again.
                // SAFETY: __errno_location returns this thread's errno slot.
                let errno = unsafe { *libc::__errno_location() };
                a.discard(addr as usize, len);
                set_errno(errno);
            }
            return p;
        }
    }
    // SAFETY: forwarding to the system call.
    unsafe { real::mmap(addr, len, prot, flags, fd, off) }
}

/// `mmap64` (the same as `mmap` on 64-bit Linux).
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: i32,
    flags: i32,
    fd: i32,
    off: i64,
) -> *mut c_void {
    // SAFETY: forwarding.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// `munmap(2)`: managed ranges are discarded and returned to the arena.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> i32 {
    if arena::contains(addr as usize) {
        if !(addr as usize).is_multiple_of(PAGE_SIZE) {
            set_errno(libc::EINVAL);
            return -1;
        }
        let a = arena::get().expect("contains implies installed");
        let len = len.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        a.release(addr as usize, len);
        // Leave the range readable and writable for its next user.
        // SAFETY: protection change on arena pages the caller gave back.
        unsafe { real::mprotect(addr, len, libc::PROT_READ | libc::PROT_WRITE) };
        return 0;
    }
    // SAFETY: forwarding.
    unsafe { real::munmap(addr, len) }
}

/// `madvise(2)`: discarding advice on managed memory goes through the pager, and
/// `MADV_WIPEONFORK`/`MADV_KEEPONFORK` are kept for fork children (`wipe.rs`); other advice on
/// managed memory is accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: usize, advice: i32) -> i32 {
    if arena::contains(addr as usize) {
        if !(addr as usize).is_multiple_of(PAGE_SIZE) {
            set_errno(libc::EINVAL);
            return -1;
        }
        let a = arena::get().expect("contains implies installed");
        let len = len.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let managed = |at: usize, len: usize| match advice {
            libc::MADV_DONTNEED | libc::MADV_FREE | libc::MADV_REMOVE => a.discard(at, len),
            libc::MADV_WIPEONFORK => a.advise_fork(at, len, true),
            libc::MADV_KEEPONFORK => a.advise_fork(at, len, false),
            _ => {}
        };
        if !a.any_surrendered(addr as usize, len) {
            managed(addr as usize, len);
            return 0;
        }
        // Runs of the program's own mappings (placed over managed memory) get the advice as
        // the kernel takes it; managed runs as above.
        let (mut at, end) = (addr as usize, addr as usize + len);
        while at < end {
            let foreign = a.is_surrendered(at);
            let mut run_end = at + PAGE_SIZE;
            while run_end < end && a.is_surrendered(run_end) == foreign {
                run_end += PAGE_SIZE;
            }
            if foreign {
                // SAFETY: forwarding to the system call for the program's own mapping.
                let r = unsafe { real::madvise(at as *mut c_void, run_end - at, advice) };
                if r != 0 {
                    return r;
                }
            } else {
                managed(at, run_end - at);
            }
            at = run_end;
        }
        return 0;
    }
    // SAFETY: forwarding.
    unsafe { real::madvise(addr, len, advice) }
}

/// `mremap(2)`: managed ranges grow in place when the pages after them are free, else move
/// (copying their contents); shrinking releases the tail.
///
/// C declares `mremap` variadic; stable Rust cannot define one. On x86-64 (and arm64) a variadic
/// call passes its arguments in the same registers as a fixed one, so the fifth parameter holds
/// the caller's `new_address` when it passed one, and is read only when `MREMAP_FIXED` says so.
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: i32,
    fifth: *mut c_void,
) -> *mut c_void {
    let new_addr: *mut c_void = if flags & libc::MREMAP_FIXED != 0 {
        fifth
    } else {
        std::ptr::null_mut()
    };
    if !arena::contains(old as usize) {
        // SAFETY: forwarding.
        return unsafe { real::mremap(old, old_len, new_len, flags, new_addr) };
    }
    let a = arena::get().expect("contains implies installed");
    let (old_p, new_p) = (
        old_len.div_ceil(PAGE_SIZE) * PAGE_SIZE,
        new_len.div_ceil(PAGE_SIZE) * PAGE_SIZE,
    );
    if !(old as usize).is_multiple_of(PAGE_SIZE) || new_len == 0 || flags & libc::MREMAP_FIXED != 0
    {
        set_errno(libc::EINVAL);
        return libc::MAP_FAILED;
    }
    if a.any_surrendered(old as usize, old_len.div_ceil(PAGE_SIZE) * PAGE_SIZE) {
        // A file or shared mapping the program placed inside managed memory cannot be moved
        // out of it here (docs/compatibility.md).
        log::warn!(
            "mremap of a file or shared mapping placed inside far memory is not supported; \
             the program gets EINVAL"
        );
        set_errno(libc::EINVAL);
        return libc::MAP_FAILED;
    }
    if new_p <= old_p {
        if new_p < old_p {
            a.release(old as usize + new_p, old_p - new_p);
        }
        return old;
    }
    if a.grow_in_place(old as usize, old_p, new_p) {
        a.grow_fork_advice(old as usize, old_p, new_p);
        return old;
    }
    if flags & libc::MREMAP_MAYMOVE == 0 {
        set_errno(libc::ENOMEM);
        return libc::MAP_FAILED;
    }
    let Some(new) = a.carve(new_p) else {
        set_errno(libc::ENOMEM);
        return libc::MAP_FAILED;
    };
    // SAFETY: both ranges are managed and owned by the caller; they do not overlap. The copy runs
    // on this application thread, so faults on either range are served normally.
    unsafe { std::ptr::copy_nonoverlapping(old as *const u8, new as *mut u8, old_p) };
    a.move_fork_advice(old as usize, old_p, new);
    a.release(old as usize, old_p);
    new as *mut c_void
}

/// `_exit(2)`: a fork child that runs a pager writes its stats first, as a process does in
/// `exit` through `atexit` (`crate::finish_fork_child`): fork children end this way (redis's
/// BGSAVE child, for one), and their work belongs in the run's totals. Then the process ends as
/// the C library's `_exit` would end it. The process that started the pager writes none here, as
/// before: `_exit` is the exit a signal handler may call, and the stats take locks.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: i32) -> ! {
    crate::finish_fork_child();
    gleaner_pager::exit_now(status)
}

/// `_Exit(3)`: the same as `_exit`.
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: i32) -> ! {
    crate::finish_fork_child();
    gleaner_pager::exit_now(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memalign_rounds_an_alignment_up_to_a_power_of_two_as_glibc_does() {
        assert_eq!(memalign_alignment(3), Some(4));
        assert_eq!(memalign_alignment(24), Some(32));
        assert_eq!(memalign_alignment(4096), Some(4096));
        assert_eq!(memalign_alignment(0), Some(1));
        assert_eq!(memalign_alignment(usize::MAX), None);
    }
}
