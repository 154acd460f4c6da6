//! Shared-memory slabs over a real Unix socket: a granted memfd is the client's to map and write;
//! grants count against capacity and are released with the session; a session never sees
//! another's slabs; TCP clients are refused.

mod common;

use std::os::fd::AsFd;
use std::time::Duration;

use common::{wait_until, TempDir, TestServer};
use gleaner_proto::{ErrorCode, SlabGrant, PAGE_SIZE};

fn unix_server(tag: &str, capacity: u64, lease: Duration) -> (TempDir, TestServer) {
    let dir = TempDir::new(tag);
    let listen = format!("unix:{}", dir.path().join("m.sock").display());
    let server = TestServer::start(&listen, capacity, lease);
    (dir, server)
}

/// Maps a granted slab shared and read-write.
fn map(g: &SlabGrant) -> &'static mut [u8] {
    let len = g.pages as usize * PAGE_SIZE;
    // SAFETY: a fresh shared mapping of the whole memfd (sealed at exactly this length); it is
    // leaked for the rest of the test, so the slice stays valid.
    unsafe {
        let p = rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::SHARED,
            g.memfd.as_fd(),
            0,
        )
        .expect("mmap of a granted slab");
        std::slice::from_raw_parts_mut(p.cast::<u8>(), len)
    }
}

#[test]
fn a_grant_is_a_mappable_memfd_counted_against_capacity_until_goodbye() {
    let (_dir, server) = unix_server("slab-grant", 1000, Duration::from_secs(10));
    let mut c = server.connect();
    let g = c.grant(600).unwrap();
    assert_eq!((g.slab_id, g.pages), (0, 600));
    let mem = map(&g);
    mem[..PAGE_SIZE].fill(0xAB);
    mem[599 * PAGE_SIZE..].fill(0xCD);
    // Only the rest of the capacity is left: the next grant is partial, then none.
    let g2 = c.grant(600).unwrap();
    assert_eq!((g2.slab_id, g2.pages), (1, 400));
    let err = c.grant(1).unwrap_err();
    assert_eq!(err.server_code(), Some(ErrorCode::Full), "{err}");
    let s = server.local_stats();
    assert_eq!(s.used_bytes, 1000 * PAGE_SIZE as u64);
    assert_eq!(s.slab_bytes, 1000 * PAGE_SIZE as u64);
    assert_eq!((s.pages_held, s.stored_bytes), (0, 0));
    assert_eq!(s.totals.slabs_granted, 2);
    let me = s
        .sessions
        .iter()
        .find(|e| e.id == c.session().session_id)
        .unwrap();
    assert_eq!((me.shm_slabs, me.shm_pages), (2, 1000));
    assert_eq!(me.slab_bytes, 1000 * PAGE_SIZE as u64);
    // Two written pages occupy memory; the rest of the slabs does not.
    assert_eq!(me.shm_resident_bytes, 2 * PAGE_SIZE as u64, "{me:?}");
    assert!(s.host_bytes >= 2 * PAGE_SIZE as u64);
    c.goodbye().unwrap();
    let s = server.local_stats();
    assert_eq!((s.used_bytes, s.slab_bytes), (0, 0));
    // The client's own mapping keeps its memory readable after the memnode let go.
    assert!(mem[..PAGE_SIZE].iter().all(|&b| b == 0xAB));
}

#[test]
fn sessions_never_see_each_others_slabs() {
    let (_dir, server) = unix_server("slab-isolation", 10_000, Duration::from_secs(10));
    let mut a = server.connect();
    let ga = a.grant(256).unwrap();
    map(&ga).fill(0x5A);
    // Another session (same token) gets fresh slabs of its own: nothing of A's shows.
    let mut b = server.connect();
    for _ in 0..4 {
        let gb = b.grant(256).unwrap();
        assert!(
            map(&gb).iter().all(|&x| x == 0),
            "session B's slab {} holds data it never wrote",
            gb.slab_id
        );
    }
    // Attaching with A's id but a wrong key is refused, so B cannot ask for grants as A.
    let info = a.session();
    let mut wrong = info.session_key;
    wrong[0] ^= 1;
    assert!(server.attach(info.session_id, wrong).is_err());
    let s = server.local_stats();
    let sa = s.sessions.iter().find(|e| e.id == info.session_id).unwrap();
    let sb = s
        .sessions
        .iter()
        .find(|e| e.id == b.session().session_id)
        .unwrap();
    assert_eq!((sa.shm_slabs, sb.shm_slabs), (1, 4));
}

#[test]
fn tcp_clients_are_refused_slabs() {
    let server = TestServer::tcp(100);
    let mut c = server.connect();
    let err = c.grant(10).unwrap_err();
    assert!(err.to_string().contains("Unix socket"), "{err}");
    assert_eq!(server.local_stats().used_bytes, 0);
    // The connection still works.
    c.ping().unwrap();
}

#[test]
fn slabs_of_a_vanished_client_are_released_after_the_lease() {
    let (_dir, server) = unix_server("slab-lease", 1000, Duration::from_millis(300));
    let mut c = server.connect();
    let g = c.grant(100).unwrap();
    map(&g)[0] = 1;
    drop(c);
    assert_eq!(server.local_stats().used_bytes, 100 * PAGE_SIZE as u64);
    assert!(
        wait_until(Duration::from_secs(5), || server.local_stats().used_bytes
            == 0),
        "slab not released after the lease"
    );
    assert_eq!(server.local_stats().totals.sessions_released_by_lease, 1);
}

#[test]
fn a_zero_page_grant_is_a_clear_refusal() {
    let (_dir, server) = unix_server("slab-zero", 100, Duration::from_secs(10));
    let mut c = server.connect();
    let err = c.grant(0).unwrap_err();
    assert_eq!(err.server_code(), Some(ErrorCode::BadRequest), "{err}");
    assert!(err.to_string().contains("1 to"), "{err}");
    c.ping().unwrap();
}
