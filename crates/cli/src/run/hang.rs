//! `gleaner run`'s backstop against a process that hangs on its own far memory.
//!
//! A process's own watchdog stops it (exit 86) when one of its pager threads waits for a page of
//! its far memory (`gleaner_pager::stuck`); where even the watchdog waits, nothing inside the
//! process can act. So the launcher, which never runs on far memory, takes the same look at
//! every process of the run once a second, and ends one whose fault handlers have all waited
//! for [`LAUNCHER_CHECKS`] checks: it says so, naming the process and the threads, kills it, and
//! writes its report as stopped, so that the run fails with exit 86 (a hung process would
//! otherwise keep the program, or the private memnode, waiting forever).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use gleaner_pager::stuck::{StuckWatch, LAUNCHER_CHECKS, LAUNCHER_LONG_WAIT_EXTRA};

/// How often the processes are looked at.
const PERIOD: Duration = Duration::from_secs(1);

/// The watching thread; [`HangWatch::stop`] ends it.
pub(super) struct HangWatch {
    /// Dropped to stop the thread at once (it waits on the other end between looks): a
    /// thread that slept its period out kept every run's exit waiting up to a second.
    stop: Option<mpsc::Sender<()>>,
    ended: Arc<Mutex<Vec<u32>>>,
    thread: Option<JoinHandle<()>>,
}

impl HangWatch {
    /// Starts watching the processes that report to `report_dir` (their `pager-PID.json`).
    pub(super) fn start(report_dir: &Path) -> HangWatch {
        let (stop, stopped) = mpsc::channel::<()>();
        let ended = Arc::new(Mutex::new(Vec::new()));
        let dir = report_dir.to_path_buf();
        let thread = {
            let ended = ended.clone();
            std::thread::Builder::new()
                .name("gleaner-hangs".into())
                .spawn(move || {
                    let mut watches = HashMap::new();
                    loop {
                        look(&dir, &mut watches, &ended, None);
                        match stopped.recv_timeout(PERIOD) {
                            Err(mpsc::RecvTimeoutError::Timeout) => {}
                            _ => break,
                        }
                    }
                })
                .ok()
        };
        HangWatch {
            stop: Some(stop),
            ended,
            thread,
        }
    }

    /// Stops watching; returns the pids it ended.
    pub(super) fn stop(mut self) -> Vec<u32> {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        ended.clone()
    }
}

/// Once the program has exited: looks at the processes that still run (`pids`) a while
/// longer if any of them has a pager thread waiting now, and ends those that hang; a daemon
/// whose pager is healthy is left to run. Returns the pids it ended.
pub(super) fn settle_leftovers(report_dir: &Path, pids: &[u32]) -> Vec<u32> {
    let ended = Arc::new(Mutex::new(Vec::new()));
    let mut watches = HashMap::new();
    for _ in 0..=LAUNCHER_CHECKS {
        if !look(report_dir, &mut watches, &ended, Some(pids)) {
            break;
        }
        std::thread::sleep(PERIOD);
    }
    let ended = ended.lock().unwrap_or_else(|e| e.into_inner());
    ended.clone()
}

/// One look at the run's processes (or only `only`). Returns whether any of them has a pager
/// thread waiting now.
fn look(
    dir: &Path,
    watches: &mut HashMap<u32, StuckWatch>,
    ended: &Mutex<Vec<u32>>,
    only: Option<&[u32]>,
) -> bool {
    let pids: Vec<u32> = match only {
        Some(pids) => pids.to_vec(),
        None => reporting(dir),
    };
    watches.retain(|pid, _| pids.contains(pid));
    let mut any = false;
    for pid in pids {
        let watch = watches.entry(pid).or_default();
        let Some(look) = watch.check(Some(pid)) else {
            continue;
        };
        any |= !look.waiting.is_empty();
        let Some(why) = look.hung(LAUNCHER_CHECKS, LAUNCHER_LONG_WAIT_EXTRA) else {
            continue;
        };
        // The pid is the run's process still (not reused): it holds its report file open.
        if !holds(pid, &dir.join(format!("pager-{pid}.json"))) {
            continue;
        }
        let program = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let why = format!(
            "hung: {why} (a gleaner bug: please report it with this message); ended by gleaner \
             run"
        );
        eprintln!("gleaner run: {program} (pid {pid}) {why}");
        // SAFETY: kill takes a pid and a signal by value.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        let report = serde_json::json!({
            "pid": pid,
            "program": program,
            "pager": "stopped",
            "error": why,
        });
        let _ = std::fs::write(dir.join(format!("pager-{pid}.json")), report.to_string());
        ended.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
        watches.remove(&pid);
    }
    any
}

/// The pids with a report in `dir` (`pager-PID.json`).
fn reporting(dir: &Path) -> Vec<u32> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix("pager-")?
                .strip_suffix(".json")?
                .parse()
                .ok()
        })
        .collect()
}

/// Whether process `pid` holds `file` open.
fn holds(pid: u32, file: &Path) -> bool {
    let file: PathBuf = file.to_path_buf();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stopping_the_watcher_does_not_wait_out_its_period() {
        let dir = std::env::temp_dir().join(format!("gleaner-hangwatch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let watch = HangWatch::start(&dir);
        // Let it finish its first look and start waiting.
        std::thread::sleep(Duration::from_millis(50));
        let t = std::time::Instant::now();
        assert!(watch.stop().is_empty());
        // Every `gleaner run` waits for this at its end: a watcher that slept its period out
        // made each run a second longer.
        assert!(t.elapsed() < PERIOD / 2, "stopping took {:?}", t.elapsed());
        std::fs::remove_dir_all(dir).ok();
    }
}
