//! Capacity is counted in bytes, exact and shared by all sessions; a write that does not fit
//! stores nothing.

mod common;

use gleaner_memnode::{Server, ServerConfig, ServerError};
use gleaner_proto::{generate_token, ClientError, ErrorCode, MAX_BLOB_SIZE, PAGE_SIZE};

use common::{assert_blobs, assert_not_found, assert_pages, write, write_blobs, TestServer, P};

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
    assert_eq!(a.session().capacity_bytes, 64 * P);
    // Fill 62 of 64 pages from two sessions.
    let first: Vec<(u64, u64)> = (0..40).map(|i| (i, i)).collect();
    write(&mut a, &first).unwrap();
    write(&mut b, &(0..22).map(|i| (i, 500 + i)).collect::<Vec<_>>()).unwrap();
    assert_eq!(server.local_stats().used_bytes, 62 * P);

    // Straddles capacity: 2 overwrites + 4 new pages, only 2 free.
    let msg = expect_full(write(
        &mut a,
        &[(0, 900), (1, 901), (100, 1), (101, 2), (102, 3), (103, 4)],
    ));
    assert_eq!(
        msg,
        "memnode full: batch needs 16384 more bytes, 8192 of 262144 free \
         (8.00 KiB of 256.00 KiB)"
    );
    assert_not_found(&mut a, &[100]);
    assert_not_found(&mut a, &[101, 102, 103]);
    // The overwrites in the refused batch did not happen either.
    assert_pages(&mut a, &first);
    assert_eq!(server.local_stats().used_bytes, 62 * P);

    // Duplicates within a batch count once; same-size overwrites count zero: this fits exactly.
    write(&mut a, &[(0, 900), (200, 1), (200, 2), (201, 3)]).unwrap();
    assert_pages(&mut a, &[(0, 900), (200, 2), (201, 3)]);
    let s = server.local_stats();
    assert_eq!((s.used_bytes, s.free_bytes), (64 * P, 0));
    // Full for every session, even for one page.
    expect_full(write(&mut b, &[(1000, 1)]));
    // Overwriting in a full memnode is fine.
    write(&mut b, &[(0, 7)]).unwrap();
    assert_pages(&mut b, &[(0, 7)]);

    // Freeing in one session makes room for another.
    a.free(&[(0, 10)]).unwrap();
    assert_eq!(server.local_stats().used_bytes, 54 * P);
    write(&mut b, &(1000..1010).map(|i| (i, i)).collect::<Vec<_>>()).unwrap();
    expect_full(write(&mut b, &[(2000, 1)]));
    let s = server.local_stats();
    assert_eq!(s.used_bytes, 64 * P);
    assert_eq!(s.totals.errors_full, 3);
    assert_eq!(s.sessions.iter().map(|e| e.pages_held).sum::<u64>(), 64);
    assert_eq!((s.pages_held, s.stored_bytes), (64, 64 * P));

    // Goodbye returns a session's pages to the pool at once.
    a.goodbye().unwrap();
    assert_eq!(server.local_stats().used_bytes, 32 * P);
}

#[test]
fn blobs_of_any_size_round_trip_and_count_their_length() {
    // Four pages of capacity.
    let server = TestServer::tcp(4);
    let mut c = server.connect();
    let blobs = [
        (1, 11, 1),
        (2, 12, 100),
        (3, 13, PAGE_SIZE),
        (4, 14, MAX_BLOB_SIZE),
    ];
    write_blobs(&mut c, &blobs).unwrap();
    assert_blobs(&mut c, &blobs);
    assert_blobs(
        &mut c,
        &[(4, 14, MAX_BLOB_SIZE), (1, 11, 1), (4, 14, MAX_BLOB_SIZE)],
    );
    let stored = (1 + 100 + PAGE_SIZE + MAX_BLOB_SIZE) as u64;
    let s = server.local_stats();
    assert_eq!(s.used_bytes, stored);
    assert_eq!(s.free_bytes, 4 * P - stored);
    assert_eq!(s.pages_held, 4);
    assert_eq!(s.page_bytes_held, 4 * P);
    assert_eq!(s.stored_bytes, stored);
    assert_eq!(s.slab_bytes, 0);
    assert_eq!(s.host_bytes, stored);
    let me = &s.sessions[0];
    assert_eq!(
        (me.pages_held, me.page_bytes_held, me.stored_bytes),
        (4, 4 * P, stored)
    );

    // Many small blobs fit where their pages would not: 4 × 4096 bytes hold 200 blobs of 50,
    // once the 8357 bytes above are freed (10 000 bytes do not fit in the 8027 free).
    let small: Vec<(u64, u64, usize)> = (100..300).map(|i| (i, i, 50)).collect();
    assert_eq!(s.free_bytes, 8027);
    expect_full(write_blobs(&mut c, &small));
    c.free(&[(1, 4)]).unwrap();
    assert_eq!(server.local_stats().used_bytes, 0);
    write_blobs(&mut c, &small).unwrap();
    assert_blobs(&mut c, &small);
    let s = server.local_stats();
    assert_eq!(
        (s.pages_held, s.page_bytes_held, s.stored_bytes),
        (200, 200 * P, 200 * 50)
    );

    // Overwriting with smaller blobs frees bytes; with larger ones needs them, all or nothing.
    write_blobs(&mut c, &[(100, 1, 10), (101, 2, 10)]).unwrap();
    assert_eq!(server.local_stats().used_bytes, 198 * 50 + 20);
    let free = 4 * P - (198 * 50 + 20);
    let msg = expect_full(write_blobs(
        &mut c,
        &[
            (100, 3, MAX_BLOB_SIZE),
            (101, 4, MAX_BLOB_SIZE),
            (102, 5, MAX_BLOB_SIZE),
        ],
    ));
    let needed = 3 * MAX_BLOB_SIZE as u64 - (10 + 10 + 50);
    assert!(
        msg.starts_with(&format!(
            "memnode full: batch needs {needed} more bytes, {free} of 16384 free"
        )),
        "{msg}"
    );
    assert_blobs(&mut c, &[(100, 1, 10), (101, 2, 10), (102, 102, 50)]);
}

#[test]
fn a_capacity_below_one_page_is_refused() {
    for bytes in [0, PAGE_SIZE as u64 - 1] {
        let config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), bytes, generate_token());
        match Server::bind(config) {
            Err(ServerError::Config(why)) => assert_eq!(
                why,
                format!("capacity must be at least one page (4096 bytes), not {bytes} bytes")
            ),
            Err(e) => panic!("expected a configuration error, got {e}"),
            Ok(_) => panic!("a capacity of {bytes} bytes was accepted"),
        }
    }
    // One page, not a multiple of it beyond: fine.
    let server = TestServer::start_with(ServerConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        PAGE_SIZE as u64 + 10,
        generate_token(),
    ));
    assert_eq!(server.connect().session().capacity_bytes, 4106);
}
