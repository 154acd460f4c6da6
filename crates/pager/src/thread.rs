//! Starting the pager's threads with `pthread_create` directly.
//!
//! `std::thread::spawn` runs standard-library code on the new thread before the closure (it sets
//! up thread-locals, which registers destructors through the C library, which calls `calloc`).
//! Under `LD_PRELOAD` that `calloc` is the interposed one, and a pager thread must never allocate
//! from managed memory: it could fault on memory only it can serve. Starting the thread through
//! this trampoline runs the caller's start hook (which marks the thread as a runtime thread)
//! before any other code of the thread.

use std::ffi::{c_void, CString};
use std::io;

use crate::fatal::fatal;

/// A running pager thread; join it with [`PagerThread::join`].
pub(crate) struct PagerThread {
    id: libc::pthread_t,
}

struct Start {
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
    let start = Box::into_raw(Box::new(Start {
        hook,
        name,
        body: Box::new(body),
    }));
    let mut id: libc::pthread_t = 0;
    // SAFETY: default attributes; the trampoline takes ownership of `start` if the thread starts.
    let rc = unsafe { libc::pthread_create(&mut id, std::ptr::null(), trampoline, start.cast()) };
    if rc != 0 {
        // SAFETY: the thread did not start, so the Box is still ours.
        drop(unsafe { Box::from_raw(start) });
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(PagerThread { id })
}

impl PagerThread {
    /// Waits for the thread to finish.
    pub(crate) fn join(self) {
        // SAFETY: `id` is a joinable thread started by `spawn`, joined once (self is consumed).
        unsafe { libc::pthread_join(self.id, std::ptr::null_mut()) };
    }
}
