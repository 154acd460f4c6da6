//! Write, read back byte-exact, free, and read freed pages over TCP loopback and a Unix socket.

mod common;

use std::time::Duration;

use common::{assert_not_found, assert_pages, write, TempDir, TestServer, P};

fn round_trip(server: &TestServer) {
    let mut c = server.connect();
    c.ping().unwrap();
    let first: Vec<(u64, u64)> = (0..256).map(|i| (i, 1000 + i)).collect();
    write(&mut c, &first).unwrap();
    write(&mut c, &[(1 << 40, 7), (u64::MAX, 8)]).unwrap();
    assert_pages(&mut c, &first);
    // Request order is kept, including reversed order and repeats.
    assert_pages(&mut c, &[(u64::MAX, 8), (5, 1005), (1 << 40, 7), (5, 1005)]);
    // Overwrite changes contents, not the count.
    write(&mut c, &[(5, 99)]).unwrap();
    assert_pages(&mut c, &[(5, 99), (6, 1006)]);
    assert_eq!(server.local_stats().used_bytes, 258 * P);

    c.free(&[(10, 3), (1 << 40, 1)]).unwrap();
    let msg = assert_not_found(&mut c, &[9, 10, 11, 12, 13]);
    assert_eq!(msg, "page(s) 10, 11, 12 not stored in this session");
    assert_not_found(&mut c, &[1 << 40]);
    assert_pages(&mut c, &[(9, 1009), (13, 1013), (u64::MAX, 8)]);
    assert_eq!(server.local_stats().used_bytes, 254 * P);

    // A range far larger than the session (u32::MAX ids) finishes at once.
    c.free(&[(0, u32::MAX)]).unwrap();
    assert_not_found(&mut c, &[0, 255]);
    assert_pages(&mut c, &[(u64::MAX, 8)]);
    c.free(&[(u64::MAX, 1)]).unwrap();
    let s = server.local_stats();
    assert_eq!(s.used_bytes, 0);
    assert_eq!(s.totals.requests.free, 3);
    assert!(
        s.totals.bytes_in > 258 * 4096,
        "bytes_in {}",
        s.totals.bytes_in
    );
    assert!(
        s.totals.bytes_out > 260 * 4096,
        "bytes_out {}",
        s.totals.bytes_out
    );
    c.goodbye().unwrap();
}

#[test]
fn round_trip_over_tcp_loopback() {
    let server = TestServer::tcp(1024);
    assert!(server.endpoint.to_string().starts_with("127.0.0.1:"));
    assert!(!server.endpoint.to_string().ends_with(":0"));
    round_trip(&server);
}

#[test]
fn round_trip_over_unix_socket() {
    let dir = TempDir::new("rt");
    let path = dir.path().join("m.sock");
    let server = TestServer::start(
        &format!("unix:{}", path.display()),
        1024,
        Duration::from_secs(10),
    );
    assert_eq!(
        server.endpoint.to_string(),
        format!("unix:{}", path.display())
    );
    round_trip(&server);
    let summary = server.stop();
    assert!(summary.requests > 0);
    assert!(!path.exists(), "socket file not removed at shutdown");
}
