//! Authentication: a wrong token is refused and counted; sessions are separate namespaces that
//! only the right key can attach to.

mod common;

use gleaner_proto::{generate_token, ClientError, Connection, PAGE_SIZE};

use common::{assert_not_found, assert_pages, write, TestServer};

#[test]
fn wrong_token_is_rejected_and_counted() {
    let server = TestServer::tcp(64);
    assert_eq!(server.stats().totals.auth_failures, 0);
    let wrong = generate_token();
    let err = Connection::connect(
        &server.endpoint,
        &wrong,
        None,
        &TestServer::opts("intruder"),
    )
    .unwrap_err();
    match &err {
        ClientError::AuthRejected { message, .. } => {
            assert!(message.contains("wrong token"), "{message}")
        }
        other => panic!("expected AuthRejected, got {other}"),
    }
    let s = server.stats();
    assert_eq!(s.totals.auth_failures, 1);
    assert_eq!(s.totals.session_attach_failures, 0);
    // No session was created for the intruder (the stats connection itself said goodbye).
    assert_eq!(
        s.sessions_total, 1,
        "only the stats session: {:?}",
        s.sessions
    );
    // The right token still works.
    server.connect().ping().unwrap();
}

#[test]
fn sessions_are_separate_namespaces() {
    let server = TestServer::tcp(64);
    let mut a = server.connect();
    let mut b = server.connect();
    assert_ne!(a.session().session_id, b.session().session_id);
    write(&mut a, &[(7, 1), (8, 2)]).unwrap();
    write(&mut b, &[(7, 3)]).unwrap();
    assert_pages(&mut a, &[(7, 1), (8, 2)]);
    assert_pages(&mut b, &[(7, 3)]);
    // B cannot see A's page 8, and freeing in B does not touch A.
    assert_not_found(&mut b, &[8]);
    b.free(&[(0, 100)]).unwrap();
    assert_pages(&mut a, &[(7, 1), (8, 2)]);
    assert_eq!(server.local_stats().used_bytes, 2 * PAGE_SIZE as u64);

    // Attaching with a wrong key (or to an unknown session) fails.
    let info = a.session();
    let mut bad_key = info.session_key;
    bad_key[0] ^= 1;
    for attempt in [
        server.attach(info.session_id, bad_key),
        server.attach(info.session_id ^ 0x5555, info.session_key),
    ] {
        match attempt {
            Err(ClientError::AuthRejected { message, .. }) => assert!(
                message.contains("unknown session or wrong session key"),
                "{message}"
            ),
            Err(e) => panic!("expected AuthRejected, got {e}"),
            Ok(_) => panic!("attach with a wrong key or id succeeded"),
        }
    }
    let s = server.local_stats();
    assert_eq!(s.totals.auth_failures, 2);
    assert_eq!(s.totals.session_attach_failures, 2);

    // The right key sees the session's pages, and writes through it are visible to `a`.
    let mut a2 = server.attach(info.session_id, info.session_key).unwrap();
    assert_eq!(a2.session().session_id, info.session_id);
    assert_pages(&mut a2, &[(7, 1), (8, 2)]);
    write(&mut a2, &[(9, 4)]).unwrap();
    assert_pages(&mut a, &[(9, 4)]);
    let s = server.local_stats();
    let entry = s.sessions.iter().find(|e| e.id == info.session_id).unwrap();
    assert_eq!(entry.live_connections, 2);
    assert_eq!(entry.pages_held, 3);
    assert_eq!(entry.client, "test");
}
