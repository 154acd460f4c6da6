//! Session life: Goodbye releases at once; a dropped connection keeps the session for the lease,
//! during which the client can re-attach; several connections share one session safely; a write
//! that a replaced connection delivers late never overwrites a newer version of its page.

mod common;

use std::time::{Duration, Instant};

use common::{assert_pages, wait_until, write, TestServer, P};
use gleaner_proto::{Connection, PageBatch};

const LEASE: Duration = Duration::from_secs(1);

#[test]
fn goodbye_releases_at_once() {
    let server = TestServer::start("127.0.0.1:0", 100, LEASE);
    let mut c = server.connect();
    write(&mut c, &(0..50).map(|i| (i, i)).collect::<Vec<_>>()).unwrap();
    assert_eq!(server.local_stats().used_bytes, 50 * P);
    let info = c.session();
    c.goodbye().unwrap();
    let s = server.local_stats();
    assert_eq!(s.used_bytes, 0);
    assert_eq!(s.totals.sessions_ended_by_goodbye, 1);
    assert!(s.sessions.iter().all(|e| e.id != info.session_id));
    // The session is gone: attaching to it fails.
    assert!(server.attach(info.session_id, info.session_key).is_err());
}

#[test]
fn dropped_connection_keeps_pages_for_the_lease() {
    let server = TestServer::start("127.0.0.1:0", 100, LEASE);
    let mut c = server.connect();
    assert_eq!(c.session().lease_ms, 1000);
    write(&mut c, &(0..20).map(|i| (i, i)).collect::<Vec<_>>()).unwrap();
    let id = c.session().session_id;
    drop(c);
    let dropped = Instant::now();
    // The server notices the close, starts the lease, but keeps the pages.
    assert!(wait_until(Duration::from_secs(2), || {
        let s = server.local_stats();
        s.sessions
            .iter()
            .any(|e| e.id == id && e.live_connections == 0 && e.idle_s.is_some())
    }));
    assert_eq!(server.local_stats().used_bytes, 20 * P);
    assert!(
        wait_until(Duration::from_secs(5), || server.local_stats().used_bytes
            == 0),
        "pages not released after the lease"
    );
    let waited = dropped.elapsed();
    assert!(
        waited >= Duration::from_millis(900),
        "released after only {waited:?}"
    );
    let s = server.stats();
    assert_eq!(s.totals.sessions_released_by_lease, 1);
    assert!(s.sessions.iter().all(|e| e.id != id));
}

/// Writes one `(page, version)` entry of `len` bytes of `byte` on `conn`.
fn write_version(conn: &mut Connection, page: u64, version: u64, len: usize, byte: u8) {
    let buf = conn.write_buffer();
    PageBatch::begin(buf);
    PageBatch::push_slot(buf, page, version, len).fill(byte);
    conn.write_built_batch().unwrap();
}

#[test]
fn a_late_write_on_another_connection_never_overwrites_a_newer_version() {
    let server = TestServer::start("127.0.0.1:0", 100, LEASE);
    let mut replaced = server.connect();
    let info = replaced.session();
    let mut fresh = server.attach(info.session_id, info.session_key).unwrap();
    // The client wrote version 8 of page 7 on its new connection; then version 6, sent on the
    // connection it had given up on, reaches the memnode.
    write_version(&mut fresh, 7, 8, 500, 0x88);
    write_version(&mut replaced, 7, 6, 700, 0x66);
    let batch = fresh.read_pages(&[7]).unwrap();
    let (page, version, blob) = batch.get(0);
    assert_eq!((page, version), (7, 8));
    assert_eq!(blob, &[0x88; 500][..]);
    let stats = server.local_stats();
    assert_eq!(stats.totals.stale_writes, 1);
    assert_eq!(stats.used_bytes, 500, "the stale blob takes no capacity");
    // The same version again (a batch resent after a reconnection) is stored.
    write_version(&mut replaced, 7, 8, 400, 0x89);
    assert_eq!(fresh.read_pages(&[7]).unwrap().get(0).2, &[0x89; 400][..]);
}

#[test]
fn reattach_within_the_lease_sees_the_data() {
    let server = TestServer::start("127.0.0.1:0", 100, LEASE);
    let mut c = server.connect();
    let pages: Vec<(u64, u64)> = (0..10).map(|i| (i * 3, 70 + i)).collect();
    write(&mut c, &pages).unwrap();
    let info = c.session();
    drop(c);
    std::thread::sleep(Duration::from_millis(300));
    let mut again = server.attach(info.session_id, info.session_key).unwrap();
    assert_pages(&mut again, &pages);
    // Attached again, the session survives well past the lease.
    std::thread::sleep(LEASE * 2);
    assert_pages(&mut again, &pages);
    assert_eq!(server.local_stats().used_bytes, 10 * P);
    assert_eq!(server.local_stats().totals.sessions_released_by_lease, 0);
}

#[test]
fn connections_attached_to_one_session_work_concurrently() {
    let server = TestServer::tcp(10_000);
    let mut first = server.connect();
    let info = first.session();
    let threads: Vec<_> = (0..6u64)
        .map(|t| {
            let mut c = server.attach(info.session_id, info.session_key).unwrap();
            std::thread::spawn(move || {
                for round in 0..20u64 {
                    let pages: Vec<(u64, u64)> = (0..32)
                        .map(|i| (t * 1_000_000 + round * 32 + i, t * 7919 + round * 31 + i))
                        .collect();
                    write(&mut c, &pages).unwrap();
                    assert_pages(&mut c, &pages);
                }
                // Free half of what this thread wrote.
                c.free(&[(t * 1_000_000, 320)]).unwrap();
            })
        })
        .collect();
    for t in threads {
        common::join_within(t, Duration::from_secs(30));
    }
    let s = server.local_stats();
    assert_eq!(s.used_bytes, 6 * 320 * P);
    let entry = s.sessions.iter().find(|e| e.id == info.session_id).unwrap();
    assert_eq!(entry.pages_held, 6 * 320);
    assert_eq!(entry.stored_bytes, 6 * 320 * P);
    // Everything written by every thread is visible on the first connection.
    assert_pages(&mut first, &[(5_000_000 + 639, 5 * 7919 + 19 * 31 + 31)]);
}

/// `Fork` copies a session (a fork child's snapshot): the copy keeps the pages of the fork
/// moment whatever the parent writes or frees afterwards, and the other way round; it counts in
/// full against the capacity (a fork that does not fit is refused, charging nothing); it needs
/// the key to attach and goes with its lease like any session.
#[test]
fn a_forked_session_keeps_the_pages_of_the_fork_moment() {
    let server = TestServer::start("127.0.0.1:0", 100, LEASE);
    let mut parent = server.connect();
    let first: Vec<(u64, u64)> = (0..20).map(|i| (i, i)).collect();
    write(&mut parent, &first).unwrap();
    let (id, key) = parent.fork_session().unwrap();
    assert_eq!(
        server.local_stats().used_bytes,
        40 * P,
        "the copy counts in full"
    );
    // The parent moves on: half rewritten, half freed.
    write(
        &mut parent,
        &(0..10).map(|i| (i, i + 100)).collect::<Vec<_>>(),
    )
    .unwrap();
    parent.free(&[(10, 10)]).unwrap();
    assert!(server.attach(id, [0; 16]).is_err(), "the key is needed");
    let mut child = server.attach(id, key).unwrap();
    assert_pages(&mut child, &first);
    // The child's writes stay its own.
    write(&mut child, &[(0, 999)]).unwrap();
    assert_pages(&mut parent, &[(0, 100)]);
    assert_pages(&mut child, &[(0, 999), (15, 15)]);
    // 10 (parent) + 20 (child) pages held: a copy of a 70-page parent does not fit in 100.
    write(&mut parent, &(10..70).map(|i| (i, i)).collect::<Vec<_>>()).unwrap();
    let used = server.local_stats().used_bytes;
    assert_eq!(used, 90 * P);
    let refused = parent.fork_session().unwrap_err();
    assert_eq!(refused.server_code(), Some(gleaner_proto::ErrorCode::Full));
    assert_eq!(server.local_stats().used_bytes, used, "nothing charged");
    // The child's last connection closes: its pages go with the lease, the parent's stay.
    drop(child);
    assert!(
        wait_until(Duration::from_secs(5), || server.local_stats().used_bytes
            == 70 * P),
        "the forked session was not released after its lease"
    );
    assert_pages(&mut parent, &[(0, 100), (69, 69)]);
}
