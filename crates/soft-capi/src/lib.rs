//! The C API of gleaner's soft memory (`include/gleaner_soft.h`, `libgleaner_soft.so`): pools
//! with a C reconstructor, soft pointers and a soft hash map, all reads returning copies.
//!
//! A separate library from `libgleaner.so` (the far-memory regions): a program that only
//! caches soft state links neither the pager nor userfaultfd code, and each library's ABI
//! moves on its own. Every function checks its pointers for NULL and reports failures through
//! `gleaner_soft_last_error`; the caller promises the rest (handles it got from this library,
//! buffers as long as it says).
#![deny(missing_docs)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CString};
use std::path::PathBuf;
use std::sync::Arc;

use gleaner_soft::{Pool, PoolConfig, SoftBox, SoftHashMap};
use gleaner_sys::ffi::opt_str;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(e: impl std::fmt::Display) {
    let s = CString::new(e.to_string().replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = s);
}

/// Pool settings (`gleaner_soft_config` in C).
#[repr(C)]
pub struct GleanerSoftConfig {
    /// Name for status output (NULL: "pool").
    pub name: *const c_char,
    /// Most bytes the pool can ever hold.
    pub capacity: u64,
    /// Grant without (or before) a daemon.
    pub limit: u64,
    /// Daemon socket: NULL runs alone; "" means the default socket.
    pub node_socket: *const c_char,
    /// Start a daemon if none answers.
    pub autostart: c_int,
    /// Weight in the daemon's allocation.
    pub weight: f64,
    /// Least bytes the daemon should leave.
    pub floor: u64,
    /// Most bytes the daemon may grant (0: capacity).
    pub ceiling: u64,
    /// Debug mode: every hit re-runs the reconstructor and compares.
    pub verify: c_int,
}

/// Counters (`gleaner_soft_stats` in C).
#[repr(C)]
#[derive(Default)]
pub struct GleanerSoftStats {
    /// Reads that hit.
    pub hits: u64,
    /// Reads that ran the reconstructor.
    pub misses: u64,
    /// Misses on recently evicted objects.
    pub victim_hits: u64,
    /// Nanoseconds in the reconstructor.
    pub rebuild_ns: u64,
    /// Reads caught racing a punch (turned into misses).
    pub torn_caught: u64,
    /// Debug mode: hits that differed from their reconstruction.
    pub verify_mismatches: u64,
    /// Bytes the pool's memfd holds now.
    pub resident_bytes: u64,
    /// The grant, bytes.
    pub limit: u64,
}

/// A C reconstructor: writes the value for `args` into `out` (capacity `cap`) and returns its
/// length; a length above `cap` asks to be called again with that capacity; -1: cannot rebuild.
pub type GleanerSoftRecon = extern "C" fn(
    ctx: *mut c_void,
    args: *const c_void,
    args_len: usize,
    out: *mut c_void,
    cap: usize,
) -> isize;

struct Ctx(*mut c_void);
// SAFETY: the C caller promises (gleaner_soft.h) that its reconstructor and context may be used
// from any thread, as the runtime calls it from whichever thread misses.
unsafe impl Send for Ctx {}
// SAFETY: as above.
unsafe impl Sync for Ctx {}

/// An opaque pool.
pub struct GleanerSoftPool(Pool);
/// An opaque soft pointer.
pub struct GleanerSoftPtr(SoftBox);
/// An opaque soft hash map.
pub struct GleanerSoftMap(SoftHashMap);

/// Fills `c` with the defaults.
///
/// # Safety
/// `c` is NULL or points to a writable `gleaner_soft_config`.
#[no_mangle]
pub unsafe extern "C" fn gleaner_soft_config_init(c: *mut GleanerSoftConfig) {
    let d = PoolConfig::default();
    if c.is_null() {
        return;
    }
    // SAFETY: non-NULL and writable by the caller's promise.
    unsafe {
        c.write(GleanerSoftConfig {
            name: std::ptr::null(),
            capacity: d.capacity,
            limit: d.limit,
            node_socket: std::ptr::null(),
            autostart: 0,
            weight: d.weight,
            floor: 0,
            ceiling: 0,
            verify: 0,
        })
    };
}

/// Creates a pool; NULL on failure (see `gleaner_soft_last_error`).
///
/// # Safety
/// `c` is NULL (defaults) or a valid config; its strings are NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn gleaner_soft_pool_create(
    c: *const GleanerSoftConfig,
    recon: Option<GleanerSoftRecon>,
    ctx: *mut c_void,
) -> *mut GleanerSoftPool {
    // The pool's threads are the library's: a panic on one ends the program.
    gleaner_sys::panic::abort_on_panic();
    let Some(recon) = recon else {
        set_error("gleaner_soft_pool_create: a reconstructor is required");
        return std::ptr::null_mut();
    };
    let mut cfg = PoolConfig::default();
    if !c.is_null() {
        // SAFETY: non-NULL and valid by the caller's promise.
        let c = unsafe { &*c };
        // SAFETY: the strings are NUL-terminated by the caller's promise.
        let (name, node) = match unsafe { (opt_str(c.name), opt_str(c.node_socket)) } {
            (Ok(n), Ok(s)) => (n, s),
            (Err(e), _) | (_, Err(e)) => {
                set_error(e);
                return std::ptr::null_mut();
            }
        };
        cfg.name = name.unwrap_or(cfg.name);
        cfg.capacity = c.capacity;
        cfg.limit = c.limit;
        cfg.node = node.map(|s| {
            if s.is_empty() {
                gleaner_node::client::default_socket()
            } else {
                PathBuf::from(s)
            }
        });
        cfg.autostart = c.autostart != 0;
        cfg.weight = c.weight;
        cfg.floor = c.floor;
        cfg.ceiling = c.ceiling;
        cfg.verify = c.verify != 0;
    }
    let ctx = Arc::new(Ctx(ctx));
    let f = move |args: &[u8]| -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 4096];
        for _ in 0..3 {
            let n = recon(
                ctx.0,
                args.as_ptr().cast(),
                args.len(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            );
            if n < 0 {
                return None;
            }
            let n = n as usize;
            if n <= buf.len() {
                buf.truncate(n);
                return Some(buf);
            }
            buf.resize(n, 0);
        }
        None
    };
    match Pool::new(cfg, Arc::new(f)) {
        Ok(p) => Box::into_raw(Box::new(GleanerSoftPool(p))),
        Err(e) => {
            set_error(format!("gleaner_soft_pool_create: {e}"));
            std::ptr::null_mut()
        }
    }
}

/// Destroys a pool (its pointers and maps must be freed first).
///
/// # Safety
/// `p` is NULL or a pool from `gleaner_soft_pool_create`, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn gleaner_soft_pool_destroy(p: *mut GleanerSoftPool) {
    if !p.is_null() {
        // SAFETY: from Box::into_raw, and the caller gives it up.
        drop(unsafe { Box::from_raw(p) });
    }
}

/// Sets the pool's grant (without a daemon; a daemon overrides it).
///
/// # Safety
/// `p` is a valid pool.
#[no_mangle]
pub unsafe extern "C" fn gleaner_soft_pool_set_limit(p: *const GleanerSoftPool, bytes: u64) {
    // SAFETY: valid by the caller's promise.
    if let Some(p) = unsafe { p.as_ref() } {
        p.0.set_limit(bytes);
    }
}

/// Fills `out` with the pool's counters; 0 on success, -1 on a NULL argument.
///
/// # Safety
/// `p` is a valid pool, `out` writable.
#[no_mangle]
pub unsafe extern "C" fn gleaner_soft_pool_stats(
    p: *const GleanerSoftPool,
    out: *mut GleanerSoftStats,
) -> c_int {
    // SAFETY: valid by the caller's promise.
    let Some(p) = (unsafe { p.as_ref() }) else {
        return -1;
    };
    if out.is_null() {
        return -1;
    }
    let s = p.0.stats();
    // SAFETY: non-NULL and writable by the caller's promise.
    unsafe {
        out.write(GleanerSoftStats {
            hits: s.hits,
            misses: s.misses,
            victim_hits: s.victim_hits,
            rebuild_ns: s.rebuild_ns,
            torn_caught: s.torn_caught,
            verify_mismatches: s.verify_mismatches,
            resident_bytes: p.0.resident_bytes(),
            limit: s.limit,
        })
    };
    0
}

/// A new soft pointer in `p` (empty: its first read reconstructs).
///
/// # Safety
/// `p` is a valid pool.
#[no_mangle]
pub unsafe extern "C" fn gleaner_soft_alloc(p: *const GleanerSoftPool) -> *mut GleanerSoftPtr {
    // SAFETY: valid by the caller's promise.
    match unsafe { p.as_ref() } {
        Some(p) => Box::into_raw(Box::new(GleanerSoftPtr(p.0.new_unique()))),
        None => {
            set_error("gleaner_soft_alloc: NULL pool");
            std::ptr::null_mut()
        }
    }
}

/// Frees a soft pointer.
///
/// # Safety
/// `o` is NULL or from `gleaner_soft_alloc`, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn gleaner_soft_free(o: *mut GleanerSoftPtr) {
    if !o.is_null() {
        // SAFETY: from Box::into_raw, and the caller gives it up.
        drop(unsafe { Box::from_raw(o) });
    }
}

/// Copies `v` into `buf` (at most `cap` bytes) and returns its full length.
unsafe fn copy_out(v: &[u8], buf: *mut c_void, cap: usize) -> isize {
    let n = v.len().min(cap);
    if n > 0 && !buf.is_null() {
        // SAFETY: `buf` holds `cap` >= `n` writable bytes by the caller's promise.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), buf.cast::<u8>(), n) };
    }
    v.len() as isize
}

unsafe fn bytes<'a>(p: *const c_void, len: usize) -> &'a [u8] {
    if p.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: `len` readable bytes at `p` by the caller's promise.
        unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }
    }
}

/// Reads a copy of the object into `buf` (up to `cap` bytes); returns the value's length (more
/// than `cap`: the copy was cut short), -1 if it could not be rebuilt.
///
/// # Safety
/// `o` valid; `args` holds `args_len` bytes; `buf` holds `cap` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn gleaner_soft_read(
    o: *const GleanerSoftPtr,
    args: *const c_void,
    args_len: usize,
    buf: *mut c_void,
    cap: usize,
) -> isize {
    // SAFETY: valid by the caller's promise.
    let Some(o) = (unsafe { o.as_ref() }) else {
        return -1;
    };
    // SAFETY: as promised for `args`.
    let args = unsafe { bytes(args, args_len) };
    match o.0.read(args) {
        // SAFETY: as promised for `buf`.
        Some(v) => unsafe { copy_out(&v, buf, cap) },
        None => {
            set_error("gleaner_soft_read: the reconstructor gave nothing");
            -1
        }
    }
}

/// Writes `len` bytes as the object's value; 1 if it is cached, 0 if the grant had no room.
///
/// # Safety
/// `o` valid; `data` holds `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn gleaner_soft_write(
    o: *const GleanerSoftPtr,
    data: *const c_void,
    len: usize,
) -> c_int {
    // SAFETY: valid by the caller's promise.
    let Some(o) = (unsafe { o.as_ref() }) else {
        return -1;
    };
    // SAFETY: as promised for `data`.
    c_int::from(o.0.write(unsafe { bytes(data, len) }))
}

/// 1 if the object is in soft memory now, else 0.
///
/// # Safety
/// `o` valid.
#[no_mangle]
pub unsafe extern "C" fn gleaner_soft_present(o: *const GleanerSoftPtr) -> c_int {
    // SAFETY: valid by the caller's promise.
    unsafe { o.as_ref() }.map_or(0, |o| c_int::from(o.0.is_present()))
}

/// A soft hash map over `p` (misses call the pool's reconstructor with the key).
///
/// # Safety
/// `p` valid.
#[no_mangle]
pub unsafe extern "C" fn gleaner_soft_map_create(p: *const GleanerSoftPool) -> *mut GleanerSoftMap {
    // SAFETY: valid by the caller's promise.
    match unsafe { p.as_ref() } {
        Some(p) => Box::into_raw(Box::new(GleanerSoftMap(SoftHashMap::new(&p.0)))),
        None => {
            set_error("gleaner_soft_map_create: NULL pool");
            std::ptr::null_mut()
        }
    }
}

/// Destroys a map.
///
/// # Safety
/// `m` NULL or from `gleaner_soft_map_create`, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn gleaner_soft_map_destroy(m: *mut GleanerSoftMap) {
    if !m.is_null() {
        // SAFETY: from Box::into_raw, and the caller gives it up.
        drop(unsafe { Box::from_raw(m) });
    }
}

/// Copies the value of `key` into `buf`; returns its length (see `gleaner_soft_read`).
///
/// # Safety
/// `m` valid; `key` holds `klen` bytes; `buf` holds `cap` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn gleaner_soft_map_get(
    m: *const GleanerSoftMap,
    key: *const c_void,
    klen: usize,
    buf: *mut c_void,
    cap: usize,
) -> isize {
    // SAFETY: valid by the caller's promise.
    let Some(m) = (unsafe { m.as_ref() }) else {
        return -1;
    };
    // SAFETY: as promised for `key`.
    match m.0.get(unsafe { bytes(key, klen) }) {
        // SAFETY: as promised for `buf`.
        Some(v) => unsafe { copy_out(&v, buf, cap) },
        None => {
            set_error("gleaner_soft_map_get: the reconstructor gave nothing");
            -1
        }
    }
}

/// Sets `key`'s value; 1 if cached, 0 if no room.
///
/// # Safety
/// `m` valid; `key`/`val` hold `klen`/`vlen` bytes.
#[no_mangle]
pub unsafe extern "C" fn gleaner_soft_map_put(
    m: *const GleanerSoftMap,
    key: *const c_void,
    klen: usize,
    val: *const c_void,
    vlen: usize,
) -> c_int {
    // SAFETY: valid by the caller's promise.
    let Some(m) = (unsafe { m.as_ref() }) else {
        return -1;
    };
    // SAFETY: as promised for `key` and `val`.
    c_int::from(m.0.insert(unsafe { bytes(key, klen) }, unsafe { bytes(val, vlen) }))
}

/// The calling thread's last error message (valid until its next failing call).
#[no_mangle]
pub extern "C" fn gleaner_soft_last_error() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}
