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

pub mod files;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use gleaner_policy::hermes::{files_to_drop, shortfall, watermark, CachedFile};
use serde_json::json;

use crate::proto::Class;
use files::FileId;

/// How far ahead the watermark looks at the latency-critical processes' allocation rate.
pub const HORIZON_MS: u64 = 1000;
/// The least time between two reclaims: finding the batch files and their residency costs
/// `/proc` reads and a `mincore` per file, which the daemon's 50 ms tick would repeat for a
/// batch job that refills its cache as fast as it is dropped (measured: a fifth of a CPU at
/// 100 ms in the first `bench/hermes.py` runs).
pub const MIN_RECLAIM_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

/// The reclaimer's state: the marked processes, the rate, and what it has dropped.
pub struct Reclaimer {
    marks: BTreeMap<i32, Class>,
    /// Each latency-critical process's resident bytes at the last tick.
    lc_resident: BTreeMap<i32, u64>,
    /// Their growth, bytes per second (a moving average).
    lc_rate: f64,
    last_tick: Option<Instant>,
    last_reclaim: Option<Instant>,
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
    pub fn new(floor: u64) -> Reclaimer {
        Reclaimer {
            marks: BTreeMap::new(),
            lc_resident: BTreeMap::new(),
            lc_rate: 0.0,
            last_tick: None,
            last_reclaim: None,
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
    }

    /// Whether no process is marked.
    pub fn is_empty(&self) -> bool {
        self.marks.is_empty()
    }

    fn pids(&self, class: Class) -> impl Iterator<Item = i32> + '_ {
        self.marks
            .iter()
            .filter(move |(_, &c)| c == class)
            .map(|(&p, _)| p)
    }

    /// One tick with `available` bytes free on the node (or in the daemon's cgroup).
    pub fn tick(&mut self, available: u64) {
        self.marks
            .retain(|pid, _| std::path::Path::new(&format!("/proc/{pid}")).exists());
        self.lc_resident
            .retain(|pid, _| std::path::Path::new(&format!("/proc/{pid}")).exists());
        self.measure_rate();
        if self.marks.is_empty() {
            return;
        }
        self.watermark = watermark(self.lc_rate, HORIZON_MS, self.floor);
        let Some(need) = shortfall(available, self.watermark) else {
            return;
        };
        if self.pids(Class::Batch).next().is_none()
            || self
                .last_reclaim
                .is_some_and(|t| t.elapsed() < MIN_RECLAIM_INTERVAL)
        {
            return;
        }
        self.rounds_under_watermark += 1;
        let started = Instant::now();
        self.last_reclaim = Some(started);
        self.reclaim(need);
        self.scan_secs += started.elapsed().as_secs_f64();
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

    /// Drops batch files' page cache, largest first, until `need` bytes are covered.
    fn reclaim(&mut self, need: u64) {
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
        let sizes: BTreeMap<FileId, u64> = cached.iter().map(|f| (f.key, f.cached)).collect();
        let mut dropped = Vec::new();
        for id in files_to_drop(&cached, need) {
            let path = &paths[&id];
            match files::drop_cache(path) {
                Ok(()) => {
                    let bytes = sizes[&id];
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
    }

    /// The reclaimer's state for `gleaner node status` and `gleaner status`.
    pub fn status(&self) -> serde_json::Value {
        let list = |class| self.pids(class).collect::<Vec<_>>();
        json!({
            "batch_pids": list(Class::Batch),
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

/// A process's resident bytes (`/proc/PID/statm`'s second field).
fn resident_bytes(pid: i32) -> Option<u64> {
    let t = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    Some(t.split_whitespace().nth(1)?.parse::<u64>().ok()? * 4096)
}
