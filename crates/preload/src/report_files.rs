//! The files through which a process reports to `gleaner run`: whether its pager started or
//! stopped (`pager-PID.json`) and, at exit, its stats. Each is opened when the process's pager
//! starts and kept open (a descriptor gleaner holds, `gleaner_fds`) for the writes that come
//! later.
//!
//! A program started as root that drops its privileges (`memcached -u nobody`, most servers)
//! can no longer create files in the run's report directory (mode 0700, the launcher's user):
//! until 2026-11-28 its stats were lost ("Permission denied", and the run said no process had
//! reported any), and a stop of its far memory after the drop went unreported, so the run
//! exited 0. A descriptor opened before the drop still writes.

use std::fs::File;
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};

/// Which of a process's report files.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    /// `pager-PID.json`: started, failed or stopped.
    Pager,
    /// The stats written at exit.
    Stats,
}

/// The kept descriptors, by [`Kind`]; -1 when none.
static KEPT: [AtomicI32; 2] = [AtomicI32::new(-1), AtomicI32::new(-1)];
/// The process that opened the kept descriptors: a fork child inherits its parent's, which are
/// the parent's files.
static OPENED_BY: AtomicI32 = AtomicI32::new(0);

fn slot(kind: Kind) -> &'static AtomicI32 {
    &KEPT[kind as usize]
}

fn pid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

/// Opens (creating, empty) `path` for this process's report of `kind` and keeps it open. In a
/// fork child, the descriptors inherited from the parent are closed first.
pub(crate) fn keep(kind: Kind, path: &Path) {
    if OPENED_BY.swap(pid(), Ordering::AcqRel) != pid() {
        for fd in &KEPT {
            close(fd.swap(-1, Ordering::AcqRel));
        }
    }
    let opened = gleaner_fds::make_held(|| {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
    });
    match opened {
        Ok(file) => {
            let fd = file.into_raw_fd();
            close(slot(kind).swap(fd, Ordering::AcqRel));
        }
        // Written by path at the end instead, which works unless the program drops privileges.
        Err(e) => log::debug!("keeping {} open: {e}", path.display()),
    }
}

/// Writes `contents` as the whole of this process's report of `kind` at `path`: through the
/// descriptor kept for it, else by path.
pub(crate) fn write(kind: Kind, path: &Path, contents: &[u8]) -> io::Result<()> {
    let fd = slot(kind).load(Ordering::Acquire);
    if fd < 0 || OPENED_BY.load(Ordering::Acquire) != pid() {
        return gleaner_fds::write(path, contents);
    }
    // SAFETY: `fd` is a descriptor this process opened and keeps for this file (held: the
    // program cannot close it); ManuallyDrop leaves it open.
    let file = ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
    file.set_len(0)?;
    file.write_all_at(contents, 0)?;
    debug_assert_eq!(file.as_raw_fd(), fd);
    Ok(())
}

/// Closes a kept descriptor (nothing for -1).
fn close(fd: i32) {
    if fd >= 0 {
        gleaner_fds::forget(fd);
        // SAFETY: a descriptor this module kept, no longer recorded anywhere.
        unsafe { libc::close(fd) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_file_is_written_after_its_directory_is_closed_to_us() {
        let dir = std::env::temp_dir().join(format!("gleaner-report-files-{}", pid()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pager-1.json");
        keep(Kind::Pager, &path);
        write(Kind::Pager, &path, b"first, longer").unwrap();
        // Where the process could not open the file any more (its directory taken away, as a
        // privilege drop would), the kept descriptor still writes; the old contents go.
        let moved = dir.with_extension("moved");
        std::fs::rename(&dir, &moved).unwrap();
        write(Kind::Pager, &path, b"second").unwrap();
        let text = std::fs::read_to_string(moved.join("pager-1.json")).unwrap();
        std::fs::remove_dir_all(&moved).unwrap();
        assert_eq!(text, "second");
    }
}
