//! Capacity is exact and shared by all sessions; a write that does not fit stores nothing.

mod common;

use gleaner_proto::{ClientError, ErrorCode};

use common::{assert_not_found, assert_pages, write, TestServer};

fn expect_full(r: Result<(), ClientError>) -> String {
    match r {
        Err(ClientError::Server {
            code: ErrorCode::Full,
            message,
            ..
        }) => message,
        Err(e) => panic!("expected Full, got {e}"),
        Ok(()) => panic!("expected Full, the write succeeded"),
    }
}

#[test]
fn full_batches_store_nothing_and_free_makes_room() {
    let server = TestServer::tcp(64);
    let mut a = server.connect();
    let mut b = server.connect();
    // Fill 62 of 64 pages from two sessions.
    let first: Vec<(u64, u64)> = (0..40).map(|i| (i, i)).collect();
    write(&mut a, &first).unwrap();
    write(&mut b, &(0..22).map(|i| (i, 500 + i)).collect::<Vec<_>>()).unwrap();
    assert_eq!(server.local_stats().used_pages, 62);

    // Straddles capacity: 2 overwrites + 4 new pages, only 2 free.
    let msg = expect_full(write(
        &mut a,
        &[(0, 900), (1, 901), (100, 1), (101, 2), (102, 3), (103, 4)],
    ));
    assert_eq!(msg, "memnode full: batch needs 4 new pages, 2 of 64 free");
    assert_not_found(&mut a, &[100]);
    assert_not_found(&mut a, &[101, 102, 103]);
    // The overwrites in the refused batch did not happen either.
    assert_pages(&mut a, &first);
    assert_eq!(server.local_stats().used_pages, 62);

    // Duplicates within a batch count once; overwrites count zero: this fits exactly.
    write(&mut a, &[(0, 900), (200, 1), (200, 2), (201, 3)]).unwrap();
    assert_pages(&mut a, &[(0, 900), (200, 2), (201, 3)]);
    let s = server.local_stats();
    assert_eq!((s.used_pages, s.free_pages), (64, 0));
    // Full for every session, even for one page.
    expect_full(write(&mut b, &[(1000, 1)]));
    // Overwriting in a full memnode is fine.
    write(&mut b, &[(0, 7)]).unwrap();
    assert_pages(&mut b, &[(0, 7)]);

    // Freeing in one session makes room for another.
    a.free(&[(0, 10)]).unwrap();
    assert_eq!(server.local_stats().used_pages, 54);
    write(&mut b, &(1000..1010).map(|i| (i, i)).collect::<Vec<_>>()).unwrap();
    expect_full(write(&mut b, &[(2000, 1)]));
    let s = server.local_stats();
    assert_eq!(s.used_pages, 64);
    assert_eq!(s.totals.errors_full, 3);
    assert_eq!(s.sessions.iter().map(|e| e.pages).sum::<u64>(), 64);

    // Goodbye returns a session's pages to the pool at once.
    a.goodbye().unwrap();
    assert_eq!(server.local_stats().used_pages, 32);
}
