//! Arguments that C callers pass to gleaner's C APIs (`libgleaner.so`, `libgleaner_soft.so`).

use std::ffi::{c_char, CStr};

/// An optional string argument: NULL is `None`; otherwise the string, which must be UTF-8.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string valid for the duration of the call.
pub unsafe fn opt_str(p: *const c_char) -> Result<Option<String>, String> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller guarantees a valid NUL-terminated string.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(|s| Some(s.to_string()))
        .map_err(|_| "a string argument is not valid UTF-8".to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn null_is_none_a_string_is_itself_and_bad_utf8_is_an_error() {
        // SAFETY: NULL, and NUL-terminated literals.
        unsafe {
            assert_eq!(super::opt_str(std::ptr::null()), Ok(None));
            assert_eq!(
                super::opt_str(c"unix:/x".as_ptr()),
                Ok(Some("unix:/x".into()))
            );
            assert!(super::opt_str(c"\xff\xfe".as_ptr())
                .unwrap_err()
                .contains("UTF-8"));
        }
    }
}
