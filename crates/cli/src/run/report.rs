//! What `gleaner run` reports when the program ends: every process's stats and pager report,
//! gathered from a private directory, summed over the run's processes, and the one-line summary
//! printed on stderr.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gleaner_proto::units::format_size;
use serde_json::{json, Map, Value};

use super::SetupError;

/// A private directory where every process of the run writes its stats at exit.
pub(super) struct StatsDir(PathBuf);

impl StatsDir {
    /// The directory.
    pub(super) fn path(&self) -> &Path {
        &self.0
    }

    /// Makes the directory (mode 0700) in the scratch directory.
    pub(super) fn create() -> Result<StatsDir, SetupError> {
        let suffix: [u8; 6] = gleaner_proto::random_bytes();
        let hex: String = suffix.iter().map(|b| format!("{b:02x}")).collect();
        let dir =
            gleaner_pager::scratch_dir().join(format!("gleaner-run-{}-{hex}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| SetupError::new(format!("creating {}: {e}", dir.display())))?;
        Ok(StatsDir(dir))
    }

    /// Every process's start report (`pager-PID.json`, see the preload library), in no order.
    pub(super) fn pager_reports(&self) -> Vec<Value> {
        std::fs::read_dir(&self.0)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("pager-"))
            .filter_map(|e| serde_json::from_str(&std::fs::read_to_string(e.path()).ok()?).ok())
            .collect()
    }

    /// Every program a process of the run started that came up without a pager
    /// (`nopager-PID-N.json`, written by the preload library's `exec` wrappers:
    /// `{"pid", "parent_pid", "program", "reason"}`), in pid order.
    pub(super) fn no_pager_reports(&self) -> Vec<Value> {
        let mut out: Vec<Value> = std::fs::read_dir(&self.0)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("nopager-"))
            .filter_map(|e| serde_json::from_str(&std::fs::read_to_string(e.path()).ok()?).ok())
            .collect();
        out.sort_by_key(|v: &Value| v["pid"].as_u64().unwrap_or(0));
        out
    }

    /// Every process's stats, `{ "pid": N, "stats": {...} }`, in pid order.
    pub(super) fn collect(&self) -> Vec<Value> {
        let mut out: Vec<(u64, Value)> = std::fs::read_dir(&self.0)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let pid = name
                    .strip_prefix("stats-")?
                    .strip_suffix(".json")?
                    .parse()
                    .ok()?;
                let text = std::fs::read_to_string(e.path()).ok()?;
                Some((pid, serde_json::from_str(&text).ok()?))
            })
            .collect();
        out.sort_by_key(|(pid, _)| *pid);
        out.into_iter()
            .map(|(pid, stats)| json!({"pid": pid, "stats": stats}))
            .collect()
    }
}

impl Drop for StatsDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Removes the live status files of the run's processes (see `gleaner status`): those that
/// ended at once (exit 86, `_exit`) could not remove their own.
pub(super) fn remove_status_files(reports: &[Value], running: &[(u64, String)]) {
    let pids: Vec<String> = reports
        .iter()
        .filter_map(|r| r["pid"].as_u64())
        .filter(|p| !running.iter().any(|(r, _)| r == p))
        .map(|p| format!("{p}-"))
        .collect();
    // Every user's directory: a process that gave up root wrote in its new user's.
    let dirs = gleaner_pager::status_dirs();
    for e in dirs
        .iter()
        .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if pids.iter().any(|p| name.starts_with(p.as_str())) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The processes of the run that still run once the program has exited (a daemon it
/// started, which forked away from it): those whose environment names this run's report
/// directory (`GLEANER_REPORT_DIR`, which every process of the run inherits), or that hold a
/// file in it open (every process with a pager does: [`holds_a_file_in`]). A zombie's
/// environment reads empty and it holds no files. (pid, name).
pub(super) fn still_running(report_dir: &Path) -> Vec<(u64, String)> {
    let mut want = b"GLEANER_REPORT_DIR=".to_vec();
    want.extend_from_slice(report_dir.as_os_str().as_encoded_bytes());
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found: Vec<(u64, String)> = procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
        .filter(|&pid| pid != u64::from(std::process::id()))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == want.as_slice()))
                || holds_a_file_in(*pid, report_dir)
        })
        .map(|pid| {
            let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            (pid, name.trim().to_string())
        })
        .collect();
    found.sort();
    found
}

/// Whether process `pid` holds a file in `dir` open. Every process of the run with a pager
/// holds its report files in the run's report directory open (and a fork child inherits its
/// parent's at once), which holds where its environment no longer names the directory: a
/// program may rewrite the memory `/proc/PID/environ` reads (redis's `setproctitle` writes its
/// process title over it).
fn holds_a_file_in(pid: u64, dir: &Path) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target.starts_with(dir)))
}

/// `1 process was` or `N processes were`, for the warnings.
fn processes_were(n: usize) -> String {
    match n {
        1 => "1 process was".to_string(),
        n => format!("{n} processes were"),
    }
}

/// How many processes of the run started their pager, were stopped because it could not start,
/// ran all-local under `--fail-open`, or were stopped later because their far memory failed
/// (from the preload library's `pager-PID.json` reports).
#[derive(Debug, Default, PartialEq)]
pub(super) struct PagerCounts {
    /// Processes whose pager started.
    pub(super) started: usize,
    /// Processes stopped (exit 86) because their pager could not start.
    pub(super) stopped: usize,
    /// Processes that ran entirely in local memory (`--fail-open`).
    pub(super) all_local: usize,
    /// Processes whose pager started, stopped (exit 86) later because far memory failed.
    pub(super) stopped_mid_run: usize,
    /// Processes aborted (`SIGABRT`) by a panic in gleaner's code.
    pub(super) panicked: usize,
    /// The first few that did not start: (pid, program, error).
    failures: Vec<(u64, String, String)>,
    /// The first few stopped mid-run: (pid, program, error).
    stops: Vec<(u64, String, String)>,
    /// The first few panics: (pid, program, message).
    panics: Vec<(u64, String, String)>,
}

impl PagerCounts {
    /// At most this many failures are kept by name.
    const NAMED: usize = 5;

    /// Counts the processes' start reports.
    pub(super) fn from_reports(reports: &[Value]) -> PagerCounts {
        let mut c = PagerCounts::default();
        let mut reports: Vec<&Value> = reports.iter().collect();
        reports.sort_by_key(|r| r["pid"].as_u64());
        let named = |r: &Value| {
            (
                r["pid"].as_u64().unwrap_or(0),
                r["program"].as_str().unwrap_or("?").to_string(),
                r["error"].as_str().unwrap_or("?").to_string(),
            )
        };
        for r in reports {
            match r["pager"].as_str() {
                Some("started") => c.started += 1,
                Some("stopped") => {
                    c.started += 1;
                    c.stopped_mid_run += 1;
                    if c.stops.len() < Self::NAMED {
                        c.stops.push(named(r));
                    }
                }
                Some("panicked") => {
                    c.panicked += 1;
                    if c.panics.len() < Self::NAMED {
                        c.panics.push(named(r));
                    }
                }
                Some(kind @ ("failed" | "fail_open")) => {
                    if kind == "failed" {
                        c.stopped += 1;
                    } else {
                        c.all_local += 1;
                    }
                    if c.failures.len() < Self::NAMED {
                        c.failures.push(named(r));
                    }
                }
                _ => {}
            }
        }
        c
    }

    /// The counts and the failures named, for the run's stats file.
    pub(super) fn to_json(&self) -> Value {
        json!({
            "started": self.started,
            "stopped_pager_failed": self.stopped,
            "all_local_fail_open": self.all_local,
            "failures": self.failures.iter().map(|(pid, program, error)| {
                json!({"pid": pid, "program": program, "error": error})
            }).collect::<Vec<_>>(),
            "stopped_mid_run": self.stopped_mid_run,
            "stops": self.stops.iter().map(|(pid, program, error)| {
                json!({"pid": pid, "program": program, "error": error})
            }).collect::<Vec<_>>(),
            "panicked": self.panicked,
            "panics": self.panics.iter().map(|(pid, program, message)| {
                json!({"pid": pid, "program": program, "message": message})
            }).collect::<Vec<_>>(),
        })
    }

    /// A loud line when gleaner's code panicked in any process (the process aborted): the
    /// message in full, since the program may have hidden its own stderr from it.
    pub(super) fn panics_warning(&self) -> Option<String> {
        let (pid, program, message) = self.panics.first()?;
        let what = processes_were(self.panicked);
        Some(format!(
            "{what} aborted (SIGABRT) by a panic in gleaner's code, a gleaner bug (please \
             report it with this message); first: {program} (pid {pid}): {message}"
        ))
    }

    /// A loud line when any process was stopped after its far memory had started.
    pub(super) fn stops_warning(&self) -> Option<String> {
        let (pid, program, error) = self.stops.first()?;
        let what = processes_were(self.stopped_mid_run);
        Some(format!(
            "{what} stopped (exit 86) because far memory failed while it ran; first: {program} \
             (pid {pid}): {error}"
        ))
    }

    /// A loud line when any process did not run on far memory.
    pub(super) fn warning(&self) -> Option<String> {
        let not = self.stopped + self.all_local;
        if not == 0 {
            return None;
        }
        let what = match (self.stopped, self.all_local) {
            (1, 0) => "it was stopped (exit 86)".to_string(),
            (s, 0) => format!("{s} were stopped (exit 86)"),
            (0, 1) => "it ran entirely in local memory (--fail-open)".to_string(),
            (0, l) => format!("{l} ran entirely in local memory (--fail-open)"),
            (s, l) => format!(
                "{s} were stopped (exit 86) and {l} ran entirely in local memory (--fail-open)"
            ),
        };
        let first = &self.failures[0];
        Some(format!(
            "{not} of {} processes could not start far memory: {what}; first: {} (pid {}): {}",
            self.started + not,
            first.1,
            first.0,
            first.2
        ))
    }
}

/// Fields of a process's stats that are not counters, left out of the sum: latency summaries
/// (the remote faults' is taken from the process with the most remote faults) and gauges.
const NOT_SUMMED: [&str; 4] = [
    "remote_fault_latency",
    "batch_time",
    "batch_pages_next",
    "window_cap",
];

/// Sums the counters of every process (numbers at the top level and below; latency percentiles
/// are not summable, see [`NOT_SUMMED`]).
pub(super) fn sum_stats(processes: &[Value]) -> Value {
    fn add(into: &mut Map<String, Value>, from: &Map<String, Value>) {
        for (k, v) in from {
            if NOT_SUMMED.contains(&k.as_str()) {
                continue;
            }
            match v {
                Value::Number(n) if n.is_u64() => {
                    let cur = into.get(k).and_then(Value::as_u64).unwrap_or(0);
                    into.insert(k.clone(), json!(cur + n.as_u64().unwrap_or(0)));
                }
                Value::Object(inner) => {
                    let slot = into
                        .entry(k.clone())
                        .or_insert_with(|| Value::Object(Map::new()));
                    if let Value::Object(slot) = slot {
                        add(slot, inner);
                    }
                }
                _ => {}
            }
        }
    }
    let mut total = Map::new();
    for p in processes {
        if let Some(Value::Object(s)) = p.get("stats") {
            add(&mut total, s);
        }
    }
    let busiest = processes
        .iter()
        .filter_map(|p| p.get("stats"))
        .max_by_key(|s| s["faults"]["remote"].as_u64().unwrap_or(0));
    if let Some(s) = busiest {
        total.insert(
            "remote_fault_latency".into(),
            s["remote_fault_latency"].clone(),
        );
    }
    total.insert("process_count".into(), json!(processes.len()));
    Value::Object(total)
}

/// The human summary printed at the end of a run.
pub(super) fn summary(report: &Value, wall: Duration) -> String {
    let t = &report["total"];
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let procs = n(&t["process_count"]);
    if procs == 0 {
        let still = report["still_running"].as_array().map_or(0, Vec::len);
        let hung = report["outcome"]
            .as_str()
            .is_some_and(|o| o.starts_with("hung"));
        let why = if hung {
            "its stats went with it"
        } else if report["exit_status"] == gleaner_pager::FATAL_EXIT_CODE {
            "far memory failed and the program was stopped: see the FATAL message above"
        } else if still > 0 {
            "the processes it started on far memory still run (above)"
        } else if report["without_pager"]
            .as_array()
            .is_some_and(|l| !l.is_empty())
        {
            "no process reported far-memory stats; a process of the run ran without a pager (named above)"
        } else {
            "no process reported far-memory stats (it may not use the C allocator, or it was \
             killed)"
        };
        return format!(
            "gleaner run: {} {} in {:.2} s; {why}",
            report["command"][0].as_str().unwrap_or(""),
            report["outcome"].as_str().unwrap_or(""),
            wall.as_secs_f64()
        );
    }
    let lat = &t["remote_fault_latency"];
    // Write prediction installs pages writable only under synchronous tracking; otherwise it
    // runs in shadow and its count is of pages it would have installed so.
    let predicted = if report["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|p| p["stats"]["write_prediction"]["enabled"] == true)
    {
        "installed writable by write prediction"
    } else {
        "predicted written, in shadow"
    };
    let remote = n(&t["faults"]["remote"]);
    // A run with no remote fault has no latency to give (its percentiles read 0).
    let remote_detail = if remote == 0 {
        String::new()
    } else {
        format!(
            " (p50 {:.1} us, p99 {:.1} us; {} {predicted})",
            lat["p50_us"].as_f64().unwrap_or(0.0),
            lat["p99_us"].as_f64().unwrap_or(0.0),
            n(&t["write_prediction"]["predicted"]),
        )
    };
    format!(
        "gleaner run: {} {} in {:.2} s | local budget {} per process, {} process{} on far memory{} | faults: {} \
         zero-fill, {remote} remote{remote_detail}, {} write-protect | \
         evicted: {} clean, {} dirty | reclaim {}: {} pages by reclaim threads ({:.2} s CPU), {} \
         faults waited on direct reclaim | in {} / out {}{}{}{}",
        report["command"][0].as_str().unwrap_or(""),
        report["outcome"].as_str().unwrap_or(""),
        wall.as_secs_f64(),
        format_size(n(&report["local_mem_bytes"])),
        procs,
        if procs == 1 { "" } else { "es" },
        not_on_far_memory(report),
        n(&t["faults"]["zero_fill"]),
        n(&t["faults"]["write_protect"]),
        n(&t["evictions"]["clean"]),
        n(&t["evictions"]["dirty"]),
        report["reclaim"].as_str().unwrap_or("?"),
        n(&t["reclaim"]["pool_pages"]),
        n(&t["reclaim"]["pool_cpu_ns"]) as f64 / 1e9,
        n(&t["reclaim"]["direct_waits"]),
        format_size(n(&t["bytes_in"])),
        format_size(n(&t["bytes_out"])),
        match n(&t["store"]["reconnects"]) {
            0 => String::new(),
            k => format!(" | {k} broken memnode connections replaced"),
        },
        match n(&t["reused_pages"]) {
            0 => String::new(),
            k => format!(" | {k} pages of freed big blocks reused"),
        },
        codec_summary(report),
    )
}

/// A loud line naming the processes of the run that ran without a pager (a static program, a
/// set-user-ID one, or one whose environment lost `LD_PRELOAD`) and why, if any did.
pub(super) fn no_pager_warning(list: &[Value]) -> Option<String> {
    if list.is_empty() {
        return None;
    }
    let named: Vec<String> = list
        .iter()
        .take(8)
        .map(|p| {
            format!(
                "{} (pid {}): {}",
                p["program"].as_str().unwrap_or("?"),
                p["pid"],
                p["reason"].as_str().unwrap_or("?")
            )
        })
        .collect();
    let more = match list.len() {
        0..=8 => String::new(),
        n => format!("; and {} more (see --stats)", n - 8),
    };
    Some(format!(
        "warning: {} of the run ran without far memory: {}{more}",
        match list.len() {
            1 => "1 process".to_string(),
            n => format!("{n} processes"),
        },
        named.join("; ")
    ))
}

/// For the summary: how many processes did not run on far memory, if any did not.
fn not_on_far_memory(report: &Value) -> String {
    let f = &report["far_memory_processes"];
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let failed = match (n(&f["stopped_pager_failed"]), n(&f["all_local_fail_open"])) {
        (0, 0) => String::new(),
        (s, 0) => format!(" ({s} more stopped: far memory could not start)"),
        (0, l) => format!(" ({l} more ran all-local: --fail-open)"),
        (s, l) => format!(" ({s} more stopped, {l} more ran all-local)"),
    };
    match report["without_pager"].as_array().map_or(0, Vec::len) {
        0 => failed,
        k => format!("{failed} ({k} more without a pager, named above)"),
    }
}

/// What the page codec did, for the summary: the far memory the pages took and the codec's
/// cost per page.
fn codec_summary(report: &Value) -> String {
    let t = &report["total"]["store"];
    let c = &t["codec"];
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let per = |ns: &Value, count: &Value| match n(count) {
        0 => 0.0,
        k => n(ns) as f64 / k as f64 / 1000.0,
    };
    let encoded = n(&c["pages_encoded"]);
    if encoded == 0 {
        return String::new();
    }
    let ratio = (encoded * PAGE_BYTES) as f64 / n(&c["blob_bytes"]).max(1) as f64;
    let held = if n(&t["peak_resident_bytes"]) > 0 {
        format!(
            ", far memory used at most {}",
            format_size(n(&t["peak_resident_bytes"]))
        )
    } else {
        String::new()
    };
    // `auto`: which compressor it came to, and why, where the link made it choose zstd.
    let compress = match (report["compress"].as_str(), n(&c["zstd_for_link"])) {
        (Some("auto"), 0) => "auto (lz4)".to_string(),
        (Some("auto"), z) => format!(
            "auto (zstd for {}% of pages, measured against lz4 over the link)",
            (z * 100).div_ceil(encoded.max(1))
        ),
        (other, _) => other.unwrap_or("?").to_string(),
    };
    format!(
        " | codec: {compress} {ratio:.1}x{held}, {} ({:.2} us to decompress a page, {:.2} us to \
         open it; {} authentication failures)",
        if report["encrypt"] == true {
            "sealed with AES-256-GCM"
        } else {
            "not encrypted"
        },
        per(&c["decompress_ns_total"], &c["pages_decoded"]),
        per(&c["open_ns_total"], &c["blobs_open_timed"]),
        n(&c["auth_failures"]),
    )
}

/// Bytes per page, as a u64.
const PAGE_BYTES: u64 = gleaner_proto::PAGE_SIZE as u64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pager_reports_are_counted_and_the_first_failure_named() {
        let r = |pid: u64, pager: &str, err: Option<&str>| json!({"pid": pid, "program": format!("p{pid}"), "pager": pager, "error": err});
        let all_started = PagerCounts::from_reports(&[r(1, "started", None)]);
        assert_eq!(all_started.warning(), None);
        let mixed = PagerCounts::from_reports(&[
            r(9, "failed", Some("late")),
            r(3, "started", None),
            r(5, "failed", Some("no token")),
            r(7, "fail_open", Some("gone")),
            json!({"pager": "garbage"}),
        ]);
        assert_eq!((mixed.started, mixed.stopped, mixed.all_local), (1, 2, 1));
        let w = mixed.warning().unwrap();
        assert!(w.starts_with("3 of 4 processes could not start far memory: 2 were stopped (exit 86) and 1 ran entirely in local memory"), "{w}");
        assert!(w.ends_with("first: p5 (pid 5): no token"), "{w}");
        assert_eq!(mixed.to_json()["failures"].as_array().unwrap().len(), 3);
        assert_eq!(mixed.stops_warning(), None);
        let stops = PagerCounts::from_reports(&[
            r(4, "stopped", Some("the memnode is full")),
            r(2, "started", None),
            r(6, "stopped", Some("lost")),
        ]);
        assert_eq!(
            (stops.started, stops.stopped, stops.stopped_mid_run),
            (3, 0, 2)
        );
        assert_eq!(stops.warning(), None, "they all started");
        let w = stops.stops_warning().unwrap();
        assert!(w.starts_with("2 processes were stopped (exit 86) because far memory failed while it ran; first: p4 (pid 4): the memnode is full"), "{w}");
        assert_eq!(stops.to_json()["stopped_mid_run"], 2);
        assert_eq!(stops.to_json()["stops"][1]["error"], "lost");
        assert_eq!(stops.panics_warning(), None);
        let panics = PagerCounts::from_reports(&[
            r(
                8,
                "panicked",
                Some("thread 'gleaner-watchdog' panicked at x.rs:1:2:\nboom"),
            ),
            r(2, "started", None),
        ]);
        assert_eq!((panics.started, panics.panicked), (1, 1));
        let w = panics.panics_warning().unwrap();
        assert!(
            w.starts_with("1 process was aborted (SIGABRT) by a panic in gleaner's code"),
            "{w}"
        );
        assert!(
            w.ends_with("first: p8 (pid 8): thread 'gleaner-watchdog' panicked at x.rs:1:2:\nboom"),
            "{w}"
        );
        assert_eq!(panics.to_json()["panicked"], 1);
    }

    #[test]
    fn summary_reports_the_codec_summed_over_processes() {
        let p = |encoded: u64, blob: u64, decoded: u64, ns: u64| {
            json!({"pid": 1, "stats": {"faults": {"remote": 1}, "store": {
                "peak_resident_bytes": 1 << 20,
                "codec": {"pages_encoded": encoded, "blob_bytes": blob, "pages_decoded": decoded,
                          "decompress_ns_total": ns, "blobs_opened": decoded,
                          "blobs_open_timed": decoded / 5,
                          "open_ns_total": ns / 2, "auth_failures": 0,
                          "compress_ns_per_page": 999.0}}}})
        };
        let procs = [p(100, 40 * 4096, 10, 5000), p(300, 60 * 4096, 30, 15000)];
        let report = json!({"command": ["prog"], "outcome": "exited with status 0",
                            "local_mem_bytes": 1, "reclaim": "hermit", "compress": "lz4",
                            "encrypt": true, "processes": procs, "total": sum_stats(&procs)});
        let s = summary(&report, Duration::from_secs(1));
        // 400 pages in 100 pages' worth of blobs; 20 us over 40 decodes; 10 us over the 8
        // opens timed.
        assert!(
            s.contains("codec: lz4 4.0x, far memory used at most 2.00 MiB"),
            "{s}"
        );
        assert!(
            s.contains("0.50 us to decompress a page, 1.25 us to open it"),
            "{s}"
        );
        assert!(s.contains("sealed with AES-256-GCM"), "{s}");
        let failed = json!({"command": ["prog"], "outcome": "exited with status 86",
                            "exit_status": gleaner_pager::FATAL_EXIT_CODE, "processes": [],
                            "total": sum_stats(&[])});
        let f = summary(&failed, Duration::from_secs(1));
        assert!(f.contains("far memory failed"), "{f}");
        let mut quiet = report.clone();
        quiet["total"]["store"]["codec"]["pages_encoded"] = json!(0);
        assert!(!summary(&quiet, Duration::from_secs(1)).contains("codec:"));
    }

    #[test]
    fn summary_says_whether_write_prediction_installed_pages_or_ran_in_shadow() {
        let report = |enabled: bool| {
            let p = json!({"pid": 1, "stats": {
                "faults": {"remote": 9}, "write_prediction": {"enabled": enabled, "predicted": 7}
            }});
            json!({"command": ["prog"], "outcome": "exited with status 0", "local_mem_bytes": 1,
                   "reclaim": "hermit", "processes": [p.clone()], "total": sum_stats(&[p])})
        };
        let on = summary(&report(true), Duration::from_secs(1));
        assert!(
            on.contains("7 installed writable by write prediction"),
            "{on}"
        );
        let shadow = summary(&report(false), Duration::from_secs(1));
        assert!(
            shadow.contains("7 predicted written, in shadow"),
            "{shadow}"
        );
    }

    #[test]
    fn a_summary_without_remote_faults_gives_no_latency() {
        let p = |remote: u64| {
            json!({"pid": 1, "stats": {
                "faults": {"zero_fill": 3, "remote": remote},
                "remote_fault_latency": {"p50_us": 4.5, "p99_us": 9.5}
            }})
        };
        let report = |p: Value| {
            json!({"command": ["prog"], "outcome": "exited with status 0", "local_mem_bytes": 1,
                   "reclaim": "hermit", "processes": [p.clone()], "total": sum_stats(&[p])})
        };
        let none = summary(&report(p(0)), Duration::from_secs(1));
        assert!(
            none.contains("faults: 3 zero-fill, 0 remote, 0 write-protect"),
            "{none}"
        );
        let some = summary(&report(p(2)), Duration::from_secs(1));
        assert!(
            some.contains("2 remote (p50 4.5 us, p99 9.5 us; 0 predicted written, in shadow)"),
            "{some}"
        );
    }

    #[test]
    fn stats_are_summed_over_processes() {
        let p = |pid: u64, zero: u64, remote: u64, p50: f64| {
            json!({"pid": pid, "stats": {
                "faults": {"zero_fill": zero, "remote": remote},
                "bytes_in": remote * 4096,
                "remote_fault_latency": {"p50_us": p50},
                "evictions": {"batches": remote, "batch_pages_next": 16,
                              "batch_time": {"count": remote, "p99_us": p50}},
                "policy": "fifo"
            }})
        };
        let total = sum_stats(&[p(1, 10, 5, 20.0), p(2, 1, 50, 30.0)]);
        assert_eq!(total["faults"]["zero_fill"], 11);
        // Counters add up; a gauge and a latency summary are no sums.
        assert_eq!(total["evictions"]["batches"], 55);
        assert!(total["evictions"].get("batch_pages_next").is_none());
        assert!(total["evictions"].get("batch_time").is_none());
        assert_eq!(total["faults"]["remote"], 55);
        assert_eq!(total["bytes_in"], 55 * 4096);
        assert_eq!(total["remote_fault_latency"]["p50_us"], 30.0);
        assert_eq!(total["process_count"], 2);
    }
}
