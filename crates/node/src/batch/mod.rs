//! The batch reclaimer (Hermes, Middleware'21): processes marked batch give up their page cache
//! under pressure, largest file first, so that latency-critical processes' first touches find
//! free pages instead of direct reclaim.
//!
//! Every tick (the daemon's) the reclaimer forgets processes that exited, measures how fast the
//! latency-critical processes grow (their resident set, summed), and sizes the free memory to
//! keep from that rate ([`gleaner_policy::hermes::watermark`]). When `MemAvailable` (or the
//! daemon's cgroup's room) falls under it, it drops the page cache of the batch processes' files
//! (those they hold open or mapped), largest first, until the shortfall is covered. It never
//! drops a file a latency-critical process holds, and never touches anonymous memory (it only
//! advises the kernel about files).
//!
//! Processes are marked one by one ([`Reclaimer::mark`]) or by cgroup ([`Reclaimer::mark_cgroup`]:
//! every process in the cgroup, read again each tick, for as long as the cgroup exists).
//!
//! A batch job that re-reads its files as fast as they are dropped makes dropping futile: each
//! round costs the daemon's scan and the job's re-reads (CPU the latency-critical processes share)
//! and frees nothing for long. [`Mode::Adaptive`] answers that: the reclaimer drops only the
//! bytes needed, behind the reader of an open file (what a cyclic re-read reaches last), and
//! backs off: when free memory falls back under the watermark sooner than the time between
//! reclaims after one, that time doubles (up to [`BACKOFF_MAX`]); a reclaim that held, or a
//! latency-critical burst (the rate rising by half), resets it. [`Mode::Eager`] (the default)
//! drops whole files every 250 ms while under the watermark: measured in `bench/hermes.py`, it
//! keeps a service's own file cache (RocksDB's tables) in memory beside a streaming batch job,
//! which the adaptive mode does not, for about twice the daemon's CPU.

pub mod files;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gleaner_policy::hermes::{files_to_drop, range_behind, shortfall, watermark, CachedFile};
use serde_json::json;

use crate::proto::Class;
use files::FileId;

/// How far ahead the watermark looks at the latency-critical processes' allocation rate.
pub const HORIZON_MS: u64 = 1000;
/// The least time between two reclaims: finding the batch files and their residency costs
/// `/proc` reads and a page-cache measure per file, which the daemon's 50 ms tick would repeat for a
/// batch job that refills its cache as fast as it is dropped (measured: a fifth of a CPU at
/// 100 ms in the first `bench/hermes.py` runs).
pub const MIN_RECLAIM_INTERVAL: Duration = Duration::from_millis(250);
/// The longest time between reclaims while they are futile (see the module's doc).
pub const BACKOFF_MAX: Duration = Duration::from_millis(4000);

/// How the reclaimer drops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A reclaim every [`MIN_RECLAIM_INTERVAL`] while under the watermark, each dropping whole
    /// files (the default).
    Eager,
    /// Backs off futile reclaims (up to [`BACKOFF_MAX`] apart) and drops only what is needed,
    /// behind the reader of an open file ([`range_behind`]).
    Adaptive,
}

/// The reclaimer's state: the marked processes, the rate, and what it has dropped.
pub struct Reclaimer {
    /// Processes marked by pid.
    marks: BTreeMap<i32, Class>,
    /// Cgroups marked (their `cgroup.procs`), and how many processes each held at the last tick.
    cgroups: BTreeMap<PathBuf, (Class, usize)>,
    /// The marks in force: the cgroups' members, overridden by the marks by pid.
    effective: BTreeMap<i32, Class>,
    /// Each latency-critical process's resident bytes at the last tick.
    lc_resident: BTreeMap<i32, u64>,
    /// Their growth, bytes per second (a moving average).
    lc_rate: f64,
    last_tick: Option<Instant>,
    last_reclaim: Option<Instant>,
    /// The time kept between reclaims now (doubled while they are futile).
    interval: Duration,
    /// How it drops.
    mode: Mode,
    /// Since when free memory has been at or above the watermark (None: under it).
    above_since: Option<Instant>,
    /// The last reclaim's outcome, until judged: whether free memory went back above the
    /// watermark for a whole interval after it (it held).
    judge: Option<bool>,
    /// The latency-critical rate at the last reclaim.
    rate_at_reclaim: f64,
    /// Ticks under the watermark on which a reclaim waited, backing off.
    backoffs: u64,
    /// Reclaims in a row that found nothing to drop (no batch file had pages cached): each
    /// doubles the wait before the next, in either mode (a scan that can free nothing is pure
    /// cost).
    empty_rounds: u32,
    /// The least free memory kept, whatever the rate.
    floor: u64,
    watermark: u64,
    drops: u64,
    dropped_bytes: u64,
    rounds_under_watermark: u64,
    scan_secs: f64,
    last_dropped: Vec<serde_json::Value>,
}

impl Reclaimer {
    /// A reclaimer that keeps at least `floor` bytes free while anything is marked.
    pub fn new(floor: u64, mode: Mode) -> Reclaimer {
        Reclaimer {
            marks: BTreeMap::new(),
            cgroups: BTreeMap::new(),
            effective: BTreeMap::new(),
            lc_resident: BTreeMap::new(),
            lc_rate: 0.0,
            last_tick: None,
            last_reclaim: None,
            interval: MIN_RECLAIM_INTERVAL,
            mode,
            above_since: None,
            judge: None,
            rate_at_reclaim: 0.0,
            backoffs: 0,
            empty_rounds: 0,
            floor,
            watermark: floor,
            drops: 0,
            dropped_bytes: 0,
            rounds_under_watermark: 0,
            scan_secs: 0.0,
            last_dropped: Vec::new(),
        }
    }

    /// Marks `pid` (until it exits).
    pub fn mark(&mut self, pid: i32, class: Class) {
        log::info!("pid {pid} marked {class:?}");
        self.marks.insert(pid, class);
        self.effective.insert(pid, class);
    }

    /// Marks every process in the cgroup directory `dir` (one holding `cgroup.procs`, v1 or v2)
    /// as long as the cgroup exists, processes that join it later included; the number of its
    /// processes now. A process also marked by pid keeps that mark.
    pub fn mark_cgroup(&mut self, dir: &Path, class: Class) -> std::io::Result<usize> {
        let members = cgroup_members(dir)?;
        log::info!(
            "cgroup {} marked {class:?} ({} processes)",
            dir.display(),
            members.len()
        );
        self.cgroups
            .insert(dir.to_path_buf(), (class, members.len()));
        self.refresh_effective();
        Ok(members.len())
    }

    /// Whether nothing is marked.
    pub fn is_empty(&self) -> bool {
        self.marks.is_empty() && self.cgroups.is_empty()
    }

    /// Reads the marked cgroups' members again (forgetting cgroups that are gone) and rebuilds
    /// the marks in force.
    fn refresh_effective(&mut self) {
        let mut effective = BTreeMap::new();
        self.cgroups
            .retain(|dir, (class, count)| match cgroup_members(dir) {
                Ok(pids) => {
                    *count = pids.len();
                    effective.extend(pids.into_iter().map(|p| (p, *class)));
                    true
                }
                Err(e) => {
                    log::info!("marked cgroup {} is gone ({e}): unmarked", dir.display());
                    false
                }
            });
        effective.extend(self.marks.iter().map(|(&p, &c)| (p, c)));
        self.effective = effective;
    }

    fn pids(&self, class: Class) -> impl Iterator<Item = i32> + '_ {
        self.effective
            .iter()
            .filter(move |(_, &c)| c == class)
            .map(|(&p, _)| p)
    }

    /// One tick with `available` bytes free on the node (or in the daemon's cgroup).
    pub fn tick(&mut self, available: u64) {
        self.marks
            .retain(|pid, _| std::path::Path::new(&format!("/proc/{pid}")).exists());
        self.refresh_effective();
        self.lc_resident
            .retain(|pid, _| std::path::Path::new(&format!("/proc/{pid}")).exists());
        self.measure_rate();
        if self.is_empty() {
            return;
        }
        self.watermark = watermark(self.lc_rate, HORIZON_MS, self.floor);
        let now = Instant::now();
        let Some(need) = shortfall(available, self.watermark) else {
            let since = *self.above_since.get_or_insert(now);
            if now.duration_since(since) >= self.interval && self.judge.is_some() {
                self.judge = Some(true);
            }
            return;
        };
        self.above_since = None;
        if self.pids(Class::Batch).next().is_none() {
            return;
        }
        if let Some(last) = self.last_reclaim {
            if now.duration_since(last) < MIN_RECLAIM_INTERVAL {
                return;
            }
            // Judged once, when free memory is first back under the watermark: the last reclaim
            // was futile unless free memory stayed above it a whole interval after it.
            if let Some(held) = self.judge.take() {
                self.interval = if held {
                    MIN_RECLAIM_INTERVAL
                } else {
                    (self.interval * 2).min(match self.mode {
                        Mode::Adaptive => BACKOFF_MAX,
                        Mode::Eager => MIN_RECLAIM_INTERVAL,
                    })
                };
            }
            // A burst of the latency-critical processes ends any backoff.
            if self.lc_rate > 1.5 * self.rate_at_reclaim + (1 << 20) as f64 {
                self.interval = MIN_RECLAIM_INTERVAL;
                self.empty_rounds = 0;
            }
            if now.duration_since(last) < self.wait() {
                self.backoffs += 1;
                return;
            }
        }
        self.rounds_under_watermark += 1;
        self.last_reclaim = Some(now);
        self.judge = Some(false);
        self.rate_at_reclaim = self.lc_rate;
        let dropped = self.reclaim(need);
        self.empty_rounds = if dropped == 0 {
            self.empty_rounds.saturating_add(1)
        } else {
            0
        };
        self.scan_secs += now.elapsed().as_secs_f64();
    }

    /// The time to keep between reclaims now: the interval, doubled for each reclaim in a row
    /// that found nothing to drop, up to [`BACKOFF_MAX`].
    fn wait(&self) -> Duration {
        let doubled = MIN_RECLAIM_INTERVAL
            .checked_mul(1 << self.empty_rounds.min(16))
            .unwrap_or(BACKOFF_MAX)
            .min(BACKOFF_MAX);
        self.interval.max(doubled)
    }

    /// Updates the latency-critical processes' growth rate from their resident sets.
    fn measure_rate(&mut self) {
        let now = Instant::now();
        let secs = self
            .last_tick
            .replace(now)
            .map_or(0.0, |t| now.duration_since(t).as_secs_f64());
        let mut grown = 0u64;
        let lc: Vec<i32> = self.pids(Class::LatencyCritical).collect();
        for pid in lc {
            let Some(now_bytes) = resident_bytes(pid) else {
                continue;
            };
            if let Some(before) = self.lc_resident.insert(pid, now_bytes) {
                grown += now_bytes.saturating_sub(before);
            }
        }
        if secs > 0.0 {
            let rate = grown as f64 / secs;
            // A fast rise, a slow decay: the watermark must be there when a burst comes back.
            self.lc_rate = if rate > self.lc_rate {
                rate
            } else {
                0.9 * self.lc_rate + 0.1 * rate
            };
        }
    }

    /// Drops batch files' page cache, largest first, until `need` bytes are covered; the bytes
    /// dropped.
    fn reclaim(&mut self, need: u64) -> u64 {
        let before = self.dropped_bytes;
        let protected: BTreeSet<FileId> = self
            .pids(Class::LatencyCritical)
            .flat_map(|pid| files::held_files(pid).into_keys())
            .collect();
        let mut paths: BTreeMap<FileId, std::path::PathBuf> = BTreeMap::new();
        for pid in self.pids(Class::Batch).collect::<Vec<_>>() {
            for (id, path) in files::held_files(pid) {
                if !protected.contains(&id) {
                    paths.entry(id).or_insert(path);
                }
            }
        }
        let cached: Vec<CachedFile<FileId>> = paths
            .iter()
            .filter_map(|(id, path)| {
                Some(CachedFile {
                    key: *id,
                    cached: files::cached_bytes(path)?,
                })
            })
            .collect();
        let cached_of: BTreeMap<FileId, u64> = cached.iter().map(|f| (f.key, f.cached)).collect();
        let mut dropped = Vec::new();
        for (id, bytes) in files_to_drop(&cached, need) {
            let path = &paths[&id];
            // Only what is needed, behind the reader when the file is open (see `range_behind`).
            let size = files::size(path).unwrap_or(0);
            let (ranges, bytes) = match self.mode {
                Mode::Adaptive => (range_behind(size, files::position(path), bytes), bytes),
                Mode::Eager => (vec![(0, size)], cached_of[&id]),
            };
            match files::drop_cache(path, &ranges) {
                Ok(()) => {
                    self.drops += 1;
                    self.dropped_bytes += bytes;
                    let shown = std::fs::read_link(path).unwrap_or_else(|_| path.clone());
                    dropped.push(json!({"file": shown.display().to_string(), "bytes": bytes}));
                }
                Err(e) => log::warn!("dropping the page cache of {}: {e}", path.display()),
            }
        }
        if !dropped.is_empty() {
            log::info!("under the watermark by {need} bytes: dropped {dropped:?}");
            self.last_dropped = dropped;
        }
        self.dropped_bytes - before
    }

    /// The reclaimer's state for `gleaner node status` and `gleaner status`.
    pub fn status(&self) -> serde_json::Value {
        let list = |class| self.pids(class).collect::<Vec<_>>();
        json!({
            "batch_pids": list(Class::Batch),
            "cgroups": self.cgroups.iter().map(|(dir, (class, n))| json!({
                "path": dir.display().to_string(), "class": class, "processes": n,
            })).collect::<Vec<_>>(),
            "reclaim_interval_s": self.interval.as_secs_f64(),
            "mode": format!("{:?}", self.mode).to_lowercase(),
            "ticks_backing_off": self.backoffs,
            "empty_rounds": self.empty_rounds,
            "latency_critical_pids": list(Class::LatencyCritical),
            "lc_alloc_bytes_per_s": self.lc_rate,
            "watermark_bytes": self.watermark,
            "floor_bytes": self.floor,
            "rounds_under_watermark": self.rounds_under_watermark,
            "drops": self.drops,
            "dropped_bytes": self.dropped_bytes,
            "scan_seconds": self.scan_secs,
            "last_dropped": self.last_dropped,
        })
    }
}

/// The processes in the cgroup directory `dir` (its `cgroup.procs`).
pub fn cgroup_members(dir: &Path) -> std::io::Result<Vec<i32>> {
    let text = std::fs::read_to_string(dir.join("cgroup.procs"))?;
    Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// A process's resident bytes (`/proc/PID/statm`'s second field).
fn resident_bytes(pid: i32) -> Option<u64> {
    let t = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    Some(t.split_whitespace().nth(1)?.parse::<u64>().ok()? * 4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reclaims that found nothing to drop back off, doubling up to the cap, in either mode;
    /// one that dropped something would reset the count (`tick`).
    #[test]
    fn empty_reclaims_back_off_to_the_cap() {
        for mode in [Mode::Eager, Mode::Adaptive] {
            let mut r = Reclaimer::new(1 << 20, mode);
            assert_eq!(r.wait(), MIN_RECLAIM_INTERVAL);
            r.empty_rounds = 1;
            assert_eq!(r.wait(), 2 * MIN_RECLAIM_INTERVAL);
            r.empty_rounds = 3;
            assert_eq!(r.wait(), 8 * MIN_RECLAIM_INTERVAL);
            r.empty_rounds = 40;
            assert_eq!(r.wait(), BACKOFF_MAX);
        }
    }
}
