//! The dynamic linker's own allocations stay out of managed memory.
//!
//! The dynamic linker (`ld.so`) allocates through the program's `malloc`, `calloc` and `realloc`
//! (the interposed ones, since this library comes first): the record of every module loaded
//! with `dlopen` (its `link_map`), the lists that index the modules with thread-local storage
//! (TLS), every thread's table of TLS blocks (its DTV) and the blocks themselves. Pager threads
//! read those records without knowing it:
//!
//! * this library's thread-local variables are reached through `__tls_get_addr` (a shared
//!   library's TLS model), which, once a `dlopen` has added a module with TLS, walks the lists
//!   and the new modules' records before it answers;
//! * `pthread_create` reads every TLS module's record to lay out the new thread's TLS.
//!
//! Were those records in managed memory, a pager thread could fault on a far page that only the
//! pager's threads can fetch, and the process would hang: a fork child starting its pager
//! (CPython's `test_random.test_after_fork`, after enough extension modules had loaded), or any
//! process whose fault handlers touch TLS after a `dlopen` while the records are far.
//!
//! So the three allocation entry points learn their caller: each is a two-instruction trampoline
//! (`interpose.rs`) that passes its return address on to the allocator, which serves a request
//! from the dynamic linker's code ([`is_loader`]) from the C library's heap, as it serves
//! gleaner's own runtime. The cost is two comparisons per allocation. What moves out of managed
//! memory is bookkeeping (a module record is about a kilobyte) and the TLS blocks of modules
//! loaded with `dlopen`, which are per-thread memory like the threads' stacks, which are not
//! managed either.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The dynamic linker's executable code: `[LO, HI)` (empty until [`locate`] found it).
static LO: AtomicUsize = AtomicUsize::new(0);
static HI: AtomicUsize = AtomicUsize::new(0);

/// Finds the dynamic linker's code in this process: the executable segments of the object
/// loaded at the auxiliary vector's `AT_BASE`. Call before managed memory exists. Returns
/// whether it was found (a program started as `ld.so PROGRAM`, or linked statically, has no
/// separate interpreter; its loader's allocations then stay in managed memory, as before).
pub(crate) fn locate() -> bool {
    // SAFETY: getauxval reads the process's auxiliary vector; 0 when the entry is absent.
    let base = unsafe { libc::getauxval(libc::AT_BASE) } as usize;
    if base == 0 {
        return false;
    }
    let ehdr = base as *const libc::Elf64_Ehdr;
    // SAFETY: AT_BASE is where the kernel mapped the interpreter's ELF file, whose first
    // PT_LOAD segment (read-only, mapped for the life of the process) starts with its ELF
    // header; the magic is checked before anything else is read.
    let (magic, phoff, phnum, phentsize) = unsafe {
        let ehdr = &*ehdr;
        (
            ehdr.e_ident[..4] == *b"\x7fELF",
            ehdr.e_phoff as usize,
            ehdr.e_phnum as usize,
            ehdr.e_phentsize as usize,
        )
    };
    if !magic || phentsize != std::mem::size_of::<libc::Elf64_Phdr>() {
        return false;
    }
    let (mut lo, mut hi) = (usize::MAX, 0);
    for i in 0..phnum {
        // SAFETY: the program headers lie in the same first segment (ld.so's are at offset
        // 64), `phnum` entries of the checked size.
        let ph = unsafe { &*((base + phoff + i * phentsize) as *const libc::Elf64_Phdr) };
        if ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_X != 0 {
            let start = base + ph.p_vaddr as usize;
            lo = lo.min(start);
            hi = hi.max(start + ph.p_memsz as usize);
        }
    }
    if lo >= hi {
        return false;
    }
    LO.store(lo, Ordering::Relaxed);
    HI.store(hi, Ordering::Relaxed);
    true
}

/// Whether `caller` (a return address) lies in the dynamic linker's code.
#[inline]
pub(crate) fn is_loader(caller: usize) -> bool {
    let lo = LO.load(Ordering::Relaxed);
    caller.wrapping_sub(lo) < HI.load(Ordering::Relaxed).wrapping_sub(lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dynamic_linkers_code_is_found_and_only_it_counts_as_the_loader() {
        assert!(
            locate(),
            "AT_BASE names the interpreter of a dynamically linked test"
        );
        let (lo, hi) = (LO.load(Ordering::Relaxed), HI.load(Ordering::Relaxed));
        assert!(lo < hi && hi - lo < 64 << 20, "{lo:#x}..{hi:#x}");
        // `__tls_get_addr` is the dynamic linker's own function.
        // SAFETY: dlsym with a NUL-terminated name.
        let tls = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__tls_get_addr".as_ptr()) };
        assert!(!tls.is_null());
        assert!(
            is_loader(tls as usize),
            "__tls_get_addr at {tls:p} is in ld.so's code"
        );
        assert!(
            !is_loader(is_loader as *const () as usize),
            "this library is not the loader"
        );
        assert!(
            !is_loader(libc::malloc as *const () as usize),
            "nor is the C library"
        );
        assert!(!is_loader(0) && !is_loader(usize::MAX));
    }
}
