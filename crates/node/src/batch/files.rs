//! The files a process holds (open descriptors and file mappings, from `/proc/PID/fd` and
//! `/proc/PID/maps`), how much of each is in the page cache, and dropping that cache.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// A file by device and inode: the same file reached through several paths or processes is one.
pub type FileId = (u64, u64);

/// Every regular file process `pid` holds open or mapped, with a path to reach it by (the
/// `/proc/PID/fd/N` link for an open one, which works even after the file was renamed).
pub fn held_files(pid: i32) -> BTreeMap<FileId, PathBuf> {
    let mut out = BTreeMap::new();
    let fd_dir = PathBuf::from(format!("/proc/{pid}/fd"));
    for entry in std::fs::read_dir(&fd_dir).into_iter().flatten().flatten() {
        let link = entry.path();
        if let Ok(m) = std::fs::metadata(&link) {
            if m.is_file() {
                out.entry((m.dev(), m.ino())).or_insert(link);
            }
        }
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    for line in maps.lines() {
        // address perms offset dev inode path
        let mut f = line.split_whitespace();
        let (Some(_), Some(_), Some(_), Some(_), Some(inode)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let path: String = f.collect::<Vec<_>>().join(" ");
        if inode == "0" || !path.starts_with('/') || path.ends_with(" (deleted)") {
            continue;
        }
        if let Ok(m) = std::fs::metadata(&path) {
            if m.is_file() && m.ino().to_string() == inode {
                out.entry((m.dev(), m.ino())).or_insert(PathBuf::from(path));
            }
        }
    }
    out
}

/// Bytes of the file at `path` in the page cache (`mincore` over a read-only mapping of it, as
/// `fincore` does); None if it cannot be opened or mapped.
pub fn cached_bytes(path: &std::path::Path) -> Option<u64> {
    let f = File::open(path).ok()?;
    let len = usize::try_from(f.metadata().ok()?.len()).ok()?;
    if len == 0 {
        return Some(0);
    }
    let page = 4096usize;
    // SAFETY: a fresh shared read-only mapping of the whole file, unmapped below; nothing reads
    // through it (mincore only reports residency, and faults nothing in).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: `p` maps `len` bytes; `vec` has one byte per page of them.
    let r = unsafe { libc::mincore(p, len, vec.as_mut_ptr()) };
    // SAFETY: unmapping the mapping made above.
    unsafe { libc::munmap(p, len) };
    (r == 0).then(|| vec.iter().filter(|&&b| b & 1 == 1).count() as u64 * page as u64)
}

/// Drops the clean pages of the byte ranges `(offset, length)` of the file from the page cache
/// (`POSIX_FADV_DONTNEED`; dirty pages stay until written back). Anonymous memory is never
/// reached this way.
pub fn drop_cache(path: &std::path::Path, ranges: &[(u64, u64)]) -> std::io::Result<()> {
    let f = File::open(path)?;
    for &(offset, len) in ranges {
        let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len))
        else {
            return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
        };
        // SAFETY: advice on a descriptor we own, over a range of its file.
        let r =
            unsafe { libc::posix_fadvise(f.as_raw_fd(), offset, len, libc::POSIX_FADV_DONTNEED) };
        if r != 0 {
            return Err(std::io::Error::from_raw_os_error(r));
        }
    }
    Ok(())
}

/// The file position of the descriptor behind `path`, when it is a `/proc/PID/fd/N` link (from
/// `/proc/PID/fdinfo/N`); None for a mapped file or an unreadable one.
pub fn position(path: &std::path::Path) -> Option<u64> {
    let fd = path.file_name()?.to_str()?;
    let dir = path.parent()?;
    if dir.file_name()? != "fd" {
        return None;
    }
    let info = std::fs::read_to_string(dir.parent()?.join("fdinfo").join(fd)).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("pos:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The file's size, bytes.
pub fn size(path: &std::path::Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.len())
}
