//! The contract between a soft-memory runtime and the node daemon: a pool's memfd and the
//! control area at its start.
//!
//! A pool's memory is one memfd, sealed against shrinking and growing (`F_SEAL_SHRINK`,
//! `F_SEAL_GROW`), laid out as `1 + n` slots of [`SEGMENT_BYTES`]: slot 0 is the control area,
//! slots 1..=n are the data segments. The runtime passes the memfd to the daemon at
//! registration, so the daemon can take any data segment back with `fallocate(PUNCH_HOLE)`
//! whether or not the runtime cooperates. Before punching segment `s` the daemon increments
//! `gen[s]` in the control area; the runtime records `gen[s]` when it starts using a segment and
//! re-checks it after every copy out of the segment, so a copy that overlapped a punch is a miss
//! (never zeros or half-old data), and a segment whose generation moved is dropped.
//!
//! Control-area layout (little endian, offsets in bytes): see the `OFF_*` constants. The
//! daemon trusts none of what the runtime writes here: counters feed only that pool's own
//! utility, the cold order is a hint whose entries are range-checked, and what a pool really
//! holds is measured from the memfd itself ([`resident_bytes`]).

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{FallocateFlags, MemfdFlags, SealFlags, SeekFrom};

use crate::map::Mapping;

/// The size of a data segment (and of the control area): a huge page.
pub const SEGMENT_BYTES: u64 = 2 << 20;
/// `b"GLSOFT01"` as a little-endian u64: the control area's first word.
pub const MAGIC: u64 = u64::from_le_bytes(*b"GLSOFT01");
/// The layout's version (bumped on any change of the offsets below).
pub const LAYOUT_VERSION: u64 = 1;
/// The most data segments one pool may have (a 256 GiB pool): bounds the control area.
pub const MAX_SEGMENTS: u64 = 131_072;

/// Offset of the magic word.
pub const OFF_MAGIC: usize = 0;
/// Offset of the layout version.
pub const OFF_VERSION: usize = 8;
/// Offset of the number of data segments.
pub const OFF_NSEG: usize = 16;
/// Offset of the limit (bytes) the daemon grants; the runtime keeps its segments within it.
pub const OFF_LIMIT: usize = 24;
/// Offset of the bytes the runtime would like (its demand; a hint).
pub const OFF_WANT: usize = 32;
/// Offset of the bytes the runtime says it holds in segments (a hint; the daemon measures).
pub const OFF_USED: usize = 40;
/// Offset of the hit counter.
pub const OFF_HITS: usize = 48;
/// Offset of the miss counter.
pub const OFF_MISSES: usize = 56;
/// Offset of the victim-hit counter (misses on objects evicted recently: ghost hits).
pub const OFF_VHITS: usize = 64;
/// Offset of the nanoseconds spent in reconstructors.
pub const OFF_REBUILD_NS: usize = 72;
/// Offset of the bytes reconstructed.
pub const OFF_MISS_BYTES: usize = 80;
/// Offset of the runtime's heartbeat (its evacuator's round counter).
pub const OFF_HEARTBEAT: usize = 88;
/// Offset of the number of segments the daemon punched itself (direct shrink).
pub const OFF_PUNCHED: usize = 96;
/// Offset of the number of segments the runtime released itself (cooperative shrink).
pub const OFF_RELEASED: usize = 104;
/// Offset of the ghost (victim cache) size in bytes the runtime keeps.
pub const OFF_GHOST_BYTES: usize = 112;
/// Offset of the number of valid entries in the cold order.
pub const OFF_COLD_LEN: usize = 120;
/// Offset of the segments evacuated (compacted) by the runtime.
pub const OFF_EVACUATED: usize = 128;
/// Offset of the per-segment generation words (`u64` each, indexed by segment number).
pub const OFF_GEN: usize = 4096;
/// Offset of the cold order: segment numbers (`u32`), coldest first.
pub const OFF_COLD: usize = OFF_GEN + 8 * (MAX_SEGMENTS as usize + 1);

/// The counters a runtime publishes, as read at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolCounters {
    /// Reads that found their object.
    pub hits: u64,
    /// Reads that ran the reconstructor.
    pub misses: u64,
    /// Misses on objects evicted recently (within the ghost size).
    pub vhits: u64,
    /// Nanoseconds spent in reconstructors.
    pub rebuild_ns: u64,
    /// Bytes reconstructed.
    pub miss_bytes: u64,
}

impl PoolCounters {
    /// The counts since `earlier` (saturating: a runtime that restarted its counters gives 0).
    pub fn since(&self, earlier: &PoolCounters) -> PoolCounters {
        PoolCounters {
            hits: self.hits.saturating_sub(earlier.hits),
            misses: self.misses.saturating_sub(earlier.misses),
            vhits: self.vhits.saturating_sub(earlier.vhits),
            rebuild_ns: self.rebuild_ns.saturating_sub(earlier.rebuild_ns),
            miss_bytes: self.miss_bytes.saturating_sub(earlier.miss_bytes),
        }
    }
}

/// A view of a pool's control area (either side's mapping of it).
#[derive(Debug)]
pub struct Control {
    map: Mapping,
}

impl Control {
    /// Maps the control area of `memfd`.
    pub fn map(memfd: impl AsFd) -> io::Result<Control> {
        Ok(Control {
            map: Mapping::new(memfd, SEGMENT_BYTES as usize)?,
        })
    }

    /// Writes a fresh header for `nseg` data segments (the runtime, at creation).
    pub fn init(&self, nseg: u64) {
        use std::sync::atomic::Ordering::SeqCst;
        self.map.u64_at(OFF_VERSION).store(LAYOUT_VERSION, SeqCst);
        self.map.u64_at(OFF_NSEG).store(nseg, SeqCst);
        self.map.u64_at(OFF_MAGIC).store(MAGIC, SeqCst);
    }

    /// The header's segment count, if the header is valid for a memfd of `file_bytes`.
    pub fn validate(&self, file_bytes: u64) -> Result<u64, String> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.map.u64_at(OFF_MAGIC).load(SeqCst) != MAGIC {
            return Err("the memfd's control area has no gleaner soft-pool header".into());
        }
        let v = self.map.u64_at(OFF_VERSION).load(SeqCst);
        if v != LAYOUT_VERSION {
            return Err(format!(
                "control-area layout {v}, this daemon knows {LAYOUT_VERSION}"
            ));
        }
        let n = self.map.u64_at(OFF_NSEG).load(SeqCst);
        if n == 0 || n > MAX_SEGMENTS {
            return Err(format!("{n} segments: give 1 to {MAX_SEGMENTS}"));
        }
        if file_bytes < (n + 1) * SEGMENT_BYTES {
            return Err(format!(
                "the memfd holds {file_bytes} bytes, too few for {n} segments of {SEGMENT_BYTES}"
            ));
        }
        Ok(n)
    }

    /// The `u64` field at `off`.
    #[inline]
    pub fn word(&self, off: usize) -> &std::sync::atomic::AtomicU64 {
        self.map.u64_at(off)
    }

    /// The generation word of data segment `seg` (1-based).
    #[inline]
    pub fn gen(&self, seg: u32) -> &std::sync::atomic::AtomicU64 {
        assert!(seg >= 1 && u64::from(seg) <= MAX_SEGMENTS);
        self.map.u64_at(OFF_GEN + 8 * seg as usize)
    }

    /// Every data segment's generation word, indexed by segment (entry 0 unused): one check
    /// when taken, none per index beyond the array's own.
    #[inline]
    pub fn gens(&self) -> &[std::sync::atomic::AtomicU64; MAX_SEGMENTS as usize + 1] {
        const _: () = assert!(OFF_GEN.is_multiple_of(8));
        const _: () = assert!(OFF_GEN + 8 * (MAX_SEGMENTS as usize + 1) <= SEGMENT_BYTES as usize);
        // SAFETY: every `Control` maps `SEGMENT_BYTES` (`Control::map`, its one constructor),
        // and the array lies inside them, 8-aligned (the assertions above, at compile time).
        unsafe { self.map.u64_array_at_unchecked(OFF_GEN) }
    }

    /// Entry `i` of the cold order.
    #[inline]
    pub fn cold(&self, i: usize) -> &std::sync::atomic::AtomicU32 {
        assert!((i as u64) < MAX_SEGMENTS);
        self.map.u32_at(OFF_COLD + 4 * i)
    }

    /// The counters, as they are now.
    pub fn counters(&self) -> PoolCounters {
        use std::sync::atomic::Ordering::Relaxed;
        PoolCounters {
            hits: self.word(OFF_HITS).load(Relaxed),
            misses: self.word(OFF_MISSES).load(Relaxed),
            vhits: self.word(OFF_VHITS).load(Relaxed),
            rebuild_ns: self.word(OFF_REBUILD_NS).load(Relaxed),
            miss_bytes: self.word(OFF_MISS_BYTES).load(Relaxed),
        }
    }
}

/// The byte offset of data segment `seg` (1-based) in the memfd.
#[inline]
pub fn segment_offset(seg: u32) -> u64 {
    u64::from(seg) * SEGMENT_BYTES
}

/// Creates a pool's memfd for `nseg` data segments: sized, sealed against resizing, its control
/// area initialised. Returns the memfd and the runtime's mapping of the control area.
pub fn create_pool_memfd(name: &str, nseg: u64) -> io::Result<(OwnedFd, Control)> {
    if nseg == 0 || nseg > MAX_SEGMENTS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{nseg} segments: give 1 to {MAX_SEGMENTS}"),
        ));
    }
    let fd = rustix::fs::memfd_create(
        format!("gleaner-soft:{name}"),
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    rustix::fs::ftruncate(&fd, (nseg + 1) * SEGMENT_BYTES)?;
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    let control = Control::map(&fd)?;
    control.init(nseg);
    Ok((fd, control))
}

/// Checks a memfd handed over at registration: sealed against shrinking (so the daemon's
/// mapping of it can never fault) and big enough for its header. Returns its segment count and
/// the daemon's mapping of its control area.
pub fn adopt_pool_memfd(fd: &OwnedFd) -> Result<(u64, Control), String> {
    let seals = rustix::fs::fcntl_get_seals(fd)
        .map_err(|e| format!("the descriptor is not a sealable memfd ({e})"))?;
    if !seals.contains(SealFlags::SHRINK) {
        return Err("the memfd is not sealed against shrinking (F_SEAL_SHRINK)".into());
    }
    if seals.contains(SealFlags::WRITE) || seals.contains(SealFlags::FUTURE_WRITE) {
        return Err("the memfd is sealed against writing, so it cannot be punched".into());
    }
    let st = rustix::fs::fstat(fd).map_err(|e| format!("fstat: {e}"))?;
    let size = st.st_size as u64;
    if size < 2 * SEGMENT_BYTES {
        return Err(format!(
            "the memfd holds {size} bytes, too few for one segment"
        ));
    }
    let control = Control::map(fd).map_err(|e| format!("mapping its control area: {e}"))?;
    let n = control.validate(size)?;
    Ok((n, control))
}

/// The bytes of `fd` backed by memory now (the kernel's count, not the runtime's word).
pub fn resident_bytes(fd: impl AsFd) -> io::Result<u64> {
    Ok(rustix::fs::fstat(fd)?.st_blocks as u64 * 512)
}

/// The bytes of the control area (segment 0) that have memory behind them, found with
/// `SEEK_DATA` / `SEEK_HOLE`: what [`resident_bytes`] counts beside the data segments.
pub fn control_resident_bytes(fd: impl AsFd) -> u64 {
    let fd = fd.as_fd();
    let mut at = 0;
    let mut held = 0;
    while at < SEGMENT_BYTES {
        let Ok(data) = rustix::fs::seek(fd, SeekFrom::Data(at)) else {
            break;
        };
        if data >= SEGMENT_BYTES {
            break;
        }
        let hole = rustix::fs::seek(fd, SeekFrom::Hole(data)).unwrap_or(SEGMENT_BYTES);
        held += hole.min(SEGMENT_BYTES) - data;
        at = hole;
    }
    held
}

/// Whether data segment `seg` has any memory behind it (`SEEK_DATA` inside its range).
pub fn segment_has_data(fd: impl AsFd, seg: u32) -> bool {
    let start = segment_offset(seg);
    match rustix::fs::seek(fd, SeekFrom::Data(start)) {
        Ok(at) => at < start + SEGMENT_BYTES,
        Err(_) => false,
    }
}

/// Punches data segment `seg` out of `fd`: its memory goes back to the kernel at once.
pub fn punch_segment(fd: impl AsFd, seg: u32) -> io::Result<()> {
    rustix::fs::fallocate(
        fd,
        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
        segment_offset(seg),
        SEGMENT_BYTES,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn the_control_area_is_counted_apart_from_the_data_segments() {
        let (fd, _ctrl) = create_pool_memfd("control-test", 4).unwrap();
        let control = control_resident_bytes(&fd);
        assert!(control > 0 && control < SEGMENT_BYTES, "{control}");
        assert_eq!(resident_bytes(&fd).unwrap(), control);
        // A whole data segment and one page of another.
        let file = std::fs::File::from(fd.try_clone().unwrap());
        file.write_all_at(&vec![1u8; SEGMENT_BYTES as usize], segment_offset(1))
            .unwrap();
        file.write_all_at(&[1u8; 4096], segment_offset(3)).unwrap();
        assert_eq!(control_resident_bytes(&fd), control);
        assert_eq!(resident_bytes(&fd).unwrap(), control + SEGMENT_BYTES + 4096);
    }
}
