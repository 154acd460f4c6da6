//! Live status for `gleaner status`: a region that publishes (the preload library's do) writes a
//! small JSON document every [`STATUS_INTERVAL`] into the status directory, and removes it when
//! the region stops. Like the stats trace, the publisher only reads counters.
//!
//! The directory is `$GLEANER_STATUS_DIR`, else `gleaner-status-UID` in the system's directory
//! for such files ([`crate::system_dir`]: `/dev/shm`, else `/tmp`, never the program's
//! `$TMPDIR`), created owner-only. A process publishes once it has run for
//! [`FIRST_STATUS_AFTER`]: most processes of a shell script end before that, and writing a
//! document each would cost them more than their own work. Each file is `PID-N.json` (N counts
//! the process's regions), replaced atomically (written beside, then renamed), so a reader never
//! sees half of one.
//!
//! A process that gives up root (`memcached -u nobody`) can no longer write into root's
//! directory: its publisher moves the file to the directory of the user it became, and
//! `gleaner status` run as root reads every user's directory ([`status_dirs`]). A directory
//! that another user owns, or that others may read, is not written into.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;

use crate::engine::Engine;

/// How often a region's status file is rewritten.
pub const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// How long a region runs before its first status file (see the module documentation).
pub const FIRST_STATUS_AFTER: Duration = Duration::from_millis(200);

/// Where status directories go, read from the environment once (at a region's start): the
/// directory `$GLEANER_STATUS_DIR` names, if any, and the system directory. The publisher thread
/// must not read the environment later: a program may have moved it into managed memory
/// (redis's `setproctitle` does), and a pager thread must not fault on it.
fn places() -> &'static (Option<PathBuf>, PathBuf) {
    static PLACES: OnceLock<(Option<PathBuf>, PathBuf)> = OnceLock::new();
    PLACES.get_or_init(|| {
        let explicit = std::env::var_os("GLEANER_STATUS_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from);
        (explicit, crate::system_dir())
    })
}

/// The directory status files go to (see the module documentation).
pub fn status_dir() -> PathBuf {
    let (explicit, scratch) = places();
    if let Some(d) = explicit {
        return d.clone();
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    scratch.join(format!("gleaner-status-{uid}"))
}

/// Every directory `gleaner status` reads: `$GLEANER_STATUS_DIR` if set; else this user's, and,
/// for root, every user's `gleaner-status-UID` beside it (a program that gave up root publishes
/// in the directory of the user it became).
pub fn status_dirs() -> Vec<PathBuf> {
    let own = status_dir();
    let (explicit, scratch) = places();
    // SAFETY: geteuid has no preconditions.
    if explicit.is_some() || unsafe { libc::geteuid() } != 0 {
        return vec![own];
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(scratch)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("gleaner-status-")
        })
        .map(|e| e.path())
        .filter(|p| *p != own)
        .collect();
    dirs.sort();
    dirs.insert(0, own);
    dirs
}

/// This user's status directory, created owner-only if missing; the default one
/// (`gleaner-status-UID`) is refused if another user owns it or others may read it (its
/// documents would be theirs to read, or to forge). One named by `$GLEANER_STATUS_DIR` is the
/// user's choice.
fn own_dir() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = status_dir();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)?;
    if places().0.is_some() {
        return Ok(dir);
    }
    let meta = std::fs::metadata(&dir)?;
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    if meta.uid() != uid || meta.permissions().mode() & 0o077 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "owned by uid {} with mode {:o}, not by uid {uid} with 0700",
                meta.uid(),
                meta.permissions().mode() & 0o7777
            ),
        ));
    }
    Ok(dir)
}

/// This process's next status file.
pub(crate) fn next_path() -> std::io::Result<PathBuf> {
    static REGIONS: AtomicU64 = AtomicU64::new(0);
    let dir = own_dir()?;
    let n = REGIONS.fetch_add(1, Ordering::Relaxed);
    Ok(dir.join(format!("{}-{n}.json", std::process::id())))
}

/// Whether a region still publishes, and where: shared by the region and its publisher thread.
pub(crate) struct Publication {
    path: Mutex<PathBuf>,
    withdrawn: AtomicBool,
}

impl Publication {
    pub(crate) fn new(path: PathBuf) -> Arc<Publication> {
        Arc::new(Publication {
            path: Mutex::new(path),
            withdrawn: AtomicBool::new(false),
        })
    }

    /// Where the file is now.
    fn path(&self) -> PathBuf {
        self.path
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops publishing and removes the file (a process about to exit: its region is never
    /// dropped, so its publisher would not remove it).
    pub(crate) fn withdraw(&self) {
        self.withdrawn.store(true, Ordering::SeqCst);
        let _ = std::fs::remove_file(self.path());
    }

    /// Moves the file to the directory of the user this process now runs as, if that is not
    /// where it is (the process gave up root): the new path, or `None`.
    fn follow_user(&self) -> Option<PathBuf> {
        let mut path = self.path.lock().unwrap_or_else(PoisonError::into_inner);
        if path.parent() == Some(status_dir().as_path()) {
            return None;
        }
        let dir = match own_dir() {
            Ok(dir) => dir,
            Err(e) => {
                log::debug!("no status directory after a change of user: {e}");
                return None;
            }
        };
        // Root's copy stays until `gleaner status` or the launcher removes it (this user may
        // not): it goes stale, and readers keep a process's newest document.
        let _ = std::fs::remove_file(&*path);
        *path = dir.join(path.file_name()?);
        Some(path.clone())
    }

    fn withdrawn(&self) -> bool {
        self.withdrawn.load(Ordering::SeqCst)
    }
}

/// The publisher's loop: a document per interval until the region stops, then the file goes.
pub(crate) fn run(engine: Arc<Engine>, publication: Arc<Publication>) {
    if engine
        .budget
        .nap_unless(FIRST_STATUS_AFTER, || engine.stopping())
    {
        return;
    }
    let program = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let mut last: Option<(Instant, u64, u64, u64)> = None;
    loop {
        let now = Instant::now();
        let s = engine.snapshot();
        let counts = (
            s.faults.remote,
            s.faults.zero_fill,
            s.evictions.clean + s.evictions.dirty,
        );
        let per_s = |now_v: u64, then_v: u64, then_t: Instant| {
            let dt = now.duration_since(then_t).as_secs_f64().max(1e-3);
            (now_v.saturating_sub(then_v) as f64 / dt).round()
        };
        let rates = match last {
            Some((t, r, z, e)) => json!({
                "remote_faults": per_s(counts.0, r, t),
                "zero_fills": per_s(counts.1, z, t),
                "evictions": per_s(counts.2, e, t),
            }),
            None => json!(null),
        };
        last = Some((now, counts.0, counts.1, counts.2));
        let doc = json!({
            "pid": std::process::id(),
            "program": program,
            "updated_unix_s": SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            "per_second": rates,
            "stats": s,
        });
        if !publication.withdrawn() {
            let text = doc.to_string();
            let mut path = publication.path();
            let mut written = write_atomically(&path, &text);
            if written
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied)
            {
                if let Some(moved) = publication.follow_user() {
                    path = moved;
                    written = write_atomically(&path, &text);
                }
            }
            if let Err(e) = written {
                log::debug!("writing the status file {}: {e}", path.display());
            }
            // Withdrawn while this document was written: it must not stay.
            if publication.withdrawn() {
                let _ = std::fs::remove_file(&path);
            }
        }
        if engine
            .budget
            .nap_unless(STATUS_INTERVAL, || engine.stopping())
        {
            let _ = std::fs::remove_file(publication.path());
            return;
        }
    }
}

/// Writes `text` to `path` through a temporary file beside it and a rename. The file is open
/// for a moment, under the program's descriptor limit as it is: raising it
/// (`gleaner_fds::headroom`) every second would let another thread of the program see a limit
/// it did not set; at its limit, a document is skipped. Written in a `gleaner_fds::making`
/// window: the file may take a number the program just closed and is about to fill.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    gleaner_fds::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}
