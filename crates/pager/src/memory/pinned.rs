//! Memory the kernel pins for I/O, which a pager cannot page: buffers the program registered
//! with io_uring (`IORING_REGISTER_BUFFERS`, "fixed buffers").
//!
//! The kernel reads and writes a registered buffer's pages directly, for as long as it stays
//! registered. An eviction drops those pages from the program's page table, but the kernel keeps
//! the pages themselves: what it writes there afterwards never reaches the program, which reads the
//! far copy back (an 8 MiB buffer at `--local-mem 16M` read back nearly all stale:
//! docs/compatibility.md, "Known limits", with the program in `bench/results/tried-1128/`). User
//! space cannot see which pages are pinned, and the registration is a raw system call (liburing's
//! own) that the preload library never sees. But the kernel lists each io_uring instance's
//! registered buffers in its `fdinfo`, so the watchdog looks there every [`CHECK_PERIOD`], and a
//! registered buffer in managed memory stops the program (exit 86) with a message that says how to
//! keep it out. Between two looks the buffer may already have lost data: the check bounds how long
//! a program goes on with it. (RDMA and VFIO registrations, made through device `ioctl`s, are not
//! listed anywhere a process can read; docs/compatibility.md.)

use std::time::Duration;

use crate::observe::procfs;

/// How often the watchdog looks for registered buffers, at most.
pub(crate) const CHECK_PERIOD: Duration = Duration::from_secs(1);

/// A look costs the watchdog at most one part in this many of a CPU ([`next_look_in`]).
pub(crate) const COST_SHARE: u32 = 200;

/// The longest between two looks, whatever one costs.
pub(crate) const LONGEST_PERIOD: Duration = Duration::from_secs(60);

/// When to look again after a look that took `cost` of the watchdog's CPU: every
/// [`CHECK_PERIOD`], or less often where a look is dear, so that looking takes at most
/// 1/[`COST_SHARE`] of a CPU (at most [`LONGEST_PERIOD`] apart). A look lists `/proc/self/fd`
/// and reads each entry's link: with 10,000 descriptors (a busy server's connections) it took
/// about 75 ms, and looking every second took 7.8% of a CPU, at the normal class since the
/// watchdog left the idle one; such a process is now looked at about every 15 s.
pub(crate) fn next_look_in(cost: Duration) -> Duration {
    (cost * COST_SHARE).clamp(CHECK_PERIOD, LONGEST_PERIOD)
}

/// A buffer registered with an io_uring instance of this process: `(address, length)`.
pub(crate) type Registered = (usize, usize);

/// The buffers registered with this process's io_uring instances. Empty when there are none, or
/// when `/proc` cannot be read (the program may hold every descriptor its limit allows: the
/// next look tries again).
pub(crate) fn registered_buffers() -> Vec<Registered> {
    let Ok(names) = procfs::entry_names("/proc/self/fd") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for name in names {
        let name = name.to_string_lossy();
        // A link's target is read without opening anything.
        let is_ring = std::fs::read_link(format!("/proc/self/fd/{name}"))
            .is_ok_and(|target| target.as_os_str() == "anon_inode:[io_uring]");
        if !is_ring {
            continue;
        }
        if let Ok(text) = gleaner_fds::read_to_string(format!("/proc/self/fdinfo/{name}")) {
            found.extend(parse_user_bufs(&text));
        }
    }
    found
}

/// The `UserBufs` section of an io_uring instance's `fdinfo`: a count, then one line per buffer,
/// `INDEX: 0xADDRESS/LENGTH`.
fn parse_user_bufs(fdinfo: &str) -> Vec<Registered> {
    let mut lines = fdinfo.lines().skip_while(|l| !l.starts_with("UserBufs:"));
    let count: usize = lines
        .next()
        .and_then(|l| l["UserBufs:".len()..].trim().parse().ok())
        .unwrap_or(0);
    lines
        .take(count)
        .filter_map(|l| {
            let (_, buf) = l.split_once(':')?;
            let (addr, len) = buf.trim().split_once('/')?;
            let addr = usize::from_str_radix(addr.trim_start_matches("0x"), 16).ok()?;
            Some((addr, len.trim().parse().ok()?))
        })
        .collect()
}

/// The first registered buffer that overlaps `[start, start+len)`.
pub(crate) fn first_overlapping(
    buffers: &[Registered],
    start: usize,
    len: usize,
) -> Option<Registered> {
    buffers
        .iter()
        .copied()
        .find(|&(a, l)| l > 0 && a < start + len && start < a + l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dear_look_waits_longer_for_the_next_within_bounds() {
        assert_eq!(next_look_in(Duration::ZERO), CHECK_PERIOD);
        assert_eq!(next_look_in(Duration::from_millis(2)), CHECK_PERIOD);
        assert_eq!(
            next_look_in(Duration::from_millis(75)),
            Duration::from_secs(15)
        );
        assert_eq!(next_look_in(Duration::from_secs(2)), LONGEST_PERIOD);
    }

    #[test]
    fn the_registered_buffers_are_read_from_fdinfo() {
        let fdinfo =
            "SqMask:\t0x3\nUserFiles:\t0\nUserBufs:\t2\n    0: 0x7f7c00a16000/1048576\n    \
                      1: 0x7f7c00a17000/8192\nPollList:\nNAPI:\tdisabled\n";
        assert_eq!(
            parse_user_bufs(fdinfo),
            vec![(0x7f7c00a16000, 1048576), (0x7f7c00a17000, 8192)]
        );
        assert!(parse_user_bufs("UserBufs:\t0\nPollList:\n").is_empty());
        assert!(parse_user_bufs("SqMask:\t0x3\n").is_empty());
    }

    #[test]
    fn a_buffer_overlapping_the_range_is_found() {
        let bufs = [(0x1000, 0x1000), (0x10000, 0x4000)];
        assert_eq!(
            first_overlapping(&bufs, 0x12000, 0x1000),
            Some((0x10000, 0x4000))
        );
        assert_eq!(first_overlapping(&bufs, 0x2000, 0x1000), None);
        assert_eq!(
            first_overlapping(&bufs, 0x0, 0x1001),
            Some((0x1000, 0x1000))
        );
    }
}
