//! A pool of memnodes under a running program: three real `gleaner memnode` processes on TCP
//! loopback, `gleaner run --memnode A,B,C` (two replicas of every extent) of
//! tests/c/preload_program.c, which checks every byte it wrote. Pages spread over all three;
//! `kill -9` of one during the run loses nothing (its extents are copied anew from the
//! survivors); `kill -9` of two stops the program with exit 86 and a message naming them;
//! `gleaner memnode drain` of one moves its pages to the others and it exits, the program
//! unaffected.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    gleaner_bin, memnodes_sharing_a_token_with_lease, preload_program, run_gleaner, wait_output,
    MemnodeProc, TempDir, SHORT_LEASE_SECS,
};
use gleaner_pager::FATAL_EXIT_CODE;
use gleaner_proto::{ConnectOptions, Connection};

const LIMIT: Duration = Duration::from_secs(180);

/// Three memnodes sharing one token, with a short lease: the tests kill memnodes, and the
/// pool's clients give up on a dead one after its lease.
fn three_memnodes() -> (Vec<MemnodeProc>, TempDir) {
    memnodes_sharing_a_token_with_lease(3, "1G", SHORT_LEASE_SECS)
}

fn addresses(nodes: &[MemnodeProc]) -> String {
    nodes
        .iter()
        .map(|n| n.endpoint.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Starts `gleaner run --local-mem 8M --memnode A,B,C --stats FILE -- preload_program mixed MB`.
fn start_run(nodes: &[MemnodeProc], stats: &std::path::Path, mb: &str) -> Child {
    start_run_with(nodes, stats, mb, &[])
}

/// As [`start_run`], with more environment variables.
fn start_run_with(
    nodes: &[MemnodeProc],
    stats: &std::path::Path,
    mb: &str,
    env: &[(&str, &std::path::Path)],
) -> Child {
    Command::new(gleaner_bin())
        .envs(env.iter().copied())
        .args(["run", "--local-mem", "8M", "--memnode", &addresses(nodes)])
        .arg("--token-file")
        .arg(&nodes[0].token_file)
        .arg("--stats")
        .arg(stats)
        .args(["--", preload_program(), "mixed", mb])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Pages the run's session holds on `node` (its `pages_held` stat, every session of it).
fn pages_held(node: &MemnodeProc) -> u64 {
    let token = gleaner_proto::read_token_file(&node.token_file).unwrap();
    let Ok(mut c) = Connection::connect(&node.endpoint, &token, None, &ConnectOptions::default())
    else {
        return 0;
    };
    let stats: serde_json::Value = serde_json::from_str(&c.stats().unwrap()).unwrap();
    let _ = c.goodbye();
    stats["pages_held"].as_u64().unwrap_or(0)
}

/// Waits until `node` holds at least `pages` of the run's pages: the program is well under
/// way.
fn wait_for_pages(node: &MemnodeProc, pages: u64) {
    let deadline = Instant::now() + LIMIT;
    while pages_held(node) < pages {
        assert!(
            Instant::now() < deadline,
            "the memnode never got {pages} pages"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read_stats(path: &std::path::Path) -> serde_json::Value {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null)
}

fn pool_stats(stats: &serde_json::Value) -> &serde_json::Value {
    &stats["processes"][0]["stats"]["store"]["pool"]
}

#[test]
fn pages_spread_over_the_pool_with_two_replicas() {
    let (nodes, _token) = three_memnodes();
    let dir = TempDir::new("pool-run");
    let stats_path = dir.path().join("stats.json");
    let mut child = start_run(&nodes, &stats_path, "64");
    let (code, out, err) = wait_output(&mut child, LIMIT);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("mixed ok"), "{out}");
    let stats = read_stats(&stats_path);
    let pool = pool_stats(&stats);
    assert_eq!(pool["replicas"], 2, "{stats}");
    let members = pool["memnodes"].as_array().unwrap();
    assert_eq!(members.len(), 3);
    let mut extents = 0;
    for m in members {
        assert_eq!(m["alive"], true, "{m}");
        assert!(
            m["extents"].as_u64().unwrap() > 0,
            "every memnode got extents: {pool}"
        );
        assert!(m["pages_written"].as_u64().unwrap() > 0, "{pool}");
        extents += m["extents"].as_u64().unwrap();
    }
    assert_eq!(extents % 2, 0, "two replicas of every extent: {pool}");
    assert_eq!(pool["extents_degraded"], 0, "{pool}");
    assert!(
        stats["total"]["faults"]["remote"].as_u64().unwrap() > (32 << 20) / 4096,
        "{stats}"
    );
}

#[test]
fn killing_one_memnode_of_three_loses_nothing() {
    let (mut nodes, _token) = three_memnodes();
    let dir = TempDir::new("pool-run");
    let stats_path = dir.path().join("stats.json");
    let mut child = start_run(&nodes, &stats_path, "96");
    wait_for_pages(&nodes[1], 2000);
    let victim = nodes[1].endpoint.to_string();
    nodes[1].kill();
    let (code, out, err) = wait_output(&mut child, LIMIT);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(
        out.contains("mixed ok"),
        "every byte read back was right: {out}"
    );
    assert!(err.contains(&format!("memnode {victim} is lost")), "{err}");
    let stats = read_stats(&stats_path);
    let pool = pool_stats(&stats);
    let members = pool["memnodes"].as_array().unwrap();
    let dead: Vec<_> = members.iter().filter(|m| m["alive"] == false).collect();
    assert_eq!(dead.len(), 1, "{pool}");
    assert_eq!(dead[0]["endpoint"], victim.as_str(), "{pool}");
    assert!(
        pool["extents_repaired"].as_u64().unwrap() >= 1
            && pool["pages_repaired"].as_u64().unwrap() > 0,
        "the lost memnode's extents were copied anew: {pool}"
    );
}

#[test]
fn draining_a_memnode_moves_its_pages_and_it_exits_empty() {
    let (mut nodes, _token) = three_memnodes();
    let dir = TempDir::new("pool-run");
    let stats_path = dir.path().join("stats.json");
    let mut child = start_run(&nodes, &stats_path, "96");
    wait_for_pages(&nodes[1], 2000);
    let drained = nodes[1].endpoint.to_string();
    let drain = Command::new(gleaner_bin())
        .args(["memnode", "drain", "--addr", &drained, "--timeout", "120"])
        .arg("--token-file")
        .arg(&nodes[1].token_file)
        .output()
        .unwrap();
    let drain_out = String::from_utf8_lossy(&drain.stdout).into_owned();
    assert!(
        drain.status.success(),
        "{drain_out}{}",
        String::from_utf8_lossy(&drain.stderr)
    );
    assert!(drain_out.contains("is draining"), "{drain_out}");
    assert!(drain_out.contains("drained and stopped"), "{drain_out}");
    // The memnode exited on its own, cleanly.
    let status = nodes[1].child.wait().unwrap();
    assert!(status.success(), "the drained memnode exited with {status}");
    let (code, out, err) = wait_output(&mut child, LIMIT);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(
        out.contains("mixed ok"),
        "every byte read back was right: {out}"
    );
    let stats = read_stats(&stats_path);
    let pool = pool_stats(&stats);
    let member = pool["memnodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["endpoint"] == drained.as_str())
        .unwrap();
    assert_eq!(member["drained"], true, "{pool}");
    assert!(pool["pages_repaired"].as_u64().unwrap() > 0, "{pool}");
    assert_eq!(pool["extents_degraded"], 0, "{pool}");
}

/// Builds 64 MiB that it keeps, waits, then reads it all back (so every far page is needed
/// again after the memnodes are killed during the wait).
const KEEPER: &str = "import hashlib, time\n\
blocks = [bytearray((b'%08d' % i) * 131072) for i in range(64)]\n\
print('built', flush=True)\n\
time.sleep(2)\n\
h = hashlib.sha256()\n\
for b in blocks: h.update(b)\n\
print('checksum', h.hexdigest())\n";

#[test]
fn killing_two_memnodes_of_three_stops_the_program_naming_them() {
    let (mut nodes, _token) = three_memnodes();
    let mut child = Command::new(gleaner_bin())
        .args(["run", "--local-mem", "8M", "--memnode", &addresses(&nodes)])
        .arg("--token-file")
        .arg(&nodes[0].token_file)
        .args(["--", "python3", "-c", KEEPER])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once much of the 64 MiB is far (two replicas of each page: 16000 pages held is 31 MiB),
    // the victims are the pair of memnodes that shares the most pages. Each extent is placed
    // on two memnodes, so held[a] + held[b] - held[c] is twice the pages on exactly a and b;
    // placement is random, and a pair the test picked blindly (it did once) may share none.
    let deadline = Instant::now() + LIMIT;
    let held = loop {
        let held: Vec<i64> = nodes.iter().map(|n| pages_held(n) as i64).collect();
        if held.iter().sum::<i64>() >= 16_000 {
            break held;
        }
        assert!(Instant::now() < deadline, "too few far pages: {held:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let (a, b, shared) = [(0, 1, 2), (0, 2, 1), (1, 2, 0)]
        .into_iter()
        .map(|(a, b, c)| (a, b, (held[a] + held[b] - held[c]) / 2))
        .max_by_key(|&(_, _, shared)| shared)
        .unwrap();
    assert!(shared > 0, "no pair shares pages: {held:?}");
    let victims = [nodes[a].endpoint.to_string(), nodes[b].endpoint.to_string()];
    // Both must fail at once: killed one after the other, the pool may copy every extent the
    // first held onto the survivors before the second dies, and then nothing is lost.
    nodes[a].freeze();
    nodes[b].freeze();
    nodes[a].kill();
    nodes[b].kill();
    let (code, out, err) = wait_output(&mut child, LIMIT);
    assert_eq!(code, Some(FATAL_EXIT_CODE), "stdout: {out}\nstderr: {err}");
    assert!(!out.contains("checksum"), "no result from lost data: {out}");
    let fatal = err
        .lines()
        .find(|l| l.contains("FATAL"))
        .unwrap_or_else(|| panic!("no FATAL line: {err}"));
    assert!(fatal.contains("lost memnodes: "), "{fatal}");
    for v in &victims {
        assert!(fatal.contains(v.as_str()), "{v} is not named: {fatal}");
    }
}

#[test]
fn gleaner_status_shows_the_running_program_and_its_pool() {
    let (nodes, _token) = three_memnodes();
    let dir = TempDir::new("pool-status");
    let status_dir = dir.path().join("status");
    let stats_path = dir.path().join("stats.json");
    let mut child = start_run_with(
        &nodes,
        &stats_path,
        "96",
        &[("GLEANER_STATUS_DIR", status_dir.as_path())],
    );
    wait_for_pages(&nodes[2], 2000);
    let status = |args: &[&str]| {
        let out = Command::new(gleaner_bin())
            .arg("status")
            .args(args)
            .env("GLEANER_STATUS_DIR", &status_dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // The first document appears within a second of the start; rates need two.
    let deadline = Instant::now() + Duration::from_secs(30);
    let doc = loop {
        let all: serde_json::Value = serde_json::from_str(&status(&["--json"])).unwrap();
        let found = all
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["program"] == "gleaner_preload_program" && d["per_second"].is_object())
            .cloned();
        if let Some(d) = found {
            break d;
        }
        assert!(Instant::now() < deadline, "no status document: {all}");
        std::thread::sleep(Duration::from_millis(100));
    };
    // The program's own process (a child of `gleaner run`) publishes it.
    let pid = doc["pid"].as_u64().unwrap();
    assert_ne!(pid, u64::from(child.id()), "{doc}");
    assert!(Path::new(&format!("/proc/{pid}")).exists(), "{doc}");
    let pool = &doc["stats"]["store"]["pool"];
    assert_eq!(pool["memnodes"].as_array().unwrap().len(), 3, "{doc}");
    assert!(
        doc["per_second"]["remote_faults"].as_f64().is_some(),
        "{doc}"
    );
    let table = status(&[]);
    assert!(table.contains("gleaner_preload_program"), "{table}");
    assert!(table.contains("a pool of 3 memnodes"), "{table}");
    assert!(table.contains(&nodes[0].endpoint.to_string()), "{table}");
    let (code, out, err) = wait_output(&mut child, LIMIT);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    // The program is gone: its status goes with it.
    assert!(status(&[]).contains("no program is running"));
}

/// Builds 48 MiB, says so, sleeps 8 s (touching nothing), then reads it all back.
const SLEEPER: &str = "import hashlib, time\n\
blocks = [bytearray((b'%08d' % i) * 131072) for i in range(48)]\n\
print('built', flush=True)\n\
time.sleep(8)\n\
h = hashlib.sha256()\n\
for b in blocks: h.update(b)\n\
print('checksum', h.hexdigest(), flush=True)\n";

#[test]
fn a_memnode_killed_while_the_program_is_idle_is_replaced_before_it_is_needed() {
    let (mut nodes, _token) = three_memnodes();
    let dir = TempDir::new("pool-idle");
    let status_dir = dir.path().join("status");
    // The all-local run, beside (it sleeps as long).
    let local = Command::new("python3")
        .args(["-c", SLEEPER])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = Command::new(gleaner_bin())
        .args(["run", "--local-mem", "8M", "--memnode", &addresses(&nodes)])
        .arg("--token-file")
        .arg(&nodes[0].token_file)
        .args(["--", "python3", "-c", SLEEPER])
        .env("GLEANER_STATUS_DIR", &status_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "built");
    // Write-backs of the last pages built finish; from here on the program asks nothing.
    std::thread::sleep(Duration::from_secs(1));
    let victim = nodes[1].endpoint.to_string();
    nodes[1].kill();
    // Within the sleep, with no request of the program's, the pool notices the loss (its
    // pings) and copies the lost memnode's extents elsewhere.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let out = Command::new(gleaner_bin())
            .args(["status", "--json"])
            .env("GLEANER_STATUS_DIR", &status_dir)
            .output()
            .unwrap();
        let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let repaired = all.as_array().unwrap().iter().any(|d| {
            let pool = &d["stats"]["store"]["pool"];
            pool["extents_repaired"].as_u64().unwrap_or(0) > 0
                && pool["memnodes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|m| m["endpoint"] == victim.as_str() && m["alive"] == false)
        });
        if repaired {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the idle program's pool did not replace {victim}: {all}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = child.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{status}: {err}");
    let want = String::from_utf8(local.wait_with_output().unwrap().stdout).unwrap();
    assert!(want.contains("checksum"), "{want}");
    assert_eq!(format!("built\n{rest}"), want, "{err}");
}

#[test]
fn a_pool_starts_without_a_memnode_that_is_down_and_says_so() {
    let (mut nodes, _token) = three_memnodes();
    let all = addresses(&nodes);
    let down = nodes[2].endpoint.to_string();
    nodes[2].kill();
    let dir = TempDir::new("pool-down");
    let stats = dir.path().join("stats.json");
    let token = nodes[0].token_file.to_string_lossy().into_owned();
    let stats_s = stats.to_string_lossy().into_owned();
    let (code, out, err) = run_gleaner(
        &[
            "run",
            "--local-mem",
            "8M",
            "--memnode",
            &all,
            "--token-file",
            &token,
            "--stats",
            &stats_s,
            "--",
            preload_program(),
            "mixed",
            "64",
        ],
        LIMIT,
    );
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("mixed ok"), "{out}");
    assert!(
        err.contains(&format!("cannot reach the memnode at {down}"))
            && err.contains("runs without it"),
        "{err}"
    );
    let stats = read_stats(&stats);
    let members = pool_stats(&stats)["memnodes"].as_array().unwrap().len();
    assert_eq!(members, 2, "{stats}");
    // With every memnode down, it is an error naming them.
    nodes[0].kill();
    nodes[1].kill();
    let (code, _, err) = run_gleaner(
        &[
            "run",
            "--local-mem",
            "8M",
            "--memnode",
            &all,
            "--token-file",
            &token,
            "--",
            "true",
        ],
        LIMIT,
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("none of the memnodes"), "{err}");
}

#[test]
fn more_replicas_than_memnodes_is_a_clear_error() {
    let (nodes, _token) = three_memnodes();
    let two = addresses(&nodes[..2]);
    let token = nodes[0].token_file.to_string_lossy().into_owned();
    let (code, _, err) = run_gleaner(
        &[
            "run",
            "--local-mem",
            "8M",
            "--memnode",
            &two,
            "--token-file",
            &token,
            "--replicas",
            "3",
            "--",
            "true",
        ],
        LIMIT,
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--replicas 3: give 1 to 2"), "{err}");
}
