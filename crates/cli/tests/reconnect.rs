//! Connections that break under a running program: a real `gleaner memnode` on TCP loopback, a
//! real `gleaner run` of tests/c/preload_program.c (which checks every byte it wrote), and
//! between them a proxy that cuts every connection over and over, or stalls them. A cut or a
//! stall shorter than the session's lease only makes the program wait: it completes with its
//! data intact and the stats count the reconnections. A stall past the lease stops it with exit
//! 86 and a message saying the memnode could not be reached again. Over a slow link the cuts
//! also land while write-backs are awaited (the eviction bell watched beside them).

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::proxy::FaultyProxy;
use common::{gleaner_bin, preload_program, wait_output, MemnodeProc, TempDir};
use gleaner_pager::FATAL_EXIT_CODE;
use gleaner_proto::Endpoint;

const LIMIT: Duration = Duration::from_secs(180);

/// Bytes the memnode must have sent through the proxy before it misbehaves: the program is
/// well under way by then (its start-up, handshakes included, is a few KiB).
const UNDER_WAY: u64 = 2 << 20;

fn memnode_addr(node: &MemnodeProc) -> SocketAddr {
    match &node.endpoint {
        Endpoint::Tcp(a) => a.parse().unwrap(),
        other => panic!("a TCP memnode was asked for, got {other}"),
    }
}

/// Runs `gleaner run --local-mem 8M [extra] -- preload_program mixed MB` against `proxy`, with
/// `misbehave` called on its own thread once the program is under way (it gets a flag that is
/// set when the run has ended). Returns (status, stdout, stderr, stats JSON).
fn run_through(
    node: &MemnodeProc,
    proxy: &Arc<FaultyProxy>,
    mb: &str,
    extra: &[&str],
    misbehave: impl FnOnce(&FaultyProxy, &AtomicBool) + Send + 'static,
) -> (Option<i32>, String, String, serde_json::Value) {
    let dir = TempDir::new("reconnect");
    let stats = dir.path().join("stats.json");
    let mut child = Command::new(gleaner_bin())
        .args(["run", "--local-mem", "8M", "--memnode"])
        .arg(proxy.addr.to_string())
        .arg("--token-file")
        .arg(&node.token_file)
        .arg("--stats")
        .arg(&stats)
        .args(extra)
        .args(["--", preload_program(), "mixed", mb])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let (p, d) = (proxy.clone(), done.clone());
    let misbehaving = std::thread::spawn(move || {
        let deadline = Instant::now() + LIMIT;
        while p.bytes_to_clients() < UNDER_WAY {
            if d.load(Ordering::SeqCst) || Instant::now() > deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        misbehave(&p, &d);
    });
    let (code, out, err) = wait_output(&mut child, LIMIT);
    done.store(true, Ordering::SeqCst);
    misbehaving.join().unwrap();
    let json = std::fs::read_to_string(&stats)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null);
    (code, out, err, json)
}

/// Cuts every connection of the program (fault handlers', reclaimers', the session's control
/// connection) every 100 ms, for as long as it runs.
fn cut_all_every_100ms(p: &FaultyProxy, done: &AtomicBool) {
    while !done.load(Ordering::SeqCst) {
        p.cut_all();
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn reconnects(stats: &serde_json::Value) -> u64 {
    stats["total"]["store"]["reconnects"].as_u64().unwrap_or(0)
}

#[test]
fn connections_cut_again_and_again_are_replaced_and_nothing_is_lost() {
    let node = MemnodeProc::start("127.0.0.1:0", "512M");
    let proxy = Arc::new(FaultyProxy::start(memnode_addr(&node)));
    let (code, out, err, stats) = run_through(&node, &proxy, "64", &[], cut_all_every_100ms);
    let (accepted, cut) = proxy.counts();
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("mixed ok"), "{out}");
    assert!(cut >= 3, "the proxy cut only {cut} connections: {err}");
    assert!(
        reconnects(&stats) >= 2,
        "{cut} connections cut, {accepted} accepted, but the stats show {} reconnections: \
         {stats}",
        reconnects(&stats)
    );
    // The data really travelled: most of 64 MiB went through the memnode at an 8 MiB budget.
    assert!(
        stats["total"]["faults"]["remote"].as_u64().unwrap() > (32 << 20) / 4096,
        "{stats}"
    );
}

/// The same over a slow link (32 MB/s each way): there a batch's write-back is awaited for
/// milliseconds, watching the eviction bell meanwhile (`Link::write_batch`), and cuts
/// land in that wait; the batch is sent again on a new connection and nothing is lost.
#[test]
fn connections_cut_while_write_backs_are_awaited_on_a_slow_link_lose_nothing() {
    let (dir, token) = common::token_file("reconnect-slow");
    let node =
        MemnodeProc::start_with_args("127.0.0.1:0", "512M", dir, token, &["--bandwidth", "32M"]);
    let proxy = Arc::new(FaultyProxy::start(memnode_addr(&node)));
    let (code, out, err, stats) = run_through(&node, &proxy, "24", &[], cut_all_every_100ms);
    let (_, cut) = proxy.counts();
    let evictions = &stats["total"]["evictions"];
    eprintln!(
        "{cut} connections cut, {} reconnections; {} pages written back in {} batches",
        reconnects(&stats),
        evictions["dirty"],
        evictions["batches"]
    );
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("mixed ok"), "{out}");
    assert!(cut >= 3, "the proxy cut only {cut} connections: {err}");
    assert!(reconnects(&stats) >= 2, "{stats}");
    assert!(
        evictions["dirty"].as_u64().unwrap() > (8 << 20) / 4096,
        "most of 24 MiB was written back through the slow link: {stats}"
    );
}

#[test]
fn a_stall_shorter_than_the_lease_only_makes_the_program_wait() {
    let node = MemnodeProc::start("127.0.0.1:0", "512M");
    let proxy = Arc::new(FaultyProxy::start(memnode_addr(&node)));
    // Replies stop for 2.5 s, more than the 1 s the client waits for one: its requests time out
    // and it reconnects (new connections stall too until the proxy lets go), well within the
    // memnode's 10 s lease.
    let (code, out, err, stats) =
        run_through(&node, &proxy, "64", &["--memnode-timeout", "1"], |p, _| {
            p.set_stalled(true);
            std::thread::sleep(Duration::from_millis(2500));
            p.set_stalled(false);
        });
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("mixed ok"), "{out}");
    assert!(reconnects(&stats) >= 1, "{stats}");
}

#[test]
fn a_stall_past_the_lease_stops_the_program_with_a_clear_error() {
    let dir = TempDir::new("lease");
    let token = dir.path().join("token");
    gleaner_proto::write_token_file(&token, &gleaner_proto::generate_token()).unwrap();
    let node = MemnodeProc::start_with_lease("127.0.0.1:0", "512M", dir, token, "1");
    let proxy = Arc::new(FaultyProxy::start(memnode_addr(&node)));
    let started = Instant::now();
    let (code, out, err, _) = run_through(
        &node,
        &proxy,
        "64",
        &["--memnode-timeout", "1"],
        |p, done| {
            p.set_stalled(true);
            while !done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(10));
            }
        },
    );
    assert_eq!(code, Some(FATAL_EXIT_CODE), "stdout: {out}\nstderr: {err}");
    assert!(!out.contains("mixed ok"), "{out}");
    assert!(
        err.contains("could not be reached again within 1.0 s (the session's lease)"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "giving up took {:?}",
        started.elapsed()
    );
}
