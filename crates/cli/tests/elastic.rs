//! Elastic budgets (`gleaner run --local-mem FLOOR..CEILING`) under a real `gleaner node`:
//! real programs (`bench/elastic_workload.py` on the real Python interpreter, which checks every
//! page it reads), a real daemon on a socket of its own, killed and restarted mid-run, and
//! malformed or unsupported registrations on the real socket.
//!
//! Needs `target/release/gleaner` and the preload library built (`cargo build --workspace
//! --release`), as every test of `gleaner run` does.

mod common;

use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{gleaner_bin, limited_cgroup, real_python, wait_output, TempDir};
use gleaner_node::proto::{self, Kind, Reply, Request};
use serde_json::Value;

const MIB: u64 = 1 << 20;

fn workload() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../bench/elastic_workload.py")
}

/// A `gleaner node` on `socket`, killed on drop.
struct Node(Child);

impl Node {
    fn start(socket: &Path) -> Node {
        let child = Command::new(gleaner_bin())
            .args(["node", "--interval", "0.3", "--tick-ms", "50"])
            .args(["--elastic-budget", "256M", "--elastic-step", "64M"])
            .arg("--socket")
            .arg(socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("starting gleaner node");
        let deadline = Instant::now() + Duration::from_secs(5);
        while UnixStream::connect(socket).is_err() {
            assert!(Instant::now() < deadline, "gleaner node did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        Node(child)
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

fn status(socket: &Path) -> Value {
    gleaner_node::client::status(socket).expect("gleaner node status")
}

/// The far program named `name` in a status, if registered.
fn program<'a>(st: &'a Value, name: &str) -> Option<&'a Value> {
    st["programs"]
        .as_array()?
        .iter()
        .find(|p| p["name"].as_str().unwrap_or("").starts_with(name))
}

/// `gleaner run --local-mem RANGE` of the workload, named `name` for the daemon.
fn start_program(socket: &Path, name: &str, range: &str, args: &[&str], stats: &Path) -> Child {
    Command::new(gleaner_bin())
        .args(["run", "-q", "--local-mem", range, "--stats"])
        .arg(stats)
        .arg("--")
        .arg(real_python())
        .arg(workload())
        .args(args)
        .env(gleaner_node::client::SOCKET_ENV, socket)
        .env("GLEANER_ELASTIC_NAME", name)
        .env("GLEANER_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("starting gleaner run")
}

/// Checks a finished workload: exit 0 and its line of results, every page checked.
fn finished_well(name: &str, out: (Option<i32>, String, String)) -> String {
    let (code, stdout, stderr) = out;
    assert_eq!(
        code,
        Some(0),
        "{name} failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let line: Value = serde_json::from_str(stdout.trim().lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{name}: no result line ({e})\n{stdout}\n{stderr}"));
    assert!(line["pages_checked"].as_u64().unwrap() > 0, "{line}");
    stderr
}

/// What the daemon grants, in all, to the entries of `kind` (`programs` or `pools`) in `st`.
fn granted(st: &Value, kind: &str) -> u64 {
    st[kind]
        .as_array()
        .unwrap_or_else(|| panic!("no {kind} in {st}"))
        .iter()
        .map(|p| u(&p["limit"]))
        .sum()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Every `budget_pages` in a `--stats` file.
fn budget_pages(v: &Value, out: &mut Vec<u64>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "budget_pages" {
                    out.push(u(x));
                } else {
                    budget_pages(x, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| budget_pages(x, out)),
        _ => {}
    }
}

#[test]
fn the_program_faulting_more_is_granted_more_within_its_range() {
    let dir = TempDir::new("elastic-two");
    let socket = dir.path().join("node.sock");
    let _node = Node::start(&socket);
    // "big" sweeps 160 MiB (more than half the 256 MiB total: it faults unless it gets more),
    // "small" 16 MiB, both for at least 6 s.
    let big_args = ["--first-mib", "160", "--second-mib", "160", "--passes", "1"];
    let small_args = ["--first-mib", "16", "--second-mib", "16", "--passes", "1"];
    let mut big = start_program(
        &socket,
        "big",
        "48M..208M",
        &[&big_args[..], &["--first-seconds", "6"]].concat(),
        &dir.path().join("big.json"),
    );
    let mut small = start_program(
        &socket,
        "small",
        "48M..208M",
        &[&small_args[..], &["--first-seconds", "6"]].concat(),
        &dir.path().join("small.json"),
    );
    let (floor, ceiling) = (48 * MIB, 208 * MIB);
    let mut widest = 0i64;
    let mut samples = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while big.try_wait().unwrap().is_none() || small.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the programs ran past 60 s");
        let st = status(&socket);
        let total = u(&st["elastic_total"]);
        let granted = granted(&st, "programs");
        if let (Some(b), Some(s)) = (program(&st, "big"), program(&st, "small")) {
            samples += 1;
            for p in [b, s] {
                let (limit, applied) = (u(&p["limit"]), u(&p["budget_applied"]));
                assert!(
                    (floor..=ceiling).contains(&limit),
                    "grant out of range: {p}"
                );
                // The pager's budget: 0 until its first report, then within the range.
                assert!(
                    applied == 0 || (floor..=ceiling).contains(&applied),
                    "budget out of range: {p}"
                );
            }
            assert!(
                granted <= total.max(2 * floor),
                "grants {granted} over the total {total}: {st}"
            );
            // A giver's budget falls before the gainer's rises: what the pagers apply stays
            // within the total together.
            let applied = u(&b["budget_applied"]) + u(&s["budget_applied"]);
            assert!(
                applied <= total,
                "applied {applied} over the total {total}: {st}"
            );
            widest = widest.max(u(&b["limit"]) as i64 - u(&s["limit"]) as i64);
        }
        std::thread::sleep(Duration::from_millis(150));
    }
    let big_err = finished_well("big", wait_output(&mut big, Duration::from_secs(10)));
    finished_well("small", wait_output(&mut small, Duration::from_secs(10)));
    assert!(
        samples >= 5,
        "both were registered in only {samples} samples"
    );
    assert!(
        widest >= (96 * MIB) as i64,
        "the program faulting more never got at least 96 MiB more than the other (most: {} MiB)",
        widest / MIB as i64
    );
    assert!(
        big_err.contains("elastic budget: registered with the node daemon"),
        "{big_err}"
    );
    // The pager applied what it was granted: its budget grew past the floor.
    let stats: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("big.json")).unwrap()).unwrap();
    let mut pages = Vec::new();
    budget_pages(&stats, &mut pages);
    assert!(
        pages.iter().any(|&p| p * 4096 > floor),
        "big's pager never grew its budget: {pages:?}"
    );
}

#[test]
fn a_program_whose_working_set_shrinks_gives_its_memory_to_the_other() {
    let dir = TempDir::new("elastic-trade");
    let socket = dir.path().join("node.sock");
    let _node = Node::start(&socket);
    // "first" sweeps 160 MiB for 4 s then 16 MiB for 4 s; "second" the other way round.
    let phases = |a: &'static str, b: &'static str| {
        vec![
            "--first-mib",
            a,
            "--second-mib",
            b,
            "--passes",
            "1",
            "--second-passes",
            "1",
            "--first-seconds",
            "4",
            "--second-seconds",
            "4",
        ]
    };
    let mut first = start_program(
        &socket,
        "first",
        "48M..208M",
        &phases("160", "16"),
        &dir.path().join("first.json"),
    );
    let mut second = start_program(
        &socket,
        "second",
        "48M..208M",
        &phases("16", "160"),
        &dir.path().join("second.json"),
    );
    let mut first_peak = 0;
    let mut gave_back = false;
    let deadline = Instant::now() + Duration::from_secs(60);
    while first.try_wait().unwrap().is_none() && second.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the programs ran past 60 s");
        let st = status(&socket);
        if let (Some(f), Some(s)) = (program(&st, "first"), program(&st, "second")) {
            let applied = u(&f["budget_applied"]);
            first_peak = first_peak.max(applied);
            // After it held 160 MiB or more, its pager applied a budget at least 64 MiB lower
            // while it ran, and the other one's grant rose.
            if first_peak >= 160 * MIB
                && applied + 64 * MIB <= first_peak
                && u(&s["limit"]) >= 112 * MIB
            {
                gave_back = true;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    finished_well("first", wait_output(&mut first, Duration::from_secs(30)));
    finished_well("second", wait_output(&mut second, Duration::from_secs(30)));
    assert!(
        first_peak >= 160 * MIB,
        "first never grew to 160 MiB ({first_peak})"
    );
    assert!(
        gave_back,
        "first never gave memory back to second (peak {first_peak})"
    );
}

#[test]
fn a_soft_pool_and_a_far_program_share_one_arbiter() {
    let dir = TempDir::new("elastic-soft");
    let socket = dir.path().join("node.sock");
    let _node = Node::start(&socket);
    let soft = gleaner_bin().parent().unwrap().join("soft-workload");
    assert!(
        soft.is_file(),
        "{} is missing: cargo build --workspace --release",
        soft.display()
    );
    // A soft pool whose misses cost next to nothing to rebuild (64 MiB of objects), registered
    // first: it is admitted with the daemon's initial grant (100 MiB).
    let mut pool = Command::new(&soft)
        .args(["--name", "cheap", "--objects", "4096", "--size", "16384"])
        .args([
            "--cost-us",
            "0",
            "--zipf",
            "0",
            "--secs",
            "7",
            "--report-ms",
            "200",
        ])
        .arg("--node")
        .arg(&socket)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("starting soft-workload");
    let deadline = Instant::now() + Duration::from_secs(5);
    while status(&socket)["pools"]
        .as_array()
        .is_none_or(|p| p.is_empty())
    {
        assert!(Instant::now() < deadline, "the pool did not register");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A far program sweeping 160 MiB: it loses far more time per second than the pool.
    let mut prog = start_program(
        &socket,
        "sweeper",
        "48M..208M",
        &[
            "--first-mib",
            "160",
            "--second-mib",
            "160",
            "--passes",
            "1",
            "--first-seconds",
            "5",
        ],
        &dir.path().join("sweeper.json"),
    );
    let (mut prog_peak, mut pool_low) = (0, u64::MAX);
    let deadline = Instant::now() + Duration::from_secs(60);
    while prog.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the program ran past 60 s");
        let st = status(&socket);
        let total = u(&st["elastic_total"]);
        let pools = granted(&st, "pools");
        if let Some(p) = program(&st, "sweeper") {
            let limit = u(&p["limit"]);
            assert!((48 * MIB..=208 * MIB).contains(&limit), "{p}");
            assert!(
                limit + pools <= total,
                "grants over the total {total}: {st}"
            );
            prog_peak = prog_peak.max(limit);
            if let Some(pool) = st["pools"].as_array().unwrap().first() {
                pool_low = pool_low.min(u(&pool["limit"]));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    finished_well("sweeper", wait_output(&mut prog, Duration::from_secs(10)));
    let (code, stdout, stderr) = wait_output(&mut pool, Duration::from_secs(30));
    assert_eq!(code, Some(0), "soft-workload failed: {stdout}\n{stderr}");
    let last: Value = serde_json::from_str(stdout.trim().lines().last().unwrap_or("")).unwrap();
    assert_eq!(last["bad"], 0, "a soft read went wrong: {last}");
    assert!(
        prog_peak >= 192 * MIB,
        "the program never got most of what the pool gave up (peak {} MiB)",
        prog_peak / MIB
    );
    assert!(
        pool_low <= 64 * MIB,
        "the cheap pool never gave memory to the program (lowest grant {} MiB)",
        pool_low / MIB
    );
}

#[test]
fn a_daemon_killed_mid_run_leaves_the_program_at_its_budget_until_one_returns() {
    let dir = TempDir::new("elastic-kill");
    let socket = dir.path().join("node.sock");
    let mut node = Node::start(&socket);
    let stats = dir.path().join("run.json");
    let mut prog = start_program(
        &socket,
        "alone",
        "48M..192M",
        &[
            "--first-mib",
            "160",
            "--second-mib",
            "160",
            "--passes",
            "1",
            "--first-seconds",
            "8",
        ],
        &stats,
    );
    // Alone and faulting, it is granted its ceiling and applies it.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            Instant::now() < deadline,
            "never granted its ceiling: {}",
            status(&socket)
        );
        assert!(
            prog.try_wait().unwrap().is_none(),
            "the program ended early"
        );
        let st = status(&socket);
        if let Some(p) = program(&st, "alone") {
            if u(&p["limit"]) == 192 * MIB && u(&p["budget_applied"]) == 192 * MIB {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    node.kill();
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        prog.try_wait().unwrap().is_none(),
        "the program must go on without the daemon"
    );
    // A daemon that comes back gets the program's registration again, at the budget it holds.
    let _node = Node::start(&socket);
    let deadline = Instant::now() + Duration::from_secs(10);
    let regrant = loop {
        let st = status(&socket);
        if let Some(p) = program(&st, "alone") {
            break u(&p["limit"]);
        }
        assert!(
            Instant::now() < deadline,
            "the program did not register again"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(regrant, 192 * MIB, "re-registered at the budget it kept");
    let stderr = finished_well("alone", wait_output(&mut prog, Duration::from_secs(60)));
    assert!(
        stderr.contains("went away; the local budget stays at 192 MiB"),
        "{stderr}"
    );
    let v: Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let mut pages = Vec::new();
    budget_pages(&v, &mut pages);
    assert!(
        pages.contains(&(192 * MIB / 4096)),
        "the budget at the end is not the one kept: {pages:?}"
    );
}

/// Sends `body` as a registration and returns the daemon's error, or panics.
fn refused(socket: &Path, body: &str) -> String {
    let s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    proto::send_raw(&s, body.as_bytes(), None).unwrap();
    match proto::recv::<Reply>(&s).unwrap().0 {
        Reply::Error { error } => error,
        other => panic!("{body}: expected an error, got {other:?}"),
    }
}

#[test]
fn bad_ranges_and_registrations_get_clear_errors() {
    let dir = TempDir::new("elastic-bad");
    // Bad ranges: refused before anything starts.
    for (range, says) in [
        ("2G..256M", "above the ceiling"),
        ("..2G", "both ends"),
        ("256M..", "both ends"),
        ("256M..lots", "the ceiling"),
    ] {
        let (code, _, err) = common::run_gleaner(
            &["run", "--local-mem", range, "--", "true"],
            Duration::from_secs(20),
        );
        assert_eq!(code, Some(2), "{range}: {err}");
        assert!(err.contains(says), "{range}: {err}");
    }
    // No daemon, and none can be started: a clear error, the program never runs.
    let marker = dir.path().join("ran");
    let out = Command::new(gleaner_bin())
        .args(["run", "--local-mem", "64M..128M", "--", "touch"])
        .arg(&marker)
        .env(
            gleaner_node::client::SOCKET_ENV,
            dir.path().join("none/node.sock"),
        )
        .env("GLEANER_BIN", "/nonexistent/gleaner")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("needs the node daemon"), "{err}");
    assert!(!marker.exists(), "the program ran without its daemon");

    // Malformed and unsupported registrations on a real daemon's socket.
    let socket = dir.path().join("node.sock");
    let _node = Node::start(&socket);
    let reg = |extra: &str| {
        format!(r#"{{"op":"register","version":1,"kind":"far_program","name":"x"{extra}}}"#)
    };
    for (body, says) in [
        (reg(r#","floor_bytes":10,"ceiling_bytes":5"#), "above ceiling_bytes"),
        (reg(""), "ceiling_bytes"),
        (
            r#"{"op":"register","version":1,"kind":"latency_critical","name":"x"}"#.into(),
            "not served",
        ),
        (
            r#"{"op":"report","far_faults":1,"timed_faults":1,"timed_ns":1,"resident_bytes":1,"budget_bytes":1}"#
                .into(),
            "after register",
        ),
        (reg(r#","ceiling_bytes":5,"bogus":1"#), "malformed"),
        (reg(r#","ceiling_bytes":5,"weight":-1"#), "weight"),
    ] {
        let e = refused(&socket, &body);
        assert!(e.contains(says), "{body}: {e}");
    }
    // A registered far program that sends anything but reports is refused and dropped.
    let s = UnixStream::connect(&socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let req = Request::Register {
        version: proto::VERSION,
        kind: Kind::FarProgram,
        name: "chatty".into(),
        weight: 1.0,
        floor_bytes: 8 * MIB,
        ceiling_bytes: 16 * MIB,
        resident_bytes: 0,
    };
    proto::send(&s, &req, None).unwrap();
    assert!(matches!(
        proto::recv::<Reply>(&s).unwrap().0,
        Reply::Registered { limit_bytes, .. } if limit_bytes == 8 * MIB
    ));
    assert!(program(&status(&socket), "chatty").is_some());
    proto::send(&s, &Request::Status, None).unwrap();
    match proto::recv::<Reply>(&s).unwrap().0 {
        Reply::Error { error } => assert!(error.contains("only reports"), "{error}"),
        other => panic!("expected an error, got {other:?}"),
    }
    // The daemon still serves, and counted every refusal.
    std::thread::sleep(Duration::from_millis(100));
    let st = status(&socket);
    assert!(program(&st, "chatty").is_none(), "{st}");
    assert!(u(&st["refused_clients"]) >= 7, "{st}");
}

/// Pressure between two rounds: a far program granted most of its cgroup, then an antagonist
/// in the cgroup allocating 320 MiB at once. The daemon lowers the program's grant on a tick
/// between rounds (a decision whose reason says so; a round's says "over the total"), nobody
/// is OOM-killed, and the program, checking every page, finishes well.
#[test]
fn pressure_between_rounds_lowers_a_far_programs_grant_at_once() {
    let dir = TempDir::new("elastic-shed");
    let socket = dir.path().join("node.sock");
    let cg = limited_cgroup("elastic-shed", 640 * MIB);
    let mut node = Node(
        Command::new(gleaner_bin())
            .args(["node", "--tick-ms", "20", "--reserve", "64M", "--cgroup"])
            .arg(cg.path())
            // Rounds every 1.5 s (the program grows at the first), ticks every 20 ms.
            .args(["--interval", "1.5", "--elastic-step", "256M"])
            .arg("--socket")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("starting gleaner node"),
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while UnixStream::connect(&socket).is_err() {
        assert!(Instant::now() < deadline, "gleaner node did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let stats = dir.path().join("held.json");
    let stats_s = stats.to_str().unwrap();
    let workload_s = workload();
    let mut held = cg
        .command(
            gleaner_bin(),
            &[
                "run",
                "-q",
                "--local-mem",
                "64M..448M",
                "--stats",
                stats_s,
                "--",
                real_python(),
                workload_s.to_str().unwrap(),
                "--first-mib",
                "400",
                "--second-mib",
                "400",
                "--passes",
                "1",
                "--second-passes",
                "1",
                "--first-seconds",
                "6",
                "--second-seconds",
                "6",
            ],
        )
        .env(gleaner_node::client::SOCKET_ENV, &socket)
        .env("GLEANER_ELASTIC_NAME", "held")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting gleaner run");
    // Granted well above its floor.
    let deadline = Instant::now() + Duration::from_secs(20);
    let grown = loop {
        let st = status(&socket);
        if let Some(p) = program(&st, "held") {
            if u(&p["limit"]) >= 300 * MIB {
                break u(&p["limit"]);
            }
        }
        assert!(Instant::now() < deadline, "the program never grew: {st:#}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let antagonist = "x = b'\\x01' * (320 << 20)\nimport time\ntime.sleep(2)\n";
    let mut ant = cg
        .command(real_python(), &["-c", antagonist])
        .spawn()
        .expect("starting the antagonist");
    // Lowered (the decision's reason below says by whom).
    let deadline = Instant::now() + Duration::from_secs(3);
    let st = loop {
        let st = status(&socket);
        if program(&st, "held").is_some_and(|p| u(&p["limit"]) + 128 * MIB <= grown) {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "the grant ({grown}) was not lowered within 3 s: {st:#}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let between = st["decisions"].as_array().unwrap().iter().any(|d| {
        d["changes"].as_array().unwrap().iter().any(|c| {
            c["name"].as_str().unwrap_or("").starts_with("held")
                && c["why"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("between rounds")
        })
    });
    assert!(between, "no decision between rounds: {st:#}");
    let ant_status = ant.wait().unwrap();
    assert!(ant_status.success(), "the antagonist failed: {ant_status}");
    finished_well("held", wait_output(&mut held, Duration::from_secs(60)));
    assert_eq!(cg.oom_kills(), 0, "OOM kills in the cgroup");
    node.kill();
}
