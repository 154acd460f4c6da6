//! Reading `/proc` from the pager's threads while the program runs.
//!
//! Each file or directory the pager opens there sits for a moment at the lowest free descriptor
//! number, which may be one the program just closed and is about to fill with `dup2`: so each
//! is opened inside a `gleaner_fds::making` window (a file: `gleaner_fds::read_to_string`), and
//! a directory is opened held (moved out of the program's way) and listed through that
//! descriptor, so that the window lasts one `open`, not the whole listing (`std::fs::read_dir`
//! would keep a low number for all of it).

use std::ffi::OsString;
use std::fs::File;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;

/// The names in the directory `path` (without `.` and `..`).
pub(crate) fn entry_names(path: impl AsRef<Path>) -> std::io::Result<Vec<OsString>> {
    let dir = gleaner_fds::make_held(|| File::open(path.as_ref()))?;
    let mut buf = vec![MaybeUninit::<u8>::uninit(); 16 << 10];
    let mut entries = rustix::fs::RawDir::new(&dir, &mut buf);
    let mut names = Vec::new();
    while let Some(entry) = entries.next() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(OsString::from_vec(name.to_vec()));
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_listed_through_a_held_descriptor() {
        let names = entry_names("/proc/self/task").unwrap();
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() }.to_string();
        assert!(
            names.iter().any(|n| n.to_str() == Some(me.as_str())),
            "{names:?}"
        );
        assert!(!names.iter().any(|n| n == "." || n == ".."));
        let comm = gleaner_fds::read_to_string(format!("/proc/self/task/{me}/comm")).unwrap();
        assert!(!comm.trim().is_empty());
        assert!(entry_names("/proc/self/no-such-directory").is_err());
    }
}
