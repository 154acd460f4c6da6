//! Running gleaner as a service (issue 49): Prometheus metrics that parse with the reference
//! parser and move when work is done, systemd units that pass `systemd-analyze verify`, and
//! failure messages that say what happened.

mod common;
mod prom;

use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use common::MemnodeProc;
use gleaner_proto::{read_token_file, ConnectOptions, Connection};

/// The address the memnode logged for its metrics (`--metrics 127.0.0.1:0`).
fn metrics_addr(node: &MemnodeProc) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let err = node.stderr();
        if let Some(rest) = err.split("metrics at http://").nth(1) {
            return rest.split('/').next().unwrap().to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no metrics address logged: {err}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn memnode_metrics_parse_and_move_when_a_client_writes_pages() {
    let (dir, token_file) = common::token_file("metrics");
    let node = MemnodeProc::start_with_args(
        "127.0.0.1:0",
        "64M",
        dir,
        token_file,
        // A link (for the per-tenant queue metrics) fast enough not to slow the test.
        &["--metrics", "127.0.0.1:0", "--bandwidth", "1G"],
    );
    let addr = metrics_addr(&node);
    let (status, body) = prom::http_get(&addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    let before = prom::parse(&body);
    prom::check_conventions(&before);
    let v = prom::value;
    assert_eq!(
        v(&before, "gleaner_memnode_capacity_bytes", &[]),
        64.0 * 1048576.0
    );
    assert_eq!(v(&before, "gleaner_memnode_used_bytes", &[]), 0.0);
    assert_eq!(v(&before, "gleaner_memnode_sessions", &[]), 0.0);
    assert_eq!(
        prom::kind(&before, "gleaner_memnode_received_bytes_total"),
        "counter"
    );
    assert_eq!(prom::kind(&before, "gleaner_memnode_used_bytes"), "gauge");

    // A real client writes 64 pages of random bytes (they do not compress).
    let token = read_token_file(&node.token_file).unwrap();
    let opts = ConnectOptions {
        client_name: "metrics test".into(),
        ..ConnectOptions::default()
    };
    let mut c = Connection::connect(&node.endpoint, &token, None, &opts).unwrap();
    let pages: Vec<(u64, Vec<u8>)> = (0..64u64)
        .map(|i| {
            let mut p = vec![0u8; 4096];
            noise(&mut p, i);
            (i, p)
        })
        .collect();
    c.write_pages(pages.iter().map(|(i, p)| (*i, &p[..])))
        .unwrap();
    let _ = c.read_pages(&[0, 1, 2]).unwrap();
    // The memnode counts a reply's bytes once its write has returned, which may be after the
    // client has read it: scrape until the read's reply is counted (5 s at most).
    let sent_before = v(&before, "gleaner_memnode_sent_bytes_total", &[]);
    let deadline = Instant::now() + Duration::from_secs(5);
    let (body, after) = loop {
        let (_, body) = prom::http_get(&addr, "/metrics");
        let parsed = prom::parse(&body);
        if v(&parsed, "gleaner_memnode_sent_bytes_total", &[]) > sent_before + 3.0 * 4096.0
            || Instant::now() > deadline
        {
            break (body, parsed);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    prom::check_conventions(&after);
    assert!(
        v(&after, "gleaner_memnode_used_bytes", &[]) >= 64.0 * 4096.0,
        "bytes used did not grow: {body}"
    );
    assert!(
        v(
            &after,
            "gleaner_memnode_tenant_used_bytes",
            &[("tenant", "default")]
        ) >= 64.0 * 4096.0
    );
    assert_eq!(v(&after, "gleaner_memnode_sessions", &[]), 1.0);
    assert_eq!(v(&after, "gleaner_memnode_pages", &[]), 64.0);
    assert_eq!(v(&after, "gleaner_memnode_pages_written_total", &[]), 64.0);
    assert_eq!(v(&after, "gleaner_memnode_pages_read_total", &[]), 3.0);
    assert!(
        v(&after, "gleaner_memnode_received_bytes_total", &[])
            > v(&before, "gleaner_memnode_received_bytes_total", &[]) + 64.0 * 4096.0
    );
    assert!(
        v(&after, "gleaner_memnode_sent_bytes_total", &[])
            > v(&before, "gleaner_memnode_sent_bytes_total", &[]) + 3.0 * 4096.0
    );
    assert_eq!(
        v(
            &after,
            "gleaner_memnode_requests_total",
            &[("kind", "write")]
        ),
        1.0
    );
    let queue = |p: &serde_json::Value, class| {
        v(
            p,
            "gleaner_memnode_tenant_queue_requests_total",
            &[("tenant", "default"), ("class", class)],
        )
    };
    assert_eq!(queue(&before, "writeback"), 0.0);
    assert_eq!(queue(&after, "writeback"), 1.0, "{body}");
    assert_eq!(queue(&after, "demand"), 1.0, "{body}");
    assert!(
        v(
            &after,
            "gleaner_memnode_tenant_queue_bytes_total",
            &[("tenant", "default"), ("class", "writeback")]
        ) >= 64.0 * 4096.0
    );
    assert!(
        v(
            &after,
            "gleaner_memnode_tenant_queue_wait_seconds_total",
            &[("tenant", "default"), ("class", "writeback")]
        ) >= 0.0
    );
    // A read of a page never written is an error of its kind.
    assert!(c.read_pages(&[999]).is_err());
    // A connection attached to the session (a reconnection, as the pager makes one).
    let info = c.session();
    let again = Connection::connect(
        &node.endpoint,
        &token,
        Some((info.session_id, info.session_key)),
        &opts,
    )
    .unwrap();
    drop(again);
    let (_, body) = prom::http_get(&addr, "/metrics");
    let later = prom::parse(&body);
    assert_eq!(
        v(
            &later,
            "gleaner_memnode_errors_total",
            &[("kind", "not_found")]
        ),
        1.0
    );
    assert_eq!(
        v(&later, "gleaner_memnode_session_attaches_total", &[]),
        1.0
    );
    c.goodbye().unwrap();
    let (_, body) = prom::http_get(&addr, "/metrics");
    let gone = prom::parse(&body);
    assert_eq!(v(&gone, "gleaner_memnode_used_bytes", &[]), 0.0, "{body}");
    assert_eq!(
        v(
            &gone,
            "gleaner_memnode_sessions_ended_total",
            &[("how", "goodbye")]
        ),
        1.0
    );
    // Anything but /metrics is a clear 404.
    let (status, body) = prom::http_get(&addr, "/");
    assert!(status.contains("404"), "{status}");
    assert!(body.contains("/metrics"), "{body}");
}

/// Fills `p` with bytes that do not compress (an xorshift stream seeded by `seed`).
fn noise(p: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for b in p.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

/// Sends `sig` to the memnode.
fn signal(node: &MemnodeProc, sig: i32) {
    // SAFETY: kill(2) on a child we spawned and have not reaped (its Drop reaps it).
    unsafe { libc::kill(node.child.id() as i32, sig) };
}

/// Scrapes the memnode's metrics until `family` reaches `at_least` (60 s at most).
fn wait_for_metric(addr: &str, family: &str, at_least: f64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, body) = prom::http_get(addr, "/metrics");
        let now = prom::value(&prom::parse(&body), family, &[]);
        if now >= at_least {
            return;
        }
        assert!(Instant::now() < deadline, "{family} stayed at {now}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A memnode stopped (SIGSTOP) under a running program for 9 s, with a 3 s reply timeout: the
/// program says every second or so what it waits for and how long it will; the reply timeout
/// and the reconnection's handshake that times out are called timeouts (never "Resource
/// temporarily unavailable (os error 11)"); once the memnode goes on (SIGCONT) the program
/// reconnects and completes with its data intact.
#[test]
fn a_stopped_memnode_is_waited_for_out_loud_and_its_silence_called_a_timeout() {
    let (dir, token_file) = common::token_file("stopped");
    let node = MemnodeProc::start_with_args(
        "127.0.0.1:0",
        "512M",
        dir,
        token_file,
        &["--lease", "30", "--metrics", "127.0.0.1:0"],
    );
    let addr = metrics_addr(&node);
    let mut child = std::process::Command::new(common::gleaner_bin())
        .process_group(0)
        .args([
            "run",
            "--local-mem",
            "8M",
            "--memnode-timeout",
            "3",
            "--memnode",
        ])
        .arg(node.endpoint.to_string())
        .arg("--token-file")
        .arg(&node.token_file)
        .args(["--", common::preload_program(), "mixed", "64"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Under way: 16 MiB written back.
    wait_for_metric(&addr, "gleaner_memnode_pages_written_total", 4096.0);
    signal(&node, libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(9));
    signal(&node, libc::SIGCONT);
    let (code, out, err) = common::wait_output(&mut child, Duration::from_secs(120));
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("mixed ok"), "{out}");
    for bad in ["os error 11", "Resource temporarily unavailable"] {
        assert!(!err.contains(bad), "`{bad}` in: {err}");
    }
    assert!(
        err.contains("has not answered a")
            && err.contains("more before the connection counts as broken"),
        "no line said what the program waits for: {err}"
    );
    assert!(
        err.contains("timed out: the memnode did not answer a"),
        "the reply timeout is not called one: {err}"
    );
    assert!(
        err.contains(
            "timed out: the memnode accepted the connection but did not complete the handshake"
        ),
        "the reconnection's timeout is not called one: {err}"
    );
    assert!(
        err.contains("still reconnecting to the memnode at"),
        "{err}"
    );
}

/// tests/c/fill_memory.c built statically (`cc -static`, glibc's static libraries: Debian's
/// libc6-dev has them); its path. Fails loudly where no static C library is installed.
fn static_program(dir: &std::path::Path) -> std::path::PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = dir.join("fill_memory_static");
    common::compile_c(
        &["-O1", "-static"],
        &root.join("tests/c/fill_memory.c"),
        &out,
    );
    out
}

/// A static program started with `posix_spawn` and with `posix_spawnp` (a `PATH` search) is
/// named too, each with the child's own pid: Python's `os.posix_spawn[p]` call the C library's,
/// which the preload library wraps.
#[test]
fn static_programs_started_by_posix_spawn_are_named_with_their_pids() {
    let dir = common::TempDir::new("spawn");
    let prog = static_program(dir.path());
    let script = format!(
        "import os\n\
         os.environ['PATH'] = {dir:?} + ':' + os.environ['PATH']\n\
         pids = []\n\
         for fn, arg in ((os.posix_spawn, {prog:?}), (os.posix_spawnp, 'fill_memory_static')):\n\
         \x20   pids.append(fn(arg, [arg, '1'], os.environ))\n\
         \x20   os.waitpid(pids[-1], 0)\n\
         print('children', *pids, flush=True)\n",
        dir = dir.path().display().to_string(),
        prog = prog.display().to_string(),
    );
    let (code, out, err) = common::run_gleaner(
        &[
            "run",
            "--local-mem",
            "16M",
            "--",
            common::real_python(),
            "-c",
            &script,
        ],
        Duration::from_secs(60),
    );
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    // Printed once both children have exited, so no output of theirs runs into the line.
    let pids: Vec<&str> = out
        .lines()
        .find_map(|l| l.strip_prefix("children "))
        .unwrap_or_else(|| panic!("no `children` line: {out}"))
        .split_whitespace()
        .collect();
    assert_eq!(pids.len(), 2, "{out}");
    let line = err
        .lines()
        .find(|l| l.contains("ran without far memory"))
        .unwrap_or_else(|| panic!("no process named as running without far memory: {err}"));
    assert!(line.contains("2 processes"), "{line}");
    for pid in pids {
        assert!(
            line.contains(&format!("(pid {pid})")),
            "pid {pid} not named: {line}"
        );
    }
    assert_eq!(line.matches("statically linked").count(), 2, "{line}");
}

/// A statically linked program run under a shell (`sh -c ./static_program`) keeps its 64 MiB
/// local whatever the budget: the run's summary names it, with the reason, and the stats file
/// lists it; the shell itself ran on far memory.
#[test]
fn a_static_program_under_a_shell_is_named_in_the_summary() {
    let dir = common::TempDir::new("static");
    let prog = static_program(dir.path());
    let stats = dir.path().join("stats.json");
    let (code, out, err) = common::run_gleaner(
        &[
            "run",
            "--local-mem",
            "16M",
            "--stats",
            stats.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &format!("{} 64", prog.display()),
        ],
        Duration::from_secs(60),
    );
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("filled 64 MiB"), "{out}");
    let line = err
        .lines()
        .find(|l| l.contains("ran without far memory"))
        .unwrap_or_else(|| panic!("no process named as running without far memory: {err}"));
    assert!(line.contains("fill_memory_static"), "{line}");
    assert!(line.contains("statically linked"), "{line}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    let list = report["without_pager"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{report}");
    assert!(list[0]["program"]
        .as_str()
        .unwrap()
        .ends_with("fill_memory_static"));
    assert!(list[0]["pid"].as_u64().unwrap() > 0);
}

/// The command itself static: warned about at the start (as before) and named in the list.
#[test]
fn a_static_command_is_named_in_the_summary_and_the_stats() {
    let dir = common::TempDir::new("static-top");
    let prog = static_program(dir.path());
    let stats = dir.path().join("stats.json");
    let (code, out, err) = common::run_gleaner(
        &[
            "run",
            "--local-mem",
            "16M",
            "--stats",
            stats.to_str().unwrap(),
            "--",
            prog.to_str().unwrap(),
            "32",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("filled 32 MiB"), "{out}");
    assert!(
        err.contains("1 process of the run ran without far memory")
            && err.contains("statically linked"),
        "{err}"
    );
    assert!(
        err.contains("no process reported far-memory stats; a process of the run ran without a pager (named above)"),
        "the summary still says only that nothing reported: {err}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert_eq!(
        report["without_pager"].as_array().unwrap().len(),
        1,
        "{report}"
    );
}

/// A shell that drops LD_PRELOAD before it execs a (dynamic) program: named with that reason.
#[test]
fn a_program_started_without_ld_preload_is_named_in_the_summary() {
    let (code, out, err) = common::run_gleaner(
        &[
            "run",
            "--local-mem",
            "16M",
            "--",
            "sh",
            "-c",
            &format!(
                "unset LD_PRELOAD; exec {} mixed 8",
                common::preload_program()
            ),
        ],
        Duration::from_secs(60),
    );
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("mixed ok"), "{out}");
    let line = err
        .lines()
        .find(|l| l.contains("ran without far memory"))
        .unwrap_or_else(|| panic!("no process named as running without far memory: {err}"));
    assert!(line.contains("gleaner_preload_program"), "{line}");
    assert!(
        line.contains("LD_PRELOAD no longer names gleaner's library"),
        "{line}"
    );
}

/// A run where every process has its pager names none.
#[test]
fn a_run_where_every_process_has_a_pager_names_none() {
    let (code, out, err) = common::run_gleaner(
        &[
            "run",
            "--local-mem",
            "16M",
            "--",
            "sh",
            "-c",
            &format!("{} mixed 8", common::preload_program()),
        ],
        Duration::from_secs(60),
    );
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(!err.contains("ran without far memory"), "{err}");
}

/// `gleaner node --metrics`: the node daemon's metrics parse, and move when a pool registers
/// and when a client is refused.
#[test]
fn node_metrics_parse_and_move_when_a_pool_registers() {
    use std::io::BufRead;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    use gleaner_node::proto::{self, Reply};

    let dir = common::TempDir::new("node-metrics");
    let sock = dir.path().join("node.sock");
    let mut child = std::process::Command::new(common::gleaner_bin())
        .arg("node")
        .arg("--socket")
        .arg(&sock)
        .args(["--metrics", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let addr = loop {
        let mut line = String::new();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "no metrics address logged"
        );
        if let Some(rest) = line.split("metrics at http://").nth(1) {
            break rest.split('/').next().unwrap().to_string();
        }
    };
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("listening on"), "{line}");
    let v = prom::value;
    let (status, body) = prom::http_get(&addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    let before = prom::parse(&body);
    prom::check_conventions(&before);
    assert!(v(&before, "gleaner_node_memory_total_bytes", &[]) > 0.0);
    assert_eq!(v(&before, "gleaner_node_pools", &[]), 0.0);
    assert_eq!(
        v(
            &before,
            "gleaner_node_errors_total",
            &[("kind", "refused_client")]
        ),
        0.0
    );
    // A client the daemon refuses, then a soft pool that registers.
    let bad = UnixStream::connect(&sock).unwrap();
    proto::send_raw(&bad, b"not json", None).unwrap();
    assert!(matches!(
        proto::recv::<Reply>(&bad).unwrap().0,
        Reply::Error { .. }
    ));
    let (memfd, _ctrl) = gleaner_node::shared::create_pool_memfd("metrics-test", 4).unwrap();
    let c = UnixStream::connect(&sock).unwrap();
    let reg = br#"{"op":"register","version":1,"kind":"soft_pool","name":"metrics-test"}"#;
    proto::send_raw(&c, reg, Some(memfd.as_fd())).unwrap();
    assert!(matches!(
        proto::recv::<Reply>(&c).unwrap().0,
        Reply::Registered { .. }
    ));
    let (_, body) = prom::http_get(&addr, "/metrics");
    let after = prom::parse(&body);
    prom::check_conventions(&after);
    assert_eq!(v(&after, "gleaner_node_pools", &[]), 1.0, "{body}");
    assert_eq!(
        v(
            &after,
            "gleaner_node_errors_total",
            &[("kind", "refused_client")]
        ),
        1.0
    );
    assert!(
        v(
            &after,
            "gleaner_node_pool_limit_bytes",
            &[("name", "metrics-test")]
        ) >= 0.0,
        "{body}"
    );
    let (status, _) = prom::http_get(&addr, "/nothing");
    assert!(status.contains("404"), "{status}");
    let _ = child.kill();
    let _ = child.wait();
}

/// `gleaner status --prometheus` while a program runs on far memory: it parses, names the
/// process, and its counters move between two readings.
#[test]
fn status_prometheus_parses_and_shows_a_running_program() {
    let dir = common::TempDir::new("status-prom");
    let status_dir = dir.path().join("status");
    let mut child = std::process::Command::new(common::gleaner_bin())
        .process_group(0)
        .env("GLEANER_STATUS_DIR", &status_dir)
        .args(["run", "--local-mem", "8M", "--"])
        .args([common::preload_program(), "mixed", "512"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let scrape = || {
        let out = std::process::Command::new(common::gleaner_bin())
            .env("GLEANER_STATUS_DIR", &status_dir)
            .args(["status", "--prometheus"])
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let first = loop {
        let text = scrape();
        let parsed = prom::parse(&text);
        if prom::value(&parsed, "gleaner_programs", &[]) >= 1.0 {
            break parsed;
        }
        assert!(Instant::now() < deadline, "no program showed up: {text}");
        std::thread::sleep(Duration::from_millis(200));
    };
    prom::check_conventions(&first);
    let labels = [("program", "gleaner_preload_program")];
    assert_eq!(
        prom::value(&first, "gleaner_program_budget_bytes", &labels),
        8.0 * 1048576.0
    );
    assert_eq!(
        prom::kind(&first, "gleaner_program_faults_total"),
        "counter"
    );
    let out_before = prom::value(&first, "gleaner_program_sent_bytes_total", &labels);
    std::thread::sleep(Duration::from_millis(2500));
    let second = prom::parse(&scrape());
    let out_after = prom::value(&second, "gleaner_program_sent_bytes_total", &labels);
    let _ = child.kill();
    // SAFETY: kill(2) on the process group of a child we spawned (it leads it).
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let _ = child.wait();
    assert!(
        out_after > out_before,
        "pages sent out did not grow: {out_before} then {out_after}"
    );
}

/// Runs `make ARGS` in the repository root; panics with its output if it fails.
fn make(args: &[&str]) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::process::Command::new("make")
        .arg("-C")
        .arg(&root)
        .args(args)
        .output()
        .expect("make (scripts/setup.sh installs build-essential)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "make {args:?} failed:\n{text}");
    text
}

/// `make install` puts the systemd units, with the installed paths filled in, and their
/// environment files in place; `systemd-analyze verify` finds nothing to say about the units
/// (a warning, such as an unknown key, fails the test too: verify exits 0 on those).
#[test]
fn service_units_install_and_pass_systemd_analyze_verify() {
    let analyze = std::process::Command::new("systemd-analyze")
        .arg("--version")
        .output();
    assert!(
        analyze.is_ok_and(|o| o.status.success()),
        "CANNOT CHECK the service units: systemd-analyze is not installed (scripts/setup.sh \
         installs systemd); this test fails rather than pass unchecked"
    );
    let dir = common::TempDir::new("install");
    let prefix = dir.path().join("usr");
    let etc = dir.path().join("etc");
    make(&[
        "install",
        &format!("PREFIX={}", prefix.display()),
        &format!("SYSCONFDIR={}", etc.display()),
    ]);
    let units = prefix.join("lib/systemd/system");
    let memnode_unit = units.join("gleaner-memnode.service");
    let node_unit = units.join("gleaner-node.service");
    let text = std::fs::read_to_string(&memnode_unit).unwrap();
    assert!(!text.contains('@'), "a placeholder left: {text}");
    assert!(
        text.contains(&format!(
            "ExecStart={}/bin/gleaner memnode",
            prefix.display()
        )),
        "{text}"
    );
    assert!(text.contains(&format!(
        "EnvironmentFile=-{}/default/gleaner-memnode",
        etc.display()
    )));
    let env = std::fs::read_to_string(etc.join("default/gleaner-memnode")).unwrap();
    assert!(env.contains("GLEANER_MEMNODE_ARGS="), "{env}");
    assert!(prefix.join("lib/libgleaner_preload.so").is_file());
    let verify = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&memnode_unit)
        .arg(&node_unit)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&verify.stderr).into_owned()
        + &String::from_utf8_lossy(&verify.stdout);
    assert!(
        verify.status.success(),
        "systemd-analyze verify failed: {said}"
    );
    assert!(
        said.trim().is_empty(),
        "systemd-analyze verify warned: {said}"
    );

    // The environment file is the operator's once installed: a second install keeps it.
    std::fs::write(
        etc.join("default/gleaner-memnode"),
        "GLEANER_MEMNODE_ARGS=--lease 5\n",
    )
    .unwrap();
    // Staged under DESTDIR: files land there, and the paths inside them stay PREFIX's.
    let stage = dir.path().join("stage");
    make(&[
        "install",
        &format!("PREFIX={}", prefix.display()),
        &format!("SYSCONFDIR={}", etc.display()),
        &format!("DESTDIR={}", stage.display()),
    ]);
    make(&[
        "install",
        &format!("PREFIX={}", prefix.display()),
        &format!("SYSCONFDIR={}", etc.display()),
    ]);
    assert_eq!(
        std::fs::read_to_string(etc.join("default/gleaner-memnode")).unwrap(),
        "GLEANER_MEMNODE_ARGS=--lease 5\n"
    );
    let staged_unit = stage.join(memnode_unit.strip_prefix("/").unwrap());
    let staged = std::fs::read_to_string(&staged_unit)
        .unwrap_or_else(|e| panic!("{}: {e}", staged_unit.display()));
    assert!(staged.contains(&format!("ExecStart={}/bin/gleaner", prefix.display())));
    assert!(!staged.contains(stage.to_str().unwrap()), "{staged}");
    make(&[
        "uninstall",
        &format!("PREFIX={}", prefix.display()),
        &format!("SYSCONFDIR={}", etc.display()),
    ]);
    assert!(!memnode_unit.exists() && !prefix.join("bin/gleaner").exists());
}

/// A `--metrics` address that cannot be used fails the memnode's start with a message naming
/// it, before the `listening on` line a launcher waits for.
#[test]
fn a_bad_metrics_address_fails_the_start_clearly() {
    let (_dir, token) = common::token_file("bad-metrics");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap().to_string();
    for (addr, says) in [
        ("nonsense", "metrics address `nonsense`"),
        (taken_addr.as_str(), "for metrics"),
    ] {
        let out = std::process::Command::new(common::gleaner_bin())
            .args(["memnode", "--listen", "127.0.0.1:0", "--capacity", "1M"])
            .arg("--token-file")
            .arg(&token)
            .args(["--metrics", addr])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(1), "{addr}: {stdout} {stderr}");
        assert!(!stdout.contains("listening on"), "{addr}: {stdout}");
        assert!(stderr.contains(says), "{addr}: {stderr}");
    }
}
