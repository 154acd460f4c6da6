//! The C API (`include/gleaner.h`): far-memory regions for C and C++ programs.
#![deny(missing_docs)]

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CString};
use std::path::PathBuf;

use gleaner_pager::{Region, RegionConfig};
use gleaner_sys::ffi::opt_str;

/// An opaque region handle for C.
pub struct GleanerRegion(Region);

thread_local! {
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

fn set_error(msg: String) {
    let c = CString::new(msg.replace('\0', " ")).expect("no interior NUL");
    LAST_ERROR.with(|e| *e.borrow_mut() = Some(c));
}

/// See `gleaner_region_create` in `include/gleaner.h`.
///
/// # Safety
/// `memnode` and `token_file` are NULL or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn gleaner_region_create(
    size: usize,
    local_budget: usize,
    memnode: *const c_char,
    token_file: *const c_char,
) -> *mut GleanerRegion {
    // The region's threads are the library's: a panic on one ends the program.
    gleaner_sys::panic::abort_on_panic();
    let build = || -> Result<Region, String> {
        let mut cfg = RegionConfig::new(size, local_budget);
        // SAFETY: forwarded from this function's contract.
        if let Some(addr) = unsafe { opt_str(memnode) }? {
            // SAFETY: as above.
            let token = unsafe { opt_str(token_file) }?.map(PathBuf::from);
            cfg = cfg.with_memnodes(&addr, token, None)?;
        }
        Region::new(cfg).map_err(|e| e.to_string())
    };
    match build() {
        Ok(r) => Box::into_raw(Box::new(GleanerRegion(r))),
        Err(e) => {
            set_error(e);
            std::ptr::null_mut()
        }
    }
}

/// See `gleaner_region_addr`.
///
/// # Safety
/// `region` was returned by `gleaner_region_create` and not yet destroyed.
#[no_mangle]
pub unsafe extern "C" fn gleaner_region_addr(region: *const GleanerRegion) -> *mut c_void {
    // SAFETY: the caller passes a live handle.
    unsafe { &*region }.0.as_ptr().cast()
}

/// See `gleaner_region_size`.
///
/// # Safety
/// `region` was returned by `gleaner_region_create` and not yet destroyed.
#[no_mangle]
pub unsafe extern "C" fn gleaner_region_size(region: *const GleanerRegion) -> usize {
    // SAFETY: the caller passes a live handle.
    unsafe { &*region }.0.len()
}

/// See `gleaner_region_prefetch`.
///
/// # Safety
/// `region` was returned by `gleaner_region_create` and not yet destroyed.
#[no_mangle]
pub unsafe extern "C" fn gleaner_region_prefetch(
    region: *const GleanerRegion,
    offset: usize,
    len: usize,
) {
    // SAFETY: the caller passes a live handle.
    unsafe { &*region }.0.prefetch_hint(offset, len)
}

/// See `gleaner_region_stats_json`.
///
/// # Safety
/// `region` was returned by `gleaner_region_create` and not yet destroyed.
#[no_mangle]
pub unsafe extern "C" fn gleaner_region_stats_json(region: *const GleanerRegion) -> *mut c_char {
    // SAFETY: the caller passes a live handle.
    let json = unsafe { &*region }.0.stats_json();
    CString::new(json).expect("JSON has no NUL").into_raw()
}

/// See `gleaner_region_destroy`.
///
/// # Safety
/// `region` was returned by `gleaner_region_create` (or is NULL) and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn gleaner_region_destroy(region: *mut GleanerRegion) {
    if !region.is_null() {
        // SAFETY: the pointer came from Box::into_raw in gleaner_region_create.
        drop(unsafe { Box::from_raw(region) });
    }
}

/// See `gleaner_string_free`.
///
/// # Safety
/// `s` was returned by this library (or is NULL) and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn gleaner_string_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: the pointer came from CString::into_raw in this library.
        drop(unsafe { CString::from_raw(s) });
    }
}

/// See `gleaner_last_error`.
#[no_mangle]
pub extern "C" fn gleaner_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ref().map_or(std::ptr::null(), |c| c.as_ptr()))
}
