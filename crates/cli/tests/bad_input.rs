//! What bad input gets: each case must produce a clear error (or a clear stop) and never hand the
//! program zero-filled pages in place of its data.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{gleaner_bin, run_gleaner, wait_output, MemnodeProc, TempDir};
use gleaner_pager::{PagerError, Region, RegionConfig, FATAL_EXIT_CODE};
use gleaner_proto::ClientError;

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn unreachable_memnode_is_named_in_the_error() {
    let dir = TempDir::new("unreach");
    let token = dir.path().join("token");
    gleaner_proto::write_token_file(&token, &gleaner_proto::generate_token()).unwrap();
    let cfg = RegionConfig::new(64 << 20, 8 << 20)
        .with_memnode("127.0.0.1:1".parse().unwrap(), Some(token.clone()));
    match Region::new(cfg) {
        Err(PagerError::Memnode(ClientError::Connect { endpoint, .. })) => {
            assert_eq!(endpoint.to_string(), "127.0.0.1:1")
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a region was created without a memnode"),
    }
    let (code, _, err) = run_gleaner(
        &[
            "bench",
            "micro",
            "--size",
            "16M",
            "--memnode",
            "127.0.0.1:1",
            "--token-file",
            token.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert_ne!(code, Some(0));
    assert!(
        err.contains("cannot connect to memnode at 127.0.0.1:1"),
        "{err}"
    );
}

#[test]
fn wrong_token_is_rejected_on_both_sides() {
    let node = MemnodeProc::start("127.0.0.1:0", "64M");
    let dir = TempDir::new("wrongtoken");
    let other = dir.path().join("token");
    gleaner_proto::write_token_file(&other, &gleaner_proto::generate_token()).unwrap();
    let cfg = RegionConfig::new(64 << 20, 8 << 20).with_memnode(node.endpoint.clone(), Some(other));
    match Region::new(cfg) {
        Err(PagerError::Memnode(e @ ClientError::AuthRejected { .. })) => {
            assert!(e.to_string().contains("rejected authentication"), "{e}");
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a wrong token was accepted"),
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !node.stderr().contains("authentication failed") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        node.stderr().contains("authentication failed"),
        "memnode log: {}",
        node.stderr()
    );
}

/// Starts `gleaner bench micro --size SIZE --local LOCAL --passes PASSES` against `node`
/// (`--floor-samples 0`, then `extra`), its output piped (or dropped when not `piped`).
fn spawn_bench_micro(
    node: &MemnodeProc,
    size: &str,
    local: &str,
    passes: &str,
    extra: &[&str],
    piped: bool,
) -> std::process::Child {
    let out = || if piped { Stdio::piped() } else { Stdio::null() };
    Command::new(gleaner_bin())
        .args([
            "bench", "micro", "--size", size, "--local", local, "--passes", passes,
        ])
        .arg("--memnode")
        .arg(node.endpoint.to_string())
        .args(["--floor-samples", "0"])
        .args(extra)
        .arg("--token-file")
        .arg(&node.token_file)
        .stdin(Stdio::null())
        .stdout(out())
        .stderr(out())
        .spawn()
        .unwrap()
}

/// A program whose memnode dies must stop with a clear message, not continue on zeros.
#[test]
fn memnode_death_stops_the_program_with_a_clear_message() {
    let mut node = MemnodeProc::start_short_lease("127.0.0.1:0", "1G");
    let mut child = spawn_bench_micro(&node, "64M", "25%", "1000", &[], true);
    // Let it get well into the measured passes (pages live on the memnode), then kill the memnode.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the benchmark ended too early"
    );
    node.kill();
    let (code, out, err) = wait_output(&mut child, LIMIT);
    assert_eq!(code, Some(FATAL_EXIT_CODE), "stdout: {out}\nstderr: {err}");
    assert!(err.contains("gleaner: FATAL"), "{err}");
    assert!(err.contains("lost"), "{err}");
    assert!(
        !out.contains("checksum"),
        "it must not report results: {out}"
    );
}

/// Shared memory, memnode killed while the program maps its slabs: the pages already written
/// stay in the program's own mappings, so it keeps running on its data (every word checked);
/// it is stopped (exit 86, naming the memnode) only when it needs memory the dead memnode would
/// have had to grant. Never zeros.
#[test]
fn memnode_death_on_shared_memory_keeps_the_data_and_stops_when_more_is_needed() {
    // A region that fits in the first slab: the run completes correctly without the memnode.
    let mut node = MemnodeProc::start_short_lease("unix", "1G");
    // Every pass faults every page in (no prefetching), so the run outlives the kill.
    let mut child = spawn_bench_micro(&node, "32M", "8M", "60", &["--prefetch", "none"], true);
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the benchmark ended too early"
    );
    node.kill();
    let (code, out, err) = wait_output(&mut child, LIMIT);
    assert_eq!(
        code,
        Some(0),
        "stdout: {out}
stderr: {err}"
    );
    assert!(out.contains("checksum") && out.contains(" ok"), "{out}");

    // A region that needs slab after slab while it fills: killed early, the memnode cannot
    // grant the next one, and the program stops clearly instead of continuing.
    let mut node = MemnodeProc::start_short_lease("unix", "4G");
    let addr2 = node.endpoint.to_string();
    let mut child = spawn_bench_micro(&node, "2G", "8M", "1", &[], true);
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the benchmark ended too early"
    );
    node.kill();
    let (code, out, err) = wait_output(&mut child, LIMIT);
    assert_eq!(
        code,
        Some(FATAL_EXIT_CODE),
        "stdout: {out}
stderr: {err}"
    );
    assert!(err.contains("gleaner: FATAL"), "{err}");
    assert!(
        err.contains(&addr2) && err.contains("may have stopped"),
        "{err}"
    );
    assert!(
        !out.contains("checksum"),
        "it must not report results: {out}"
    );
}

/// A program killed while it writes pages back: the memnode releases its slabs once the lease
/// runs out and goes on serving other programs.
#[test]
fn a_client_killed_while_writing_back_loses_the_memnode_nothing() {
    let node = MemnodeProc::start_short_lease("unix", "2G");
    let addr = node.endpoint.to_string();
    let mut child = spawn_bench_micro(&node, "1G", "8M", "3", &[], false);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the benchmark ended too early"
    );
    let stats = || {
        let (c, out, e) = run_gleaner(
            &[
                "memnode",
                "stats",
                "--addr",
                &addr,
                "--token-file",
                node.token_file.to_str().unwrap(),
            ],
            LIMIT,
        );
        assert_eq!(c, Some(0), "{e}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    let before = stats();
    assert!(
        before["host_bytes"].as_u64().unwrap() > 16 << 20,
        "the program's pages are in its slabs: {before}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = stats();
        // The session's pages go first, its slabs when the session ends: wait for both.
        if v["used_bytes"] == 0 && v["host_bytes"] == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the killed program's slabs were never released: {v}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // And the memnode still serves a new program, correctly.
    let (code, out, err) = run_gleaner(
        &[
            "bench",
            "micro",
            "--size",
            "32M",
            "--local",
            "8M",
            "--memnode",
            &addr,
            "--floor-samples",
            "0",
            "--token-file",
            node.token_file.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert_eq!(
        code,
        Some(0),
        "stdout: {out}
stderr: {err}"
    );
    assert!(out.contains(" ok"), "{out}");
}

/// A memnode that runs out of space: the region keeps pages locally while its overflow
/// allowance lasts, then stops the program with a clear message. Nothing is dropped. Over TCP
/// (refused writes) and over shared memory (refused grants).
#[test]
fn full_memnode_stops_the_program_clearly_and_drops_nothing() {
    full_memnode_stops_the_program("127.0.0.1:0");
    full_memnode_stops_the_program("unix");
}

fn full_memnode_stops_the_program(listen: &str) {
    let node = MemnodeProc::start(listen, "2M");
    let (code, out, err) = run_gleaner(
        &[
            "bench",
            "micro",
            "--size",
            "64M",
            "--local",
            "8M",
            "--memnode",
            &node.endpoint.to_string(),
            "--floor-samples",
            "0",
            "--token-file",
            node.token_file.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert_eq!(code, Some(FATAL_EXIT_CODE), "stdout: {out}\nstderr: {err}");
    assert!(err.contains("memnode full"), "{err}");
    assert!(err.contains("the memnode is full"), "{err}");
    assert!(!out.contains("checksum"), "{out}");
}

/// The control for the test above: the same run against a memnode with room for the spill
/// completes and verifies its checksum.
#[test]
fn memnode_large_enough_for_the_spill_works() {
    let node = MemnodeProc::start("127.0.0.1:0", "64M");
    let (code, out, err) = run_gleaner(
        &[
            "bench",
            "micro",
            "--size",
            "32M",
            "--local",
            "8M",
            "--memnode",
            &node.endpoint.to_string(),
            "--floor-samples",
            "0",
            "--token-file",
            node.token_file.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("checksum") && out.contains(" ok"), "{out}");
}

#[test]
fn budget_too_small_is_refused_at_start() {
    let (code, _, err) = run_gleaner(
        &["bench", "micro", "--size", "64M", "--local", "64K"],
        LIMIT,
    );
    assert_eq!(code, Some(1));
    assert!(err.contains("too small to make progress"), "{err}");
}

/// A non-root user with `vm.unprivileged_userfaultfd=0` and a root-only /dev/userfaultfd gets an
/// error naming the fixes. The test sets the sysctl to 0 for its duration if it was not already.
#[test]
fn userfaultfd_not_permitted_names_the_fixes() {
    let bin = gleaner_bin();
    assert!(
        nix_is_root(),
        "this test needs root to switch to an unprivileged user (CI runs as root)"
    );
    let sysctl = "/proc/sys/vm/unprivileged_userfaultfd";
    let before = std::fs::read_to_string(sysctl).unwrap();
    if before.trim() != "0" {
        std::fs::write(sysctl, "0").unwrap();
    }
    // Run a copy from a directory `nobody` can reach, wherever the checkout lives.
    let dir = TempDir::new("nobody");
    let copy = dir.path().join("gleaner");
    std::fs::copy(&bin, &copy).unwrap();
    for p in [dir.path(), copy.as_path()] {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&copy)
        .args(["bench", "micro", "--size", "16M", "--local", "50%"])
        .env("HOME", "/nonexistent")
        .output()
        .expect("setpriv (util-linux) runs the binary as nobody");
    if before.trim() != "0" {
        std::fs::write(sysctl, before.trim()).unwrap();
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("userfaultfd is not permitted"), "{err}");
    assert!(err.contains("vm.unprivileged_userfaultfd=1"), "{err}");
    assert!(err.contains("/dev/userfaultfd"), "{err}");
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
