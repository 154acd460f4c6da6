//! Where gleaner keeps the small files of a run that only its own processes read: each
//! process's start report and stats, the live status files (`gleaner status`).
//!
//! Every process of a run writes two or three of them, so a shell loop that runs a command per
//! iteration creates files as fast as it forks. On this VM's ext4 `/tmp` creating and writing a
//! 4 KiB file took over ten times as long as on `/dev/shm` (tmpfs): the difference was a sizeable
//! share of a `/bin/true` started under `gleaner run` (the move is one of the start-up changes
//! measured together in `bench/results/spawn/README.md`). So the files go to `/dev/shm` where it is
//! a writable directory.
//!
//! Two places, by who makes the files:
//!
//! * [`scratch_dir`], for the launcher (`gleaner run`'s report directory): `TMPDIR`, where the
//!   user names one, is honoured.
//! * [`system_dir`], for what a pager makes inside the program's processes (the live status
//!   files, an embedded memnode's directory): never `TMPDIR`, which is the program's. A test
//!   runner that gives each worker a `TMPDIR` of its own and checks it is left empty (CPython's
//!   `regrtest -j`) found a `gleaner-status-UID` there after every module.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

const SHM: &str = "/dev/shm";

/// The directory for a run's scratch files (see the module documentation): `$TMPDIR` if set,
/// else `/dev/shm` if this process can write there, else the system's temporary directory.
pub fn scratch_dir() -> PathBuf {
    choose(std::env::var_os("TMPDIR"), writable(SHM))
}

/// The directory for files a pager makes in the program's processes (see the module
/// documentation): `/dev/shm` if this process can write there, else `/tmp`; never `$TMPDIR`.
pub fn system_dir() -> PathBuf {
    choose_system(writable(SHM))
}

fn choose_system(shm_writable: bool) -> PathBuf {
    PathBuf::from(if shm_writable { SHM } else { "/tmp" })
}

fn choose(tmpdir: Option<OsString>, shm_writable: bool) -> PathBuf {
    match tmpdir.filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None if shm_writable => PathBuf::from(SHM),
        None => std::env::temp_dir(),
    }
}

/// Whether this process may create files in `dir`.
fn writable(dir: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(Path::new(dir).as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: access(2) on a NUL-terminated path that lives across the call.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tmpdir_wins_then_dev_shm_then_the_system_temporary_directory() {
        assert_eq!(
            choose(Some("/var/tmp/mine".into()), true),
            PathBuf::from("/var/tmp/mine")
        );
        assert_eq!(choose(Some("".into()), true), PathBuf::from(SHM));
        assert_eq!(choose(None, true), PathBuf::from(SHM));
        assert_eq!(choose(None, false), std::env::temp_dir());
        assert!(!writable("/nonexistent-gleaner-dir"));
        assert!(writable(&std::env::temp_dir().to_string_lossy()));
    }

    #[test]
    fn a_pagers_files_go_to_dev_shm_or_tmp_whatever_tmpdir_says() {
        assert_eq!(choose_system(true), PathBuf::from(SHM));
        assert_eq!(choose_system(false), PathBuf::from("/tmp"));
        // `system_dir` reads no environment: the same under any TMPDIR.
        assert!([PathBuf::from(SHM), PathBuf::from("/tmp")].contains(&system_dir()));
    }
}
