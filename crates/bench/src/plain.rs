//! `gleaner bench micro --system plain`: the same initialising write pass and the same measured,
//! word-checked read passes as the far-memory mode, over an ordinary anonymous private mapping.
//! No memnode, no region, no floors: whatever pages it out is the kernel's business (run it in a
//! memory cgroup with swap to measure Linux swap beside gleaner).

use std::time::Instant;

use gleaner_pager::{LatencySummary, PAGE_SIZE};
use gleaner_proto::units::format_size;
use gleaner_sys::anon::AnonMapping;
use serde::Serialize;

use super::pattern::fill_page;
use super::{measured_passes, pin, MicroArgs, StreamResult};

/// Everything one plain-memory run measured. Field names follow the far-memory report's where
/// they mean the same thing.
#[derive(Serialize)]
pub struct PlainReport {
    /// Always `plain`.
    system: &'static str,
    pattern: String,
    size_bytes: u64,
    passes: u32,
    /// The CPU the init pass and the access pattern ran on (`--pin-cpu`), if pinned.
    pin_cpu: Option<usize>,
    /// How the memory was mapped.
    mapping: &'static str,
    /// Whether `MADV_NOHUGEPAGE` was accepted (false on a kernel without THP).
    nohugepage: bool,
    checksum: u64,
    pub(crate) checksum_ok: bool,
    accesses: u64,
    /// ns per access in the measured passes.
    ns_per_op: f64,
    /// Accesses slower than 1 µs, as the program saw them (under swap: mostly swap-ins).
    remote_fault_app_visible: LatencySummary,
    init_pass_s: f64,
    /// VmRSS just before the mapping is first touched (the process's own memory: binary,
    /// libraries, stack, heap), and its anonymous and file-backed parts.
    baseline_rss_bytes: u64,
    baseline_rss_anon_bytes: u64,
    baseline_rss_file_bytes: u64,
    /// VmRSS after the init pass and after the measured passes.
    rss_after_init_bytes: u64,
    rss_after_bytes: u64,
    /// getrusage faults during the measured passes.
    fault_counts: FaultCounts,
    /// getrusage faults during the init pass.
    init_fault_counts: FaultCounts,
    /// /proc/self/cgroup, for the record (which memory cgroup the run was in).
    cgroup: String,
}

/// Page faults counted by getrusage(RUSAGE_SELF) (all threads of the process).
#[derive(Serialize, Clone, Copy, Default)]
pub struct FaultCounts {
    /// Faults that needed I/O (under swap: swap-ins not found in the swap cache).
    major: u64,
    /// Faults served without I/O.
    minor: u64,
}

impl FaultCounts {
    fn now() -> FaultCounts {
        // SAFETY: rusage is plain data, for which all zeroes is a valid value.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: getrusage writes one rusage into the live `ru`.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
        if rc != 0 {
            return FaultCounts::default();
        }
        FaultCounts {
            major: ru.ru_majflt as u64,
            minor: ru.ru_minflt as u64,
        }
    }

    fn since(self, before: FaultCounts) -> FaultCounts {
        FaultCounts {
            major: self.major.saturating_sub(before.major),
            minor: self.minor.saturating_sub(before.minor),
        }
    }
}

/// `len` bytes of MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE memory, and whether
/// MADV_NOHUGEPAGE took (so the kernel pages it 4 KiB at a time, as gleaner does).
fn mapping(len: usize) -> Result<(AnonMapping, bool), String> {
    let map = AnonMapping::new(len, libc::MAP_NORESERVE)
        .map_err(|e| format!("mmap of {}: {e}", format_size(len as u64)))?;
    let nohugepage = map.advise(libc::MADV_NOHUGEPAGE).is_ok();
    Ok((map, nohugepage))
}

/// VmRSS, RssAnon and RssFile of this process, in bytes (0 where unreadable).
fn rss() -> (u64, u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("RssAnon:"), field("RssFile:"))
}

/// Runs the init pass and the measured passes over plain memory.
pub fn run(args: &MicroArgs) -> Result<PlainReport, String> {
    if args.size == 0 {
        return Err("--size must be at least one page".into());
    }
    let pages = (args.size as usize).div_ceil(PAGE_SIZE);
    let progress = !args.json;
    // Pinned before anything runs: the stream threads spawned below inherit the affinity.
    let _pinned = args.pin_cpu.map(pin::pin_current_thread).transpose()?;
    let (map, nohugepage) = mapping(pages * PAGE_SIZE)?;
    let base = map.as_ptr();
    let (baseline, baseline_anon, baseline_file) = rss();
    if progress {
        eprintln!(
            "bench micro: {} of plain memory, pattern {}, baseline RSS {}",
            format_size((pages * PAGE_SIZE) as u64),
            args.pattern,
            format_size(baseline)
        );
    }

    // Initialising pass: every page written once (first-touch faults; under a memory limit the
    // kernel swaps pages out as it goes).
    let f0 = FaultCounts::now();
    let t = Instant::now();
    for p in 0..pages {
        // SAFETY: page p lies inside the live mapping of `pages` pages, readable and writable.
        unsafe { fill_page(base.add(p * PAGE_SIZE), p) };
    }
    let init_s = t.elapsed().as_secs_f64();
    let f1 = FaultCounts::now();
    let rss_after_init = rss().0;

    // Measured passes: the far-memory mode's reader, one thread per stream of the pattern.
    let t = Instant::now();
    let StreamResult {
        hist,
        checksum,
        bad,
        accesses,
    } = measured_passes(base as usize, pages, &args.pattern, args.passes, progress);
    let measured_s = t.elapsed().as_secs_f64();
    let f2 = FaultCounts::now();
    let rss_after = rss().0;
    drop(map);

    let expected_sum = args.pattern.expected_checksum(pages, args.passes);
    Ok(PlainReport {
        system: "plain",
        pattern: args.pattern.to_string(),
        size_bytes: args.size,
        passes: args.passes,
        pin_cpu: args.pin_cpu,
        mapping: "MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE, MADV_NOHUGEPAGE",
        nohugepage,
        checksum,
        checksum_ok: bad == 0 && checksum == expected_sum,
        accesses,
        ns_per_op: measured_s * 1e9 / accesses.max(1) as f64,
        remote_fault_app_visible: LatencySummary::of(&hist),
        init_pass_s: init_s,
        baseline_rss_bytes: baseline,
        baseline_rss_anon_bytes: baseline_anon,
        baseline_rss_file_bytes: baseline_file,
        rss_after_init_bytes: rss_after_init,
        rss_after_bytes: rss_after,
        fault_counts: f2.since(f1),
        init_fault_counts: f1.since(f0),
        cgroup: std::fs::read_to_string("/proc/self/cgroup")
            .unwrap_or_default()
            .trim()
            .to_string(),
    })
}

/// The human-readable report.
pub fn print_human(r: &PlainReport) {
    println!(
        "plain memory  pattern {}  size {}  passes {}  pinned {}",
        r.pattern,
        format_size(r.size_bytes),
        r.passes,
        r.pin_cpu.map_or("no".into(), |c| format!("CPU {c}"))
    );
    println!(
        "checksum {:#018x} {}",
        r.checksum,
        if r.checksum_ok { "ok" } else { "MISMATCH" }
    );
    println!(
        "{:.1} ns/op; init pass {:.2} s; baseline RSS {}, after {}",
        r.ns_per_op,
        r.init_pass_s,
        format_size(r.baseline_rss_bytes),
        format_size(r.rss_after_bytes)
    );
    let a = &r.remote_fault_app_visible;
    println!(
        "accesses > 1 us (as the program sees them): n={} mean {:.1} us  p50 {:.1} us  p99 {:.1} us  p99.9 {:.1} us",
        a.count, a.mean_us, a.p50_us, a.p99_us, a.p999_us
    );
    println!(
        "page faults in the measured passes: {} major, {} minor (init pass: {} major, {} minor)",
        r.fault_counts.major,
        r.fault_counts.minor,
        r.init_fault_counts.major,
        r.init_fault_counts.minor
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> MicroArgs {
        let mut argv = vec!["micro", "--system", "plain", "--json"];
        argv.extend_from_slice(extra);
        crate::parse_micro_args(&argv).unwrap()
    }

    /// The first CPU this thread may run on (the tests must not assume CPU 0 is allowed).
    fn first_allowed_cpu() -> usize {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let list = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap();
        let first: String = list
            .trim()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        first.parse().unwrap()
    }

    #[test]
    fn plain_runs_check_every_word_and_count_faults() {
        for pattern in ["seq", "stride:10", "random", "two:3,5"] {
            let cpu = first_allowed_cpu().to_string();
            let r = run(&args(&[
                "--size",
                "2M",
                "--pattern",
                pattern,
                "--pin-cpu",
                &cpu,
            ]))
            .unwrap();
            assert!(r.checksum_ok, "{pattern}");
            assert_eq!(r.accesses, 2 * 512, "{pattern}");
            assert_eq!(r.pin_cpu, Some(first_allowed_cpu()));
            assert!(r.baseline_rss_bytes > 0 && r.baseline_rss_bytes <= r.rss_after_init_bytes);
            // Every page was first touched by the init pass.
            assert!(r.init_fault_counts.minor + r.init_fault_counts.major >= 512);
            assert!(r.ns_per_op > 0.0);
        }
    }

    #[test]
    fn pinning_is_restored_and_bad_cpus_are_refused() {
        let before = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let allowed = |s: &str| {
            s.lines()
                .find(|l| l.starts_with("Cpus_allowed_list:"))
                .map(str::to_owned)
        };
        {
            let cpu = first_allowed_cpu();
            let _p = pin::pin_current_thread(cpu).unwrap();
            let now = std::fs::read_to_string("/proc/thread-self/status").unwrap();
            let cpu = cpu.to_string();
            assert_eq!(
                allowed(&now).unwrap().split_whitespace().nth(1),
                Some(cpu.as_str())
            );
        }
        let after = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        assert_eq!(allowed(&before), allowed(&after));
        assert!(pin::pin_current_thread(libc::CPU_SETSIZE as usize).is_err());
        assert!(run(&args(&["--size", "1M", "--pin-cpu", "100000"])).is_err());
    }
}
