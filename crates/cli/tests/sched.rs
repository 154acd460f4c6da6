//! The memnode's link scheduler (issue 13) seen from a real pager: prefetches the memnode drops
//! because they waited past their deadline never lose data (the pages are fetched on demand).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{gleaner_bin, token_file, MemnodeProc, TempDir};
use gleaner_pager::{Region, RegionConfig, PAGE_SIZE};
use gleaner_proto::Connection;

/// A region four times its budget on a memnode whose 64 MiB/s link another session keeps busy
/// with 64 KiB reads (a millisecond each), with a 100 µs prefetch deadline: prefetches queued
/// behind the other session's reads are dropped by the memnode, and every page still reads
/// back right over two sequential passes (Leap prefetching ahead of them).
#[test]
fn prefetches_dropped_as_late_never_lose_data() {
    gleaner_bin();
    let (_dir, token) = token_file("sched");
    let node = MemnodeProc::start_with_args(
        "127.0.0.1:0",
        "1G",
        TempDir::new("sched-node"),
        token.clone(),
        &["--bandwidth", "64M"],
    );
    // The competitor: 16 pages of its own, read over and over.
    let opts = gleaner_proto::ConnectOptions {
        client_name: "competitor".into(),
        ..Default::default()
    };
    let tok = gleaner_proto::read_token_file(&token).unwrap();
    let mut c = Connection::connect(&node.endpoint, &tok, None, &opts).unwrap();
    let page = vec![7u8; PAGE_SIZE];
    c.write_pages((0..16u64).map(|i| (i, page.as_slice())))
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let competitor = std::thread::spawn(move || {
        let ids: Vec<u64> = (0..16).collect();
        while !flag.load(Ordering::Relaxed) {
            c.read_pages(&ids).unwrap();
        }
    });

    let pages = 2048;
    let mut cfg = RegionConfig::new(pages * PAGE_SIZE, pages * PAGE_SIZE / 4)
        .with_memnode(node.endpoint.clone(), Some(token.clone()));
    cfg.prefetch_deadline = Some(Duration::from_micros(100));
    let region = Region::new(cfg).unwrap();
    let base = region.as_ptr() as usize;
    let word = |p: usize, pass: u64| (p as u64) << 8 | pass;
    for p in 0..pages {
        // SAFETY: word 0 and the last word of page p are inside the live region.
        unsafe {
            ((base + p * PAGE_SIZE) as *mut u64).write_volatile(word(p, 1));
            ((base + (p + 1) * PAGE_SIZE - 8) as *mut u64).write_volatile(word(p, 1));
        }
    }
    for _ in 0..2 {
        for p in 0..pages {
            // SAFETY: as above.
            let (a, b) = unsafe {
                (
                    ((base + p * PAGE_SIZE) as *const u64).read_volatile(),
                    ((base + (p + 1) * PAGE_SIZE - 8) as *const u64).read_volatile(),
                )
            };
            assert_eq!((a, b), (word(p, 1), word(p, 1)), "page {p}");
        }
    }
    let s = region.stats();
    stop.store(true, Ordering::Relaxed);
    competitor.join().unwrap();
    eprintln!(
        "prefetch: {} pages issued, {} dropped as late at the memnode",
        s.prefetch.issued, s.prefetch.dropped_late
    );
    assert!(s.prefetch.issued > 0, "{:?}", s.prefetch);
    assert!(
        s.prefetch.dropped_late > 0,
        "no prefetch dropped: {:?}",
        s.prefetch
    );
    // The memnode counted them on the tenant (the main token's).
    let mut c = Connection::connect(&node.endpoint, &tok, None, &opts).unwrap();
    let stats: serde_json::Value = serde_json::from_str(&c.stats().unwrap()).unwrap();
    let q = &stats["tenants"][0]["queue"];
    assert!(q["prefetches_dropped"].as_u64().unwrap() > 0, "{q}");
    assert!(
        q["classes"]["demand"]["requests"].as_u64().unwrap() > 0,
        "{q}"
    );
}

/// Eviction over a slow link (a memnode whose link carries 32 MB/s): a fault on a page being
/// evicted waits for its whole batch's write-back, so the pager sizes batches to be written back
/// in about a millisecond, which there is the floor of 16 pages instead of the 128 its budget
/// allows; every page still reads back what was written.
#[test]
fn eviction_batches_shrink_over_a_slow_link_and_lose_nothing() {
    gleaner_bin();
    let (_dir, token) = token_file("slowlink");
    let node = MemnodeProc::start_with_args(
        "127.0.0.1:0",
        "1G",
        TempDir::new("slowlink-node"),
        token.clone(),
        &["--bandwidth", "32M"],
    );
    // 24 MiB through an 8 MiB budget, whose largest batch is 128 pages.
    let (pages, budget) = (6144, 2048);
    let cfg = RegionConfig::new(pages * PAGE_SIZE, budget * PAGE_SIZE)
        .with_memnode(node.endpoint.clone(), Some(token.clone()));
    assert_eq!(cfg.batch_pages(), 128);
    let region = Region::new(cfg).unwrap();
    let base = region.as_ptr() as usize;
    // Incompressible pages, so that every page written back takes its 4 KiB of the link.
    let word = |p: usize, i: usize| {
        let mut x = ((p * 512 + i) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        x ^= x << 13;
        x ^= x >> 7;
        x ^ (x << 17)
    };
    for p in 0..pages {
        for i in 0..PAGE_SIZE / 8 {
            // SAFETY: word i of page p is inside the live region.
            unsafe { ((base + p * PAGE_SIZE + i * 8) as *mut u64).write_volatile(word(p, i)) };
        }
    }
    for p in 0..pages {
        for i in 0..PAGE_SIZE / 8 {
            // SAFETY: as above.
            let got = unsafe { ((base + p * PAGE_SIZE + i * 8) as *const u64).read_volatile() };
            assert_eq!(got, word(p, i), "page {p}, word {i}");
        }
    }
    let e = region.stats().evictions;
    let evicted = e.clean + e.dirty;
    eprintln!(
        "{evicted} pages evicted in {} batches; next batch {} pages, {:.1} µs per page",
        e.batches, e.batch_pages_next, e.batch_us_per_page
    );
    assert!(evicted >= (pages - budget) as u64, "{e:?}");
    assert!(e.batch_us_per_page > 60.0, "a 32 MB/s link: {e:?}");
    assert_eq!(e.batch_pages_next, 16, "{e:?}");
    // Every batch is timed (what a fault on one of its pages may wait).
    assert_eq!(e.batch_time.count, e.batches, "{e:?}");
    assert!(e.batch_time.max_us >= e.batch_time.p50_us, "{e:?}");
    assert!(
        evicted < 40 * e.batches,
        "batches averaged {} pages: {e:?}",
        evicted / e.batches.max(1)
    );
}
