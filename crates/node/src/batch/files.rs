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

/// `cachestat(2)` (Linux 6.5+): the same number on x86-64 and AArch64 (the shared table of
/// system calls added since 5.1); not in every libc release.
const SYS_CACHESTAT: libc::c_long = 451;

/// `struct cachestat_range` of `cachestat(2)`: `len` 0 means to the end of the file.
#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

/// `struct cachestat` of `cachestat(2)`, in pages.
#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// Bytes of the file at `path` in the page cache; None if it cannot be opened (or mapped).
///
/// `cachestat(2)` where the kernel has it: it walks only the pages present, where `mincore`
/// looks each page of the file up from the top of the cache's tree; measured on the daemon
/// beside a batch job re-reading a 424 MiB file, `mincore` was half its CPU time. Older kernels:
/// `mincore` over a read-only mapping (as `fincore` does).
pub fn cached_bytes(path: &std::path::Path) -> Option<u64> {
    let f = File::open(path).ok()?;
    let range = CachestatRange { off: 0, len: 0 };
    let mut cs = Cachestat::default();
    // SAFETY: cachestat reads one range and writes one struct, both live locals of the kernel's
    // layout, about a descriptor we own.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            f.as_raw_fd(),
            &range as *const CachestatRange,
            &mut cs as *mut Cachestat,
            0u32,
        )
    };
    if r == 0 {
        return Some(cs.nr_cache * page_size());
    }
    cached_bytes_mincore(&f)
}

fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant of the system.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

/// [`cached_bytes`] by `mincore`.
fn cached_bytes_mincore(f: &File) -> Option<u64> {
    let len = usize::try_from(f.metadata().ok()?.len()).ok()?;
    if len == 0 {
        return Some(0);
    }
    let page = page_size() as usize;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Both ways of measuring agree on a file partly in the page cache (written: all of it;
    /// then half dropped).
    #[test]
    fn cachestat_and_mincore_agree() {
        let path = std::env::temp_dir().join(format!("gleaner-cachestat-{}", std::process::id()));
        let mut f = File::create(&path).unwrap();
        f.write_all(&vec![7u8; 8 << 20]).unwrap();
        f.sync_all().unwrap();
        drop_cache(&path, &[(0, 4 << 20)]).unwrap();
        let by_cachestat = cached_bytes(&path).unwrap();
        let by_mincore = cached_bytes_mincore(&File::open(&path).unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(by_cachestat, by_mincore);
        assert!(
            (3 << 20..=4 << 20).contains(&by_cachestat),
            "half of 8 MiB cached: {by_cachestat}"
        );
    }
}
