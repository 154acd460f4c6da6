//! The `gleaner-memnode` binary as a process: its stdout contract, signals, token files, the
//! `stats` subcommand and `--exit-on-stdin-eof`.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gleaner_proto::{
    generate_token, read_token_file, write_token_file, ConnectOptions, Connection, Endpoint, Token,
};

use common::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_gleaner-memnode");

/// A spawned memnode with its stdout line reader and stderr collector.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: Option<JoinHandle<String>>,
}

impl Proc {
    fn spawn(args: &[&str], configure: impl FnOnce(&mut Command)) -> Proc {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        configure(&mut cmd);
        let mut child = cmd.spawn().expect("spawn gleaner-memnode");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stderr = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        Proc {
            child,
            lines,
            stderr: Some(stderr),
        }
    }

    /// Waits for the `listening on ...` line and returns the endpoint it names.
    fn listening(&mut self) -> Endpoint {
        match self.lines.recv_timeout(Duration::from_secs(10)) {
            Ok(line) => {
                let addr = line
                    .strip_prefix("listening on ")
                    .unwrap_or_else(|| panic!("unexpected first stdout line {line:?}"));
                addr.parse().expect("the printed endpoint parses")
            }
            Err(_) => {
                let _ = self.child.kill();
                let status = self.child.wait().unwrap();
                panic!(
                    "no `listening on` line ({status}); stderr:\n{}",
                    self.stderr.take().unwrap().join().unwrap()
                );
            }
        }
    }

    fn signal(&self, sig: libc::c_int) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) takes plain integers; `pid` is our own child, not yet reaped.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "kill failed");
    }

    /// Waits (at most 10 s) for the process to exit; returns its status and stderr.
    fn wait(mut self) -> (ExitStatus, String) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "memnode did not exit within 10 s; stderr:\n{}",
                    self.stderr.take().unwrap().join().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        (status, self.stderr.take().unwrap().join().unwrap())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn token_file(dir: &TempDir) -> (std::path::PathBuf, Token) {
    let path = dir.path().join("token");
    let token = generate_token();
    write_token_file(&path, &token).unwrap();
    (path, token)
}

fn connect(ep: &Endpoint, token: &Token) -> Connection {
    Connection::connect(ep, token, None, &ConnectOptions::default()).expect("connect")
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn port_zero_prints_the_real_port_and_sigterm_exits_zero() {
    let dir = TempDir::new("p0");
    let (tok_path, token) = token_file(&dir);
    let tok = tok_path.to_str().unwrap();
    let mut p = Proc::spawn(
        &[
            "--listen",
            "127.0.0.1:0",
            "--capacity",
            "1M",
            "--token-file",
            tok,
        ],
        |_| {},
    );
    let ep = p.listening();
    let Endpoint::Tcp(addr) = &ep else {
        panic!("expected a TCP endpoint, got {ep}")
    };
    let port: u16 = addr.rsplit_once(':').unwrap().1.parse().unwrap();
    assert_ne!(port, 0);
    assert!(addr.starts_with("127.0.0.1:"));
    let mut c = connect(&ep, &token);
    c.ping().unwrap();
    assert_eq!(c.session().capacity_bytes, 1 << 20);
    // A raw page and a small blob (as a compressing client would send).
    c.write_pages([(3u64, &[9u8; 4096][..]), (4, &[1u8; 100][..])])
        .unwrap();

    // `stats` prints pretty JSON with the documented fields.
    let out = Command::new(BIN)
        .args(["stats", "--addr", addr, "--token-file", tok])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("\n  \"capacity_bytes\": 1048576"),
        "not pretty JSON:\n{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["capacity_bytes"], 1 << 20);
    assert_eq!(v["used_bytes"], 4196);
    assert_eq!(v["free_bytes"], (1 << 20) - 4196);
    assert_eq!(v["pages_held"], 2);
    assert_eq!(v["page_bytes_held"], 2 * 4096);
    assert_eq!(v["stored_bytes"], 4196);
    assert_eq!(v["slab_bytes"], 0);
    assert_eq!(v["host_bytes"], 4196);
    assert_eq!(v["page_size"], 4096);
    assert!(v["uptime_s"].as_f64().unwrap() >= 0.0);
    for key in [
        "bytes_in",
        "bytes_out",
        "connections_accepted",
        "auth_failures",
        "malformed_frames",
        "sessions_released_by_lease",
    ] {
        assert!(v["totals"][key].is_u64(), "totals.{key} missing:\n{text}");
    }
    assert_eq!(v["totals"]["requests"]["write"], 1);
    assert_eq!(v["totals"]["requests"]["ping"], 1);
    let sessions = v["sessions"].as_array().unwrap();
    let mine = sessions
        .iter()
        .find(|s| s["id"] == c.session().session_id)
        .expect("our session is listed");
    assert_eq!(mine["pages_held"], 2);
    assert_eq!(mine["page_bytes_held"], 2 * 4096);
    assert_eq!(mine["stored_bytes"], 4196);
    assert_eq!(mine["slab_bytes"], 0);
    assert_eq!(mine["live_connections"], 1);
    for key in ["client", "bytes_in", "bytes_out", "requests"] {
        assert!(!mine[key].is_null(), "session.{key} missing:\n{text}");
    }

    p.signal(libc::SIGTERM);
    let (status, stderr) = p.wait();
    assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");
    assert!(stderr.contains("received SIGTERM"), "{stderr}");
    assert!(stderr.contains("memnode stopped after"), "{stderr}");
    assert!(
        stderr.contains("dropped 1 live sessions holding 2 pages (4.10 KiB)"),
        "{stderr}"
    );
    // The server shut our connection down.
    assert!(c.ping().is_err());
}

#[test]
fn unix_socket_stale_file_is_replaced_live_one_refused_and_removed_at_exit() {
    let dir = TempDir::new("px");
    let (tok_path, token) = token_file(&dir);
    let tok = tok_path.to_str().unwrap();
    let sock = dir.path().join("m.sock");
    // A stale socket file: bound, then the listener dropped (the file stays).
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let listen = format!("unix:{}", sock.display());
    let mut p = Proc::spawn(
        &["--listen", &listen, "--capacity", "1M", "--token-file", tok],
        |_| {},
    );
    let ep = p.listening();
    assert_eq!(ep.to_string(), listen);
    connect(&ep, &token).ping().unwrap();

    // A second memnode on the same live socket fails clearly and leaves the first alone.
    let second = Command::new(BIN)
        .args(["--listen", &listen, "--capacity", "1M", "--token-file", tok])
        .output()
        .unwrap();
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("address in use"), "{err}");
    assert!(second.stdout.is_empty());
    connect(&ep, &token).ping().unwrap();

    p.signal(libc::SIGTERM);
    let (status, stderr) = p.wait();
    assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");
    assert!(stderr.contains("removed stale socket file"), "{stderr}");
    assert!(!sock.exists(), "socket file left behind");
}

#[test]
fn default_token_file_is_generated_owner_only() {
    let home = TempDir::new("ph");
    let mut p = Proc::spawn(&["--listen", "127.0.0.1:0", "--capacity", "1M"], |c| {
        c.env("HOME", home.path()).env_remove("GLEANER_TOKEN_FILE");
    });
    let ep = p.listening();
    let path = home.path().join(".gleaner").join("token");
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(path.parent().unwrap()), 0o700);
    let token = read_token_file(&path).unwrap();
    connect(&ep, &token).ping().unwrap();
    p.signal(libc::SIGINT);
    let (status, stderr) = p.wait();
    assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");
    assert!(
        stderr.contains(&path.display().to_string()),
        "path not logged:\n{stderr}"
    );
}

#[test]
fn group_readable_token_file_is_refused() {
    let dir = TempDir::new("pg");
    let (tok_path, _) = token_file(&dir);
    std::fs::set_permissions(&tok_path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let tok = tok_path.to_str().unwrap();
    let p = Proc::spawn(
        &[
            "--listen",
            "127.0.0.1:0",
            "--capacity",
            "1M",
            "--token-file",
            tok,
        ],
        |_| {},
    );
    let (status, stderr) = p.wait();
    assert!(!status.success());
    assert!(stderr.contains(tok), "{stderr}");
    assert!(stderr.contains("chmod 600"), "{stderr}");
}

#[test]
fn a_capacity_below_one_page_is_refused() {
    let dir = TempDir::new("pc");
    let (tok_path, _) = token_file(&dir);
    let tok = tok_path.to_str().unwrap();
    for capacity in ["4095", "0"] {
        let p = Proc::spawn(
            &[
                "--listen",
                "127.0.0.1:0",
                "--capacity",
                capacity,
                "--token-file",
                tok,
            ],
            |_| {},
        );
        let (status, stderr) = p.wait();
        assert!(!status.success(), "--capacity {capacity} was accepted");
        assert!(
            stderr.contains(&format!(
                "capacity of {capacity} bytes is less than one 4096-byte page"
            )),
            "{stderr}"
        );
    }
}

#[test]
fn stats_against_nothing_fails_naming_the_address() {
    let dir = TempDir::new("ps");
    let (tok_path, _) = token_file(&dir);
    let out = Command::new(BIN)
        .args(["stats", "--addr", "127.0.0.1:1", "--token-file"])
        .arg(&tok_path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("127.0.0.1:1"), "{err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn exits_when_stdin_closes() {
    let dir = TempDir::new("pi");
    let (tok_path, token) = token_file(&dir);
    let tok = tok_path.to_str().unwrap();
    let mut p = Proc::spawn(
        &[
            "--listen",
            "127.0.0.1:0",
            "--capacity",
            "1M",
            "--token-file",
            tok,
            "--exit-on-stdin-eof",
        ],
        |c| {
            c.stdin(Stdio::piped());
        },
    );
    let ep = p.listening();
    let stdin = p.child.stdin.take().unwrap();
    connect(&ep, &token).ping().unwrap();
    // Still serving while stdin is open.
    std::thread::sleep(Duration::from_millis(200));
    assert!(p.child.try_wait().unwrap().is_none());
    drop(stdin);
    let (status, stderr) = p.wait();
    assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");
    assert!(stderr.contains("stdin closed"), "{stderr}");
}
