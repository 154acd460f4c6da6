//! Memory pressure: what the daemon reads (`/proc/pressure/memory`, `/proc/meminfo`, or a
//! cgroup's `memory.pressure`, `memory.current` and `memory.max` when it coordinates one
//! cgroup; `memory.usage_in_bytes` and `memory.limit_in_bytes` under cgroup v1), and the pure
//! rules that turn a sample into a soft-memory budget and a level.

use std::path::{Path, PathBuf};

/// One reading of the memory situation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    /// All memory the coordinated domain has, bytes.
    pub total: u64,
    /// Memory available without reclaiming anyone's (MemAvailable; in a cgroup, max - current).
    pub available: u64,
    /// PSI `some avg10` (percent of time some task waited for memory).
    pub some_avg10: f64,
    /// PSI `full avg10`.
    pub full_avg10: f64,
}

/// How hard the daemon must take memory back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Enough memory: soft pools may grow into idle memory.
    None,
    /// Less than the reserve left: shrink, cooperatively first.
    Moderate,
    /// Less than half the reserve left, or tasks stalling: punch segments at once.
    Severe,
}

/// How fast memory the daemon does not arbitrate (everything but the soft pools and the far
/// programs it grants) is growing: the peak of the growth seen between samples, halving every
/// [`GROWTH_HALF_LIFE`] secs while it does not grow. The daemon keeps that growth times its
/// reaction horizon free beyond the fixed reserve ([`Growth::headroom`]): an antagonist
/// allocating 2 GiB/s eats 20 MiB between two 10 ms ticks, and a daemon thread delayed a few
/// ticks on a busy machine would otherwise let the domain reach its limit before the soft
/// memory was taken back (an OOM kill where a cgroup has no swap).
#[derive(Debug, Clone, Default)]
pub struct Growth {
    /// The last sample: seconds since the first (monotonic) and the bytes used by others.
    last: Option<(f64, u64)>,
    /// Bytes per second, peak-held with decay.
    rate: f64,
}

/// The half-life of [`Growth`]'s peak, seconds.
pub const GROWTH_HALF_LIFE: f64 = 1.0;

impl Growth {
    /// Records that others use `others` bytes at `at_s` seconds; returns the growth rate
    /// (bytes per second) now.
    pub fn observe(&mut self, at_s: f64, others: u64) -> f64 {
        if let Some((t, prev)) = self.last {
            let dt = at_s - t;
            if dt > 0.0 {
                let now = others.saturating_sub(prev) as f64 / dt;
                self.rate = now.max(self.rate * 0.5f64.powf(dt / GROWTH_HALF_LIFE));
            }
        }
        self.last = Some((at_s, others));
        self.rate
    }

    /// The growth rate last observed (bytes per second).
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// What to keep free beyond `reserve` for the growth: the rate times `horizon` seconds.
    pub fn headroom(&self, horizon_s: f64) -> u64 {
        (self.rate * horizon_s) as u64
    }
}

/// The level for `s` with `reserve` bytes to keep free.
pub fn level(s: &Sample, reserve: u64) -> Level {
    if s.available < reserve / 2 || s.full_avg10 >= 20.0 {
        Level::Severe
    } else if s.available < reserve || s.some_avg10 >= 10.0 {
        Level::Moderate
    } else {
        Level::None
    }
}

/// The soft-memory budget: what soft pools hold now plus what is available beyond the
/// reserve, at most `cap` (a `--soft-budget`), never negative.
pub fn budget(s: &Sample, soft_resident: u64, reserve: u64, cap: Option<u64>) -> u64 {
    let b = (s.available + soft_resident).saturating_sub(reserve);
    cap.map_or(b, |c| b.min(c))
}

/// Parses `/proc/pressure/memory` (or a cgroup's `memory.pressure`): (some avg10, full avg10).
pub fn parse_psi(text: &str) -> Option<(f64, f64)> {
    let mut some = None;
    let mut full = None;
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let which = it.next()?;
        let avg10 = it
            .find_map(|f| f.strip_prefix("avg10="))
            .and_then(|v| v.parse::<f64>().ok());
        match which {
            "some" => some = avg10,
            "full" => full = avg10,
            _ => {}
        }
    }
    Some((some?, full.unwrap_or(0.0)))
}

/// Parses `/proc/meminfo`: (MemTotal, MemAvailable) in bytes.
pub fn parse_meminfo(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

/// Where the daemon reads pressure from.
#[derive(Debug, Clone)]
pub enum Source {
    /// The whole machine.
    Machine,
    /// One cgroup (v2) directory: its `memory.max` is the domain's total.
    Cgroup(PathBuf),
}

impl Source {
    /// Reads a sample; an error names the file that could not be read.
    pub fn sample(&self) -> Result<Sample, String> {
        let read =
            |p: &Path| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
        match self {
            Source::Machine => {
                let (total, available) = parse_meminfo(&read(Path::new("/proc/meminfo"))?)
                    .ok_or("/proc/meminfo: no MemTotal/MemAvailable")?;
                let (some, full) = read(Path::new("/proc/pressure/memory"))
                    .ok()
                    .and_then(|t| parse_psi(&t))
                    .unwrap_or((0.0, 0.0));
                Ok(Sample {
                    total,
                    available,
                    some_avg10: some,
                    full_avg10: full,
                })
            }
            Source::Cgroup(dir) => {
                let num = |name: &str| -> Result<Option<u64>, String> {
                    let t = read(&dir.join(name))?;
                    let t = t.trim();
                    match t.parse::<u64>() {
                        // cgroup v1 says "no limit" with a huge number.
                        Ok(v) if v >= 1 << 60 => Ok(None),
                        Ok(v) => Ok(Some(v)),
                        Err(_) if t == "max" => Ok(None),
                        Err(e) => Err(format!("{}/{name}: {e}", dir.display())),
                    }
                };
                // cgroup v2 (memory.max, memory.current, memory.pressure), else v1
                // (memory.limit_in_bytes, memory.usage_in_bytes; no pressure stall info).
                let v2 = dir.join("memory.max").exists();
                let (cur, max) = if v2 {
                    ("memory.current", "memory.max")
                } else {
                    ("memory.usage_in_bytes", "memory.limit_in_bytes")
                };
                let current = num(cur)?.unwrap_or(0);
                let total =
                    num(max)?.ok_or_else(|| format!("{}: {max} is unlimited", dir.display()))?;
                let (some, full) = read(&dir.join("memory.pressure"))
                    .ok()
                    .and_then(|t| parse_psi(&t))
                    .unwrap_or((0.0, 0.0));
                Ok(Sample {
                    total,
                    available: total.saturating_sub(current),
                    some_avg10: some,
                    full_avg10: full,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psi_and_meminfo_parse() {
        let psi = "some avg10=1.50 avg60=0.37 avg300=1.13 total=1\nfull avg10=0.25 avg60=0 avg300=0 total=2\n";
        assert_eq!(parse_psi(psi), Some((1.5, 0.25)));
        assert_eq!(parse_psi("garbage"), None);
        let mi = "MemTotal:       24000000 kB\nMemFree: 1 kB\nMemAvailable:   12000000 kB\n";
        assert_eq!(
            parse_meminfo(mi),
            Some((24_000_000 * 1024, 12_000_000 * 1024))
        );
        assert_eq!(parse_meminfo("MemTotal: 5 kB\n"), None);
    }

    #[test]
    fn levels_and_budget() {
        let s = |avail, some, full| Sample {
            total: 1000,
            available: avail,
            some_avg10: some,
            full_avg10: full,
        };
        assert_eq!(level(&s(500, 0.0, 0.0), 100), Level::None);
        assert_eq!(level(&s(90, 0.0, 0.0), 100), Level::Moderate);
        assert_eq!(level(&s(500, 12.0, 0.0), 100), Level::Moderate);
        assert_eq!(level(&s(40, 0.0, 0.0), 100), Level::Severe);
        assert_eq!(level(&s(500, 0.0, 30.0), 100), Level::Severe);
        // Soft memory already held counts as available to soft pools.
        assert_eq!(budget(&s(300, 0.0, 0.0), 200, 100, None), 400);
        assert_eq!(budget(&s(300, 0.0, 0.0), 200, 100, Some(150)), 150);
        assert_eq!(budget(&s(10, 0.0, 0.0), 0, 100, None), 0);
    }

    #[test]
    fn growth_is_held_at_its_peak_and_decays_when_it_stops() {
        let mut g = Growth::default();
        assert_eq!(g.observe(0.0, 1000), 0.0, "one sample: no rate yet");
        // 200 MiB in 0.1 s: 2 GiB/s.
        let r = g.observe(0.1, 1000 + (200 << 20));
        assert!((r - (2000u64 << 20) as f64).abs() < 1.0, "{r}");
        assert_eq!(g.headroom(0.05), 100 << 20);
        // Growing slower: the peak is held (decayed by 0.1 s of its half-life).
        let r = g.observe(0.2, 1000 + (210 << 20));
        assert!(r > 0.9 * (2000u64 << 20) as f64, "{r}");
        // Shrinking or flat for 3 s: an eighth of the peak left.
        let r = g.observe(3.2, 1000);
        assert!(
            r < 0.14 * (2000u64 << 20) as f64 && r > 0.1 * (2000u64 << 20) as f64,
            "{r}"
        );
    }
}
