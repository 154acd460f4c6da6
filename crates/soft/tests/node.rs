//! The soft runtime with a real `gleaner node` daemon and real workload processes: a runtime
//! that shrinks by itself when asked; a SIGSTOPped runtime whose memory the daemon takes
//! anyway; a daemon killed and restarted under load; malformed registrations; start on demand.
//!
//! Needs `target/<profile>/gleaner` (build the workspace first: `cargo build --release`).

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gleaner_node::proto::{self, Reply};
use serde_json::Value;

const MB: u64 = 1 << 20;

fn gleaner() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let g = exe.parent().unwrap().parent().unwrap().join("gleaner");
    assert!(
        g.exists(),
        "{} is needed: build the workspace first (cargo build --release)",
        g.display()
    );
    g
}

/// A socket path for one test; its socket and lock files go when the guard drops.
struct Sock(PathBuf);
impl std::ops::Deref for Sock {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}
impl AsRef<std::ffi::OsStr> for Sock {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}
impl AsRef<Path> for Sock {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}
impl Drop for Sock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_file(format!("{}.lock", self.0.display()));
    }
}

fn sock(tag: &str) -> Sock {
    Sock(std::env::temp_dir().join(format!(
        "gleaner-node-test-{tag}-{}.sock",
        std::process::id()
    )))
}

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn daemon(sock: &Path, args: &[&str]) -> Proc {
    let mut c = Command::new(gleaner())
        .arg("node")
        .arg("--socket")
        .arg(sock)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("listening on"), "daemon printed {line:?}");
    Proc(c)
}

fn workload(
    sock: &Path,
    name: &str,
    secs: f64,
    extra: &[&str],
) -> (Proc, std::sync::mpsc::Receiver<Value>) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_soft-workload"))
        .args([
            "--name",
            name,
            "--objects",
            "4096",
            "--size",
            "16384",
            "--cost-us",
            "0",
            "--zipf",
            "0",
        ])
        .args(["--secs", &secs.to_string(), "--report-ms", "100", "--node"])
        .arg(sock)
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let rx = reports(&mut c);
    (Proc(c), rx)
}

/// The JSON lines a workload prints, as they come.
fn reports(c: &mut Child) -> std::sync::mpsc::Receiver<Value> {
    let out = c.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines() {
            let Ok(l) = l else { break };
            if let Ok(v) = serde_json::from_str::<Value>(&l) {
                let _ = tx.send(v);
            }
        }
    });
    rx
}

fn last_report(rx: &std::sync::mpsc::Receiver<Value>, timeout: Duration) -> Value {
    let deadline = Instant::now() + timeout;
    let mut last = Value::Null;
    while Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(v) => {
                let fin = v["final"].as_bool() == Some(true);
                last = v;
                if fin {
                    return last;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(_) => {}
        }
    }
    last
}

fn status(sock: &Path) -> Value {
    gleaner_node::client::status(sock).unwrap()
}

fn pool_named<'a>(st: &'a Value, name: &str) -> Option<&'a Value> {
    st["pools"].as_array()?.iter().find(|p| p["name"] == name)
}

/// Waits until `f` holds of the daemon's status.
fn wait_until(sock: &Path, what: &str, secs: f64, f: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    loop {
        let st = status(sock);
        if f(&st) {
            return st;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {st:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn finish(p: &mut Proc, rx: &std::sync::mpsc::Receiver<Value>) -> Value {
    let v = last_report(rx, Duration::from_secs(20));
    let st = p.0.wait().unwrap();
    assert!(st.success(), "workload failed ({st}): {v}");
    assert_eq!(v["bad"], 0, "{v}");
    v
}

#[test]
fn cooperative_shrink_then_a_stopped_runtime_still_gives_memory_back() {
    let s = sock("stop");
    let _d = daemon(
        &s,
        &[
            "--policy",
            "static",
            "--soft-budget",
            "36M",
            "--interval",
            "0.2",
            "--grace-ms",
            "1500",
        ],
    );
    let (mut w1, rx1) = workload(&s, "w1", 7.0, &[]);
    wait_until(&s, "w1 to fill its grant", 5.0, |st| {
        pool_named(st, "w1").is_some_and(|p| p["resident"].as_u64().unwrap() >= 28 * MB)
    });
    // Cooperative: a second pool halves w1's share; w1 (running) shrinks by itself.
    let (mut w2, rx2) = workload(&s, "w2", 6.0, &[]);
    // From 28 MiB or more down to 20: by itself, so the daemon punched nothing. (Its count of
    // released segments is no evidence: a shrink may go by compaction alone, counted apart, and
    // the count reaches the control area after the residency has dropped.)
    let st = wait_until(&s, "w1 to shrink to its half", 5.0, |st| {
        pool_named(st, "w1").is_some_and(|p| {
            p["limit"].as_u64().unwrap() <= 18 * MB && p["resident"].as_u64().unwrap() <= 20 * MB
        })
    });
    let p1 = pool_named(&st, "w1").unwrap();
    assert_eq!(
        p1["punched_segments"], 0,
        "w1 was running: it should have shrunk itself: {p1}"
    );
    // Direct: w1 stops; a third pool cuts its share again; the daemon punches w1's segments.
    let pid = w1.0.id() as i32;
    assert_eq!(unsafe_kill(pid, libc::SIGSTOP), 0);
    let (mut w3, rx3) = workload(&s, "w3", 4.0, &[]);
    let st = wait_until(
        &s,
        "the daemon to take a stopped runtime's memory",
        6.0,
        |st| {
            pool_named(st, "w1").is_some_and(|p| {
                p["punched_segments"].as_u64().unwrap() > 0
                    && p["resident"].as_u64().unwrap() <= p["limit"].as_u64().unwrap() + 2 * MB
            })
        },
    );
    let p1 = pool_named(&st, "w1").unwrap();
    assert!(p1["limit"].as_u64().unwrap() <= 13 * MB, "{p1}");
    assert_eq!(unsafe_kill(pid, libc::SIGCONT), 0);
    // Everyone finishes, every read right; w1 noticed the punches and rebuilt what it lost.
    let r1 = finish(&mut w1, &rx1);
    assert!(r1["revoked_segments"].as_u64().unwrap() > 0, "{r1}");
    finish(&mut w2, &rx2);
    finish(&mut w3, &rx3);
}

fn unsafe_kill(pid: i32, sig: i32) -> i32 {
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is our own child.
    unsafe { libc::kill(pid, sig) }
}

#[test]
fn daemon_restarted_under_load_pools_re_register_and_programs_keep_running() {
    let s = sock("restart");
    let d = daemon(&s, &["--soft-budget", "48M", "--interval", "0.3"]);
    let (mut w, rx) = workload(&s, "steady", 5.0, &[]);
    wait_until(&s, "the pool to register", 3.0, |st| {
        pool_named(st, "steady").is_some()
    });
    std::thread::sleep(Duration::from_millis(800));
    drop(d); // SIGKILL: no goodbye
    std::thread::sleep(Duration::from_millis(500));
    let _d2 = daemon(&s, &["--soft-budget", "48M", "--interval", "0.3"]);
    let st = wait_until(&s, "the pool to register again", 4.0, |st| {
        pool_named(st, "steady").is_some()
    });
    let p = pool_named(&st, "steady").unwrap();
    assert!(p["limit"].as_u64().unwrap() > 0, "{p}");
    let r = finish(&mut w, &rx);
    assert!(r["registrations"].as_u64().unwrap() >= 2, "{r}");
    assert!(r["ops"].as_u64().unwrap() > 1000, "{r}");
}

fn expect_error(sock: &Path, body: &[u8], fd: Option<std::os::fd::BorrowedFd<'_>>, want: &str) {
    let c = UnixStream::connect(sock).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    proto::send_raw(&c, body, fd).unwrap();
    match proto::recv::<Reply>(&c).unwrap().0 {
        Reply::Error { error } => assert!(error.contains(want), "{error:?} lacks {want:?}"),
        other => panic!("{} got {other:?}", String::from_utf8_lossy(body)),
    }
}

#[test]
fn malformed_registrations_get_clear_errors_and_the_daemon_keeps_running() {
    let s = sock("bad");
    let _d = daemon(&s, &[]);
    let reg = |extra: &str| {
        format!(r#"{{"op":"register","version":1,"kind":"soft_pool","name":"x"{extra}}}"#)
            .into_bytes()
    };
    let (good, _c) = gleaner_node::shared::create_pool_memfd("t", 4).unwrap();
    expect_error(&s, b"not json", None, "malformed message");
    expect_error(&s, br#"{"op":"launch"}"#, None, "malformed message");
    expect_error(
        &s,
        &reg(r#","bogus":1"#),
        Some(good.as_fd()),
        "unknown field",
    );
    expect_error(
        &s,
        br#"{"op":"register","version":9,"kind":"soft_pool","name":"x"}"#,
        Some(good.as_fd()),
        "protocol version 9",
    );
    // A far program (an elastic budget, `crates/cli/tests/elastic.rs`) brings no memfd.
    expect_error(
        &s,
        br#"{"op":"register","version":1,"kind":"far_program","name":"x","ceiling_bytes":1}"#,
        Some(good.as_fd()),
        "without a descriptor",
    );
    expect_error(
        &s,
        br#"{"op":"register","version":1,"kind":"latency_critical","name":"x"}"#,
        Some(good.as_fd()),
        "not served",
    );
    expect_error(&s, &reg(""), None, "memfd attached");
    expect_error(&s, &reg(r#","weight":-1"#), Some(good.as_fd()), "weight");
    expect_error(
        &s,
        &reg(r#","floor_bytes":99999999999"#),
        Some(good.as_fd()),
        "above ceiling",
    );
    let (r, _w) = rustix::pipe::pipe().unwrap();
    expect_error(&s, &reg(""), Some(r.as_fd()), "not a sealable memfd");
    let plain = rustix::fs::memfd_create("plain", rustix::fs::MemfdFlags::ALLOW_SEALING).unwrap();
    rustix::fs::ftruncate(&plain, 8 * MB).unwrap();
    expect_error(
        &s,
        &reg(""),
        Some(plain.as_fd()),
        "not sealed against shrinking",
    );
    rustix::fs::fcntl_add_seals(&plain, rustix::fs::SealFlags::SHRINK).unwrap();
    expect_error(
        &s,
        &reg(""),
        Some(plain.as_fd()),
        "no gleaner soft-pool header",
    );
    // A length prefix past the bound.
    let c = UnixStream::connect(&s).unwrap();
    (&c).write_all(&u32::MAX.to_le_bytes()).unwrap();
    match proto::recv::<Reply>(&c).unwrap().0 {
        Reply::Error { error } => assert!(error.contains("a message of"), "{error}"),
        other => panic!("{other:?}"),
    }
    // A client that connects and vanishes.
    drop(UnixStream::connect(&s).unwrap());
    // Still serving: status answers, and a good registration works.
    let st = status(&s);
    assert_eq!(st["refused_clients"], 13, "{st}");
    let c = UnixStream::connect(&s).unwrap();
    proto::send_raw(&c, &reg(""), Some(good.as_fd())).unwrap();
    assert!(matches!(
        proto::recv::<Reply>(&c).unwrap().0,
        Reply::Registered { .. }
    ));
    assert_eq!(status(&s)["pools"].as_array().unwrap().len(), 1);
}

#[test]
fn a_client_that_finds_no_daemon_starts_one() {
    let s = sock("auto");
    let _ = std::fs::remove_file(&s);
    let w = Command::new(env!("CARGO_BIN_EXE_soft-workload"))
        .args([
            "--name",
            "auto",
            "--objects",
            "256",
            "--secs",
            "1",
            "--autostart",
            "--node",
        ])
        .arg(&s)
        .env("GLEANER_BIN", gleaner())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = w.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert!(last["registrations"].as_u64().unwrap() >= 1, "{last}");
    // The daemon it started is there (and exits by itself when idle); stop it now.
    let st = status(&s);
    let pid = st["pid"].as_i64().unwrap() as i32;
    assert_eq!(unsafe_kill(pid, libc::SIGTERM), 0);
}

/// A program holding 256 MiB of soft memory is stopped (its runtime cannot shrink), and an
/// antagonist in its cgroup allocates 90% of the limit as fast as it can: the daemon takes the
/// soft memory back directly, fast enough that no one is OOM-killed, and the program, let go
/// on, reads every value right (its punched objects are misses it rebuilds).
#[test]
fn a_fast_antagonist_in_the_cgroup_meets_soft_memory_given_back_not_an_oom_kill() {
    let soft = 256 * MB;
    let reserve = 64 * MB;
    let cg = gleaner_sys::cgroup::MemoryCgroup::limited("antagonist", 2 * soft + reserve)
        .unwrap_or_else(|e| panic!("{e}"));
    let s = sock("antagonist");
    let grant = (soft + 8 * MB).to_string();
    let _d = daemon(
        &s,
        &[
            "--policy",
            "static",
            "--cgroup",
            cg.path().to_str().unwrap(),
            "--tick-ms",
            "10",
            "--grace-ms",
            "100",
            "--reserve",
            &reserve.to_string(),
            "--initial",
            &grant,
            "--soft-budget",
            &grant,
        ],
    );
    let workload_bin = env!("CARGO_BIN_EXE_soft-workload");
    let sock_s = s.to_str().unwrap().to_string();
    let objects = (soft / (64 << 10)).to_string();
    let mut w = cg.command(
        workload_bin,
        &[
            "--name",
            "held",
            "--objects",
            &objects,
            "--size",
            "65536",
            "--cost-us",
            "0",
            "--zipf",
            "0",
            "--secs",
            "60",
            "--report-ms",
            "100",
            "--node",
            &sock_s,
        ],
    );
    let mut w = Proc(w.stdout(Stdio::piped()).spawn().unwrap());
    let rx = reports(&mut w.0);
    wait_until(&s, "the program to fill its grant", 30.0, |st| {
        pool_named(st, "held").is_some_and(|p| p["resident"].as_u64().unwrap() >= soft * 9 / 10)
    });
    // The program's own process is the shell's exec: its pid is the child's.
    let pid = w.0.id() as i32;
    assert_eq!(unsafe_kill(pid, libc::SIGSTOP), 0);
    let target = (2 * soft + reserve) * 9 / 10;
    let code = format!(
        "chunks = []\n\
         while len(chunks) * (16 << 20) < {target}:\n\
         \x20   chunks.append(b'\\x01' * (16 << 20))\n\
         print('allocated', len(chunks) * 16)\n"
    );
    let ant = cg
        .command("python3", &["-c", &code])
        .output()
        .expect("python3 runs the antagonist");
    let st = status(&s);
    assert!(
        ant.status.success(),
        "the antagonist failed ({}; OOM kills in the cgroup: {}); daemon: {st:#}",
        ant.status,
        cg.oom_kills()
    );
    assert_eq!(cg.oom_kills(), 0, "daemon: {st:#}");
    let punched = st["direct_punched_bytes"].as_u64().unwrap();
    assert!(
        punched >= soft / 2,
        "the daemon took {punched} bytes directly: {st:#}"
    );
    assert_eq!(unsafe_kill(pid, libc::SIGCONT), 0);
    // It reads on for a second, then is asked to end; every read must have been right.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(unsafe_kill(pid, libc::SIGINT), 0);
    let v = last_report(&rx, Duration::from_secs(10));
    let _ = w.0.wait();
    assert_eq!(v["bad"], 0, "{v}");
    assert!(v["revoked_segments"].as_u64().unwrap() > 0, "{v}");
}
