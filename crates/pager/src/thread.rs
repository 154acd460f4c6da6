//! Starting the pager's threads with `pthread_create` directly.
//!
//! `std::thread::spawn` runs standard-library code on the new thread before the closure (it sets
//! up thread-locals, which registers destructors through the C library, which calls `calloc`).
//! Under `LD_PRELOAD` that `calloc` is the interposed one, and a pager thread must never allocate
//! from managed memory: it could fault on memory only it can serve. Starting the thread through
//! this trampoline runs the caller's start hook (which marks the thread as a runtime thread)
//! before any other code of the thread.
//!
//! Each thread starts with every signal blocked (the C library keeps the two it needs for itself
//! deliverable): a signal sent to the process goes to a thread that does not block it, and the
//! program's handler must never run on a pager thread, where its first touch of a far page
//! could wait for the thread itself.
//!
//! Each thread gets a stack of its own mapping, not one from the C library's cache: reusing a
//! cached stack makes `pthread_create` free the thread-local storage of the thread that last
//! used it, and in a fork child that storage (allocated by a program thread that does not exist
//! there) may be a far page, which only the threads being started could fetch.

use std::ffi::{c_void, CString};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::fatal::fatal;

/// A running pager thread; join it with [`PagerThread::join`].
pub(crate) struct PagerThread {
    id: libc::pthread_t,
    stack: Stack,
    /// Set once the thread runs gleaner's code (the C library's thread start-up is done).
    running: Arc<AtomicBool>,
}

/// Bytes of a pager thread's stack (address space; touched as used).
const STACK_BYTES: usize = 8 << 20;

/// A thread stack: a private mapping with a guard page at its low end.
struct Stack {
    addr: *mut c_void,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; moving it between threads is fine.
unsafe impl Send for Stack {}

impl Stack {
    fn new() -> io::Result<Stack> {
        let len = STACK_BYTES + crate::PAGE_SIZE;
        // SAFETY: a fresh private anonymous mapping with no address hint; checked below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Stack { addr, len };
        // SAFETY: the lowest page of the mapping just made: the guard against overflow.
        if unsafe { libc::mprotect(addr, crate::PAGE_SIZE, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `new`, once, after its thread ended (or
        // never started).
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

struct Start {
    running: Arc<AtomicBool>,
    hook: Option<fn()>,
    name: CString,
    body: Box<dyn FnOnce() + Send>,
}

extern "C" fn trampoline(arg: *mut c_void) -> *mut c_void {
    // SAFETY: `arg` is the Box<Start> that `spawn` leaked for exactly this thread.
    let start = unsafe { Box::from_raw(arg.cast::<Start>()) };
    if let Some(hook) = start.hook {
        hook();
    }
    start.running.store(true, Ordering::Release);
    // SAFETY: naming the calling thread with a NUL-terminated string of at most 15 bytes.
    unsafe { libc::pthread_setname_np(libc::pthread_self(), start.name.as_ptr()) };
    let body = start.body;
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).is_err() {
        fatal("a pager thread panicked");
    }
    std::ptr::null_mut()
}

/// Starts `body` on a new thread named `name` (cut to 15 bytes), running `hook` first.
pub(crate) fn spawn(
    name: &str,
    hook: Option<fn()>,
    body: impl FnOnce() + Send + 'static,
) -> io::Result<PagerThread> {
    let name = CString::new(&name.as_bytes()[..name.len().min(15)])
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "thread name has a NUL"))?;
    let running = Arc::new(AtomicBool::new(false));
    let start = Box::into_raw(Box::new(Start {
        running: running.clone(),
        hook,
        name,
        body: Box::new(body),
    }));
    let stack = Stack::new().inspect_err(|_| {
        // SAFETY: no thread was started, so the Box is still ours.
        drop(unsafe { Box::from_raw(start) });
    })?;
    let mut id: libc::pthread_t = 0;
    // SAFETY: attributes initialised, given the stack (usable from above its guard page) and
    // destroyed before returning; the trampoline takes ownership of `start` if the thread starts.
    // The new thread inherits the calling thread's signal mask: every signal is blocked for the
    // call, and the caller's mask put back after it.
    let rc = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut caller: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut caller);
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        let rc = libc::pthread_attr_setstack(
            &mut attr,
            stack.addr.cast::<u8>().add(crate::PAGE_SIZE).cast(),
            STACK_BYTES,
        );
        let rc = if rc == 0 {
            libc::pthread_create(&mut id, &attr, trampoline, start.cast())
        } else {
            rc
        };
        libc::pthread_attr_destroy(&mut attr);
        libc::pthread_sigmask(libc::SIG_SETMASK, &caller, std::ptr::null_mut());
        rc
    };
    if rc != 0 {
        // SAFETY: the thread did not start, so the Box is still ours.
        drop(unsafe { Box::from_raw(start) });
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(PagerThread { id, stack, running })
}

impl PagerThread {
    /// Whether the thread has come through the C library's start-up and runs gleaner's code.
    pub(crate) fn is_running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// Waits for the thread to finish.
    pub(crate) fn join(self) {
        // SAFETY: `id` is a joinable thread started by `spawn`, joined once (self is consumed).
        unsafe { libc::pthread_join(self.id, std::ptr::null_mut()) };
        // The thread is gone: its stack is unmapped with `self.stack`.
        drop(self.stack);
    }
}
