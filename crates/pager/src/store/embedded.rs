//! The embedded memnode: a private `gleaner memnode` child process started when no memnode
//! address is given, with a fresh token in a private directory, stopped when the region drops.
//!
//! The child's stdin is a pipe whose write end only this process holds (`--exit-on-stdin-eof`),
//! so the memnode also goes away if this process dies without running any destructor.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use gleaner_proto::{Endpoint, Token};

use crate::PagerError;

/// A running private memnode child process; it stops when this value is dropped.
pub struct EmbeddedMemnode {
    child: Child,
    stdin: Option<ChildStdin>,
    endpoint: Endpoint,
    token: Token,
    dir: PathBuf,
}

/// The capacity a private memnode needs to hold every page of `region_bytes` of far memory: the
/// region plus room for the codec's and the allocator's overhead on pages that do not compress (a
/// blob is up to 17 bytes larger than its page, rounded up to its size class).
pub fn capacity_for_region(region_bytes: u64) -> u64 {
    region_bytes + region_bytes / 16 + (64 << 20)
}

impl EmbeddedMemnode {
    /// Starts a memnode with `capacity` bytes, on a Unix socket or (with `tcp`) on loopback.
    pub fn start(capacity: u64, tcp: bool) -> Result<EmbeddedMemnode, PagerError> {
        let bin = find_gleaner_binary()?;
        let dir = private_dir()?;
        let token = gleaner_proto::generate_token();
        let token_path = dir.join("token");
        // From here on `dir` is removed on any error: the guard is disarmed once `node` owns it.
        let guard = DirGuard(Some(dir.clone()));
        gleaner_proto::write_token_file(&token_path, &token)
            .map_err(|e| PagerError::Embedded(format!("writing {}: {e}", token_path.display())))?;
        let listen = if tcp {
            "127.0.0.1:0".to_string()
        } else {
            format!("unix:{}", dir.join("memnode.sock").display())
        };
        let mut cmd = Command::new(&bin);
        cmd.args(["memnode", "--listen", &listen, "--capacity"])
            .arg(capacity.to_string())
            .arg("--token-file")
            .arg(&token_path)
            .args(["--lease", "1", "--exit-on-stdin-eof", "--private-dir"])
            .arg(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // The memnode must not itself run on far memory: a preloaded parent would otherwise
            // start a pager in it, which would start a memnode, and so on.
            .env_remove("LD_PRELOAD")
            .env_remove("GLEANER_LOCAL_MEM");
        if std::env::var_os("GLEANER_MEMNODE_LOG").is_some() {
            cmd.env(
                "RUST_LOG",
                std::env::var_os("GLEANER_MEMNODE_LOG").unwrap_or_default(),
            );
        } else {
            cmd.env("RUST_LOG", "warn");
        }
        let mut child = cmd.spawn().map_err(|e| {
            PagerError::Embedded(format!("spawning {} memnode: {e}", bin.display()))
        })?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("gleaner-embed".into())
            .spawn(move || {
                let mut line = String::new();
                let r = BufReader::new(stdout).read_line(&mut line).map(|_| line);
                let _ = tx.send(r);
            })
            .map_err(|e| PagerError::Embedded(format!("thread: {e}")))?;
        let mut node = EmbeddedMemnode {
            child,
            stdin: None,
            endpoint: Endpoint::Tcp(String::new()),
            token,
            dir,
        };
        guard.disarm();
        node.stdin = node.child.stdin.take();
        let line = match rx.recv_timeout(Duration::from_secs(15)) {
            Ok(Ok(line)) => line,
            Ok(Err(e)) => return Err(PagerError::Embedded(format!("reading its address: {e}"))),
            Err(_) => {
                return Err(PagerError::Embedded(
                    "it did not report its address within 15 s".into(),
                ))
            }
        };
        let addr = line.trim().strip_prefix("listening on ").ok_or_else(|| {
            PagerError::Embedded(format!(
                "it exited or printed `{}` instead of its address (see its messages above)",
                line.trim()
            ))
        })?;
        node.endpoint = addr
            .parse()
            .map_err(|e| PagerError::Embedded(format!("it printed a bad address: {e}")))?;
        Ok(node)
    }

    /// Where it listens.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Its token.
    pub fn token(&self) -> Token {
        self.token
    }

    /// The file holding its token (owner-only, removed when the memnode stops).
    pub fn token_file(&self) -> PathBuf {
        self.dir.join("token")
    }

    /// Leaves the memnode running after this value (and this process) is gone, for clients
    /// that outlive the launcher (a daemon): it serves until no session is left (each client's
    /// connections closed and its lease out), then exits and removes its directory. Returns
    /// its pid.
    pub fn linger(mut self) -> u32 {
        if let Some(mut stdin) = self.stdin.take() {
            use std::io::Write;
            // Then the end of its stdin, as the pipe closes here.
            let _ = stdin.write_all(b"linger\n");
        }
        let pid = self.child.id();
        // Neither stopped nor waited for, and its directory stays: it outlives this process.
        let _ = std::mem::ManuallyDrop::new(self);
        pid
    }
}

impl Drop for EmbeddedMemnode {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() >= deadline => {
                    log::warn!("embedded memnode did not stop within 3 s; killing it");
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Removes a directory on drop unless disarmed.
struct DirGuard(Option<PathBuf>);

impl DirGuard {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for DirGuard {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// A fresh directory only this user can enter, for the token and the socket.
fn private_dir() -> Result<PathBuf, PagerError> {
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        // Not `$TMPDIR`: that is the program's (`scratch.rs`).
        .unwrap_or_else(crate::system_dir);
    let suffix: [u8; 6] = gleaner_proto::random_bytes();
    let name = format!(
        "gleaner-{}-{}",
        std::process::id(),
        suffix
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let dir = base.join(name);
    // As root, others may pass through the directory to the socket (the memnode makes the
    // socket connectable too): a program that drops its privileges (`setuid`) and then forks
    // must be able to open its child's session. The token file stays the creator's alone, and
    // a session needs the token, which the program holds in memory (a TCP memnode on loopback
    // is as reachable). Others still cannot list the directory.
    // SAFETY: geteuid has no preconditions.
    let mode = if unsafe { libc::geteuid() } == 0 {
        0o711
    } else {
        0o700
    };
    std::fs::DirBuilder::new()
        .mode(mode)
        .create(&dir)
        .map_err(|e| PagerError::Embedded(format!("creating {}: {e}", dir.display())))?;
    Ok(dir)
}

/// Finds the `gleaner` executable: `$GLEANER_BIN`, this executable if it is `gleaner`, a
/// `gleaner` beside this executable (or one directory up, as for cargo's test binaries), or `$PATH`.
fn find_gleaner_binary() -> Result<PathBuf, PagerError> {
    if let Some(p) = std::env::var_os("GLEANER_BIN") {
        return Ok(PathBuf::from(p));
    }
    if let Ok(exe) = std::env::current_exe() {
        if exe.file_name().is_some_and(|n| n == "gleaner") {
            return Ok(exe);
        }
        let mut dir = exe.parent();
        for _ in 0..2 {
            if let Some(d) = dir {
                let candidate = d.join("gleaner");
                if is_executable(&candidate) {
                    return Ok(candidate);
                }
                dir = d.parent();
            }
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&path) {
            let candidate = d.join("gleaner");
            if is_executable(&candidate) {
                return Ok(candidate);
            }
        }
    }
    Err(PagerError::Embedded(
        "the `gleaner` executable was not found (set GLEANER_BIN to its path, put it on PATH, \
         or give a memnode address)"
            .into(),
    ))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
