//! The client side of `gleaner node`: where its socket is, connecting to it, and starting one
//! on demand (the way `gleaner run` starts its embedded memnode) when none answers.

use std::io;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The environment variable that names the daemon's socket for clients and the daemon alike.
pub const SOCKET_ENV: &str = "GLEANER_NODE_SOCKET";

/// The default socket: `$GLEANER_NODE_SOCKET`, else `/run/gleaner/node.sock` for root, else
/// `/dev/shm/gleaner-node-<uid>.sock`.
pub fn default_socket() -> PathBuf {
    if let Some(p) = std::env::var_os(SOCKET_ENV) {
        return PathBuf::from(p);
    }
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(0);
    if uid == 0 {
        PathBuf::from("/run/gleaner/node.sock")
    } else {
        PathBuf::from(format!("/dev/shm/gleaner-node-{uid}.sock"))
    }
}

/// The `gleaner` binary to start a daemon with: `$GLEANER_BIN`, else `gleaner` next to the
/// running executable, else `gleaner` on `PATH`.
pub fn gleaner_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GLEANER_BIN") {
        return Some(PathBuf::from(p));
    }
    if let Ok(exe) = std::env::current_exe() {
        if exe.file_name().is_some_and(|n| n == "gleaner") {
            return Some(exe);
        }
        if let Some(p) = exe
            .parent()
            .map(|d| d.join("gleaner"))
            .filter(|p| p.is_file())
        {
            return Some(p);
        }
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("gleaner"))
            .find(|p| p.is_file())
    })
}

/// Connects to the daemon at `socket`; with `autostart`, starts one (`gleaner node --socket
/// SOCKET --exit-when-idle 60`, in its own process group) if none answers, and waits up to 5 s
/// for it.
pub fn connect(socket: &Path, autostart: bool) -> io::Result<UnixStream> {
    match UnixStream::connect(socket) {
        Ok(s) => return Ok(s),
        Err(e) if !autostart => return Err(e),
        Err(_) => {}
    }
    let bin = gleaner_binary().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "no gleaner node is running and no gleaner binary was found to start one \
             (set GLEANER_BIN or put gleaner on PATH)",
        )
    })?;
    let mut child = Command::new(&bin)
        .arg("node")
        .arg("--socket")
        .arg(socket)
        .args(["--exit-when-idle", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("starting {}: {e}", bin.display())))?;
    // Reap it whenever it exits (it may well outlive us: it is then init's child).
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match UnixStream::connect(socket) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "started {} node but it did not answer on {}: {e}",
                        bin.display(),
                        socket.display()
                    ),
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Asks the daemon at `socket` for its state (the JSON of `gleaner node status`).
pub fn status(socket: &Path) -> Result<serde_json::Value, String> {
    let s = UnixStream::connect(socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    crate::proto::send(&s, &crate::proto::Request::Status, None).map_err(|e| e.to_string())?;
    match crate::proto::recv::<crate::proto::Reply>(&s)
        .map_err(|e| e.to_string())?
        .0
    {
        crate::proto::Reply::Status { state } => Ok(state),
        crate::proto::Reply::Error { error } => Err(error),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

/// Marks the cgroup at `dir` for the batch reclaimer, starting a daemon if `autostart` and
/// none runs; the number of processes in it now.
pub fn mark_cgroup(
    socket: &Path,
    dir: &Path,
    class: crate::proto::Class,
    autostart: bool,
) -> Result<u64, String> {
    let s = connect(socket, autostart).map_err(|e| format!("{}: {e}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let path = dir.to_string_lossy().into_owned();
    crate::proto::send(&s, &crate::proto::Request::MarkCgroup { path, class }, None)
        .map_err(|e| e.to_string())?;
    match crate::proto::recv::<crate::proto::Reply>(&s)
        .map_err(|e| e.to_string())?
        .0
    {
        crate::proto::Reply::MarkedCgroup { processes } => Ok(processes),
        crate::proto::Reply::Error { error } => Err(error),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

/// Marks process `pid` as `class` with the daemon at `socket` (for the batch reclaimer); with
/// `autostart`, starts a daemon if none answers.
pub fn mark(
    socket: &Path,
    pid: i32,
    class: crate::proto::Class,
    autostart: bool,
) -> Result<(), String> {
    let s = connect(socket, autostart).map_err(|e| format!("{}: {e}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    crate::proto::send(&s, &crate::proto::Request::Mark { pid, class }, None)
        .map_err(|e| e.to_string())?;
    match crate::proto::recv::<crate::proto::Reply>(&s)
        .map_err(|e| e.to_string())?
        .0
    {
        crate::proto::Reply::Marked { .. } => Ok(()),
        crate::proto::Reply::Error { error } => Err(error),
        other => Err(format!("unexpected reply {other:?}")),
    }
}
