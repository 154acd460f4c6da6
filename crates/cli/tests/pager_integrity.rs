//! End-to-end data integrity of far-memory regions: real userfaultfd, a real memnode process over a
//! real socket (Unix and TCP loopback), several application threads, every page verified.

mod common;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use common::{gleaner_bin, MemnodeProc};
use gleaner_pager::{MemnodeTarget, Region, RegionConfig, PAGE_SIZE};

const WORDS: usize = PAGE_SIZE / 8;

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

use gleaner_sys::rng::XorShift64 as Rng;

/// The value of word `i` of `page` at `version` (version 0: never written, all zeros).
fn word(page: usize, version: u32, i: usize) -> u64 {
    if version == 0 {
        0
    } else {
        mix((page as u64) << 20 ^ version as u64).wrapping_add(i as u64)
    }
}

/// A raw pointer to a region's memory that threads may share.
#[derive(Clone, Copy)]
struct Base(usize);

impl Base {
    fn page(&self, p: usize) -> *mut u64 {
        (self.0 + p * PAGE_SIZE) as *mut u64
    }

    fn write(&self, p: usize, version: u32) {
        for i in 0..WORDS {
            // SAFETY: page p is inside the live region; only its owning thread writes it.
            unsafe { self.page(p).add(i).write_volatile(word(p, version, i)) };
        }
    }

    /// The index of the first wrong word, if any.
    fn check(&self, p: usize, version: u32) -> Option<(usize, u64, u64)> {
        (0..WORDS).find_map(|i| {
            // SAFETY: page p is inside the live region.
            let got = unsafe { self.page(p).add(i).read_volatile() };
            let want = word(p, version, i);
            (got != want).then_some((i, got, want))
        })
    }
}

/// Random reads and writes from `threads` threads (each owning the pages p with p % threads ==
/// its index), every read checked at once, then every page of the region checked at the end.
fn random_ops_then_verify_all(region: &Region, threads: usize, ops_per_thread: usize) {
    let pages = region.len() / PAGE_SIZE;
    let base = Base(region.as_ptr() as usize);
    let shadow: Arc<Vec<AtomicU32>> = Arc::new((0..pages).map(|_| AtomicU32::new(0)).collect());
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let shadow = shadow.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::from_state(mix(t as u64 + 1) | 1);
                let owned = pages.div_ceil(threads);
                for _ in 0..ops_per_thread {
                    let p = ((rng.next_u64() as usize % owned) * threads + t).min(pages - 1);
                    if p % threads != t {
                        continue;
                    }
                    let v = shadow[p].load(Ordering::Relaxed);
                    if rng.next_u64() % 10 < 6 {
                        base.write(p, v + 1);
                        shadow[p].store(v + 1, Ordering::Relaxed);
                    } else if let Some((i, got, want)) = base.check(p, v) {
                        panic!("thread {t}: page {p} v{v} word {i}: got {got:#x}, want {want:#x}");
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker thread found wrong data");
    }
    let mut bad = 0;
    for p in 0..pages {
        if let Some((i, got, want)) = base.check(p, shadow[p].load(Ordering::Relaxed)) {
            if bad < 5 {
                eprintln!("page {p} word {i}: got {got:#x}, want {want:#x}");
            }
            bad += 1;
        }
    }
    assert_eq!(bad, 0, "{bad} pages hold wrong data");
    let s = region.stats();
    eprintln!("{}", region.stats_json());
    assert!(s.faults.remote > 0, "the test must exercise remote faults");
    assert!(
        s.evictions.dirty > 0,
        "the test must exercise dirty write-back"
    );
    if s.store.copies_dropped > 0 {
        // Far copies are dropped when pages come back (asynchronous tracking on shared memory):
        // every eviction is then a write-back, checked above.
    } else {
        assert!(s.evictions.clean > 0, "the test must exercise clean drops");
    }
    // Under asynchronous tracking, written pages are found at eviction (dirty write-backs,
    // checked above) and writes take no fault. Under synchronous tracking, pages written before
    // are installed writable by write prediction (the default): then the test must exercise
    // that; with prediction off, every first write to a fetched page takes a write-protect
    // fault.
    if s.dirty_tracking == "async" {
        assert_eq!(
            s.faults.write_protect, 0,
            "asynchronous tracking takes no write faults"
        );
        // The access scan ran (its first scan comes before the first batch) and re-protected
        // written pages under the evictions checked above.
        assert!(
            s.access.scans > 0 && s.access.pages_referenced > 0,
            "the access scan must run under asynchronous tracking: {:?}",
            s.access
        );
    } else if s.write_prediction.enabled && s.faults.write_protect == 0 {
        assert!(
            s.write_prediction.predicted > 0,
            "the test must exercise dirty tracking or write prediction"
        );
    } else {
        assert!(
            s.faults.write_protect > 0,
            "the test must exercise dirty tracking"
        );
    }
    assert!(
        s.resident_pages <= s.budget_pages,
        "resident {} exceeds budget {}",
        s.resident_pages,
        s.budget_pages
    );
}

const GIB: usize = 1 << 30;

#[test]
fn one_gib_at_ten_percent_over_embedded_unix_socket_memnode() {
    gleaner_bin();
    let region = Region::new(RegionConfig::new(GIB, GIB / 10)).unwrap();
    let s = region.stats();
    assert!(s.memnode.starts_with("unix:"));
    assert_eq!((s.store.data_path, s.dirty_tracking), ("shm", "async"));
    random_ops_then_verify_all(&region, 2, 60_000);
    let store = region.stats().store;
    assert!(store.pages_stored > 0);
    // The default codec: compressed and sealed, nothing failed authentication; shared memory
    // has no link whose time bytes make, so `auto` stays with LZ4.
    assert_eq!(
        (
            store.codec.compression.as_str(),
            store.codec.encryption.as_str()
        ),
        ("auto", "aes-256-gcm")
    );
    assert_eq!(store.codec.zstd_for_link, 0);
    assert_eq!(region.stats().evictions.zstd_us_per_page, 0.0);
    assert!(store.codec.pages_decoded > 0 && store.codec.auth_failures == 0);
    assert!(store.resident_bytes >= store.blob_bytes && store.blob_bytes > 0);
}

/// The test's pages (a counter per word) are LZ4's slow case: with no decode budget every page
/// goes through LZ4, and with a budget no decode meets every page is stored raw. Both read back
/// exactly (the default budget lands between the two, depending on the machine).
#[test]
fn integrity_with_every_page_compressed_and_with_every_page_raw_for_decode_speed() {
    gleaner_bin();
    for (budget, raw) in [
        (gleaner_pager::DecodeBudget::Off, false),
        (gleaner_pager::DecodeBudget::Micros(0.001), true),
    ] {
        let mut cfg = RegionConfig::new(GIB / 8, GIB / 80);
        cfg.max_decode = budget;
        let region = Region::new(cfg).unwrap();
        random_ops_then_verify_all(&region, 2, 20_000);
        let c = region.stats().store.codec;
        assert!(c.pages_decoded > 0, "{c:?}");
        if raw {
            assert!(c.raw_for_speed > 0 && c.slow_chunks > 0, "{c:?}");
            assert!(
                c.decode_trials > 0 && c.pages_compressed < c.pages_encoded / 4,
                "{c:?}"
            );
        } else {
            assert_eq!(
                (c.raw_for_speed, c.decode_trials, c.max_decode_ns),
                (0, 0, 0)
            );
            assert!(c.compression_ratio > 1.5, "{c:?}");
        }
    }
}

/// Keeping far copies of resident pages: clean pages are then dropped without a write-back.
#[test]
fn integrity_keeping_far_copies_drops_clean_pages_without_writing_them() {
    gleaner_bin();
    let mut cfg = RegionConfig::new(GIB / 4, GIB / 40);
    cfg.drop_far_copies = gleaner_pager::FarCopies::None;
    let region = Region::new(cfg).unwrap();
    random_ops_then_verify_all(&region, 2, 30_000);
    let s = region.stats();
    assert_eq!((s.store.data_path, s.dirty_tracking), ("shm", "async"));
    assert_eq!(s.store.copies_dropped, 0);
    assert!(
        s.evictions.clean > 0,
        "clean pages were dropped without a write-back"
    );
}

/// Dropping only demand-fetched pages' far copies: prefetched pages keep theirs, and evicting
/// them unwritten writes nothing.
#[test]
fn integrity_dropping_only_demand_fetched_far_copies() {
    gleaner_bin();
    let mut cfg = RegionConfig::new(GIB / 4, GIB / 40);
    cfg.drop_far_copies = gleaner_pager::FarCopies::Demand;
    let region = Region::new(cfg).unwrap();
    random_ops_then_verify_all(&region, 2, 30_000);
    let s = region.stats();
    assert!(s.store.copies_dropped > 0);
    assert!(s.prefetch.issued > 0, "the test must prefetch");
}

/// By default (asynchronous tracking, shared memory) every fetched page gives up its far copy:
/// far memory holds only pages that are not resident.
#[test]
fn fetched_pages_give_up_their_far_copies_by_default() {
    gleaner_bin();
    let region = Region::new(RegionConfig::new(GIB / 4, GIB / 40)).unwrap();
    random_ops_then_verify_all(&region, 2, 30_000);
    let s = region.stats();
    assert!(s.store.copies_dropped > 0);
    // Far memory holds only the pages that are not resident (give or take the batches reclaim
    // may have in flight while the stats are read: a page is written before it is let go).
    let in_flight = 2 * gleaner_pager::DEFAULT_EVICT_BATCH as u64;
    assert!(
        s.store.pages_stored + s.resident_pages <= s.size_bytes / 4096 + in_flight,
        "{} far copies with {} of {} pages resident",
        s.store.pages_stored,
        s.resident_pages,
        s.size_bytes / 4096
    );
}

/// The same workload over the socket to a memnode on this host (no shared memory).
#[test]
fn integrity_over_the_socket_data_path_to_a_local_memnode() {
    gleaner_bin();
    let mut cfg = RegionConfig::new(GIB / 4, GIB / 40);
    cfg.data_path = "socket".parse().unwrap();
    let region = Region::new(cfg).unwrap();
    let s = region.stats();
    assert!(s.memnode.starts_with("unix:"));
    // Asynchronous tracking by default over a socket too (every victim is written back).
    assert_eq!((s.store.data_path, s.dirty_tracking), ("socket", "async"));
    random_ops_then_verify_all(&region, 2, 30_000);
    let s = region.stats();
    assert_eq!(s.faults.write_protect, 0, "{:?}", s.faults);
}

/// The same workload under synchronous dirty tracking (the fallback for kernels without
/// WP_ASYNC, and a choice: `--dirty-tracking sync`), on both data paths, with the default order
/// and with `active` and `frequency` (no access scan there: write-protect faults are their
/// references).
#[test]
fn integrity_under_synchronous_dirty_tracking_on_both_data_paths() {
    gleaner_bin();
    let default = gleaner_pager::DEFAULT_EVICT.to_string();
    for evict in [default.as_str(), "active", "frequency"] {
        for path in ["shm", "socket"] {
            let mut cfg = RegionConfig::new(GIB / 8, GIB / 80);
            cfg.dirty_tracking = "sync".parse().unwrap();
            cfg.data_path = path.parse().unwrap();
            cfg.evict = evict.parse().unwrap();
            let region = Region::new(cfg).unwrap();
            let s = region.stats();
            assert_eq!((s.store.data_path, s.dirty_tracking), (path, "sync"));
            random_ops_then_verify_all(&region, 2, 20_000);
            let s = region.stats();
            assert_eq!(s.policy, evict);
            assert!(
                s.faults.write_protect > 0 && s.faults.remote > 0,
                "{evict}, {path}"
            );
        }
    }
}

#[test]
fn one_gib_at_ten_percent_over_tcp_loopback_memnode_process() {
    let node = MemnodeProc::start("127.0.0.1:0", "2G");
    let cfg = RegionConfig::new(GIB, GIB / 10)
        .with_memnode(node.endpoint.clone(), Some(node.token_file.clone()));
    let region = Region::new(cfg).unwrap();
    assert!(region.stats().memnode.starts_with("127.0.0.1:"));
    random_ops_then_verify_all(&region, 2, 60_000);
}

/// The data-integrity workload under every reclaim mode (a smaller region than the 1 GiB runs
/// above, same 10% budget), with each mode's own machinery checked to have done the work.
fn integrity_under_reclaim_mode(mode: &str) {
    gleaner_bin();
    let mut cfg = RegionConfig::new(GIB / 8, GIB / 80);
    cfg.reclaim = mode.parse().unwrap();
    let region = Region::new(cfg).unwrap();
    random_ops_then_verify_all(&region, 2, 20_000);
    let r = region.stats().reclaim;
    assert_eq!(r.scheduler.mode, mode);
    match mode {
        "direct" => {
            assert_eq!(r.pool_size, 0);
            assert_eq!(r.pool_batches, 0);
            assert!(
                r.direct_pages > 0,
                "direct mode must reclaim in faulting threads"
            );
        }
        _ => {
            assert!(r.pool_size >= 1);
            assert!(
                r.pool_pages > 0,
                "{mode}: the reclaim pool must do the work"
            );
            assert!(
                r.pool_cpu_ns > 0,
                "{mode}: reclaim CPU time must be measured"
            );
        }
    }
}

#[test]
fn integrity_with_hermit_reclaim() {
    integrity_under_reclaim_mode("hermit");
}

#[test]
fn integrity_with_static_reclaim_one_thread() {
    integrity_under_reclaim_mode("static:1");
}

#[test]
fn integrity_with_static_reclaim_four_threads() {
    integrity_under_reclaim_mode("static:4");
}

#[test]
fn integrity_with_direct_reclaim() {
    integrity_under_reclaim_mode("direct");
}

/// Atomic increments from several threads on a few hot pages while the budget is at its minimum,
/// so pages are written while they are being evicted: not one increment may be lost.
#[test]
fn writes_racing_with_eviction_are_never_lost() {
    writes_racing_with_eviction("hermit", "auto", "auto");
}

/// The race test with several reclaim threads evicting at once.
#[test]
fn writes_racing_with_eviction_by_four_reclaim_threads_are_never_lost() {
    writes_racing_with_eviction("static:4", "auto", "auto");
}

/// The race test with the faulting threads themselves evicting.
#[test]
fn writes_racing_with_direct_eviction_are_never_lost() {
    writes_racing_with_eviction("direct", "auto", "auto");
}

/// The race test over the socket data path under the default, asynchronous tracking (every
/// victim is captured and written back after the drop).
#[test]
fn writes_racing_with_eviction_over_the_socket_are_never_lost() {
    writes_racing_with_eviction("hermit", "auto", "socket");
}

/// The race test under synchronous tracking, on both data paths.
#[test]
fn writes_racing_with_synchronously_tracked_eviction_are_never_lost() {
    writes_racing_with_eviction("hermit", "sync", "shm");
    writes_racing_with_eviction("hermit", "sync", "socket");
}

/// After a fork the parent's resident pages are shared with the child until one of them writes:
/// a write to such a page goes to a new copy. Eviction must still capture the parent's last
/// write: the race test, run while a fork child (which only sleeps) still shares every page,
/// under both ways of tracking writes, and both fork modes (pages brought home, or kept far with
/// their blobs held for the child while the parent rewrites them).
#[test]
fn writes_racing_with_eviction_after_a_fork_are_never_lost() {
    use gleaner_pager::ForkMode;
    for (tracking, fork) in [
        ("async", ForkMode::Far),
        ("sync", ForkMode::Far),
        ("async", ForkMode::Home),
        ("sync", ForkMode::Home),
    ] {
        gleaner_bin();
        let pages = 2048;
        let mut cfg = RegionConfig::new(pages * PAGE_SIZE, 0);
        cfg.local_budget = cfg.min_budget_pages() * PAGE_SIZE;
        cfg.fork_visible = true;
        cfg.fork = fork;
        cfg.dirty_tracking = tracking.parse().unwrap();
        let region = Region::new(cfg).unwrap();
        let base = region.as_ptr() as usize;
        for p in 0..pages {
            // SAFETY: word 0 of page p is inside the live region.
            unsafe { ((base + p * PAGE_SIZE) as *mut u64).write_volatile(p as u64 * 1000) };
        }
        region.prepare_fork();
        // SAFETY: the child only sleeps (an async-signal-safe call) until killed, touching nothing.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // Asleep until the parent is done checking (it kills the child then): a child that
            // woke up by itself could exit before the check, and its snapshot go with it.
            let ts = libc::timespec {
                tv_sec: 600,
                tv_nsec: 0,
            };
            // SAFETY: nanosleep and _exit are async-signal-safe.
            unsafe {
                libc::nanosleep(&ts, std::ptr::null_mut());
                libc::_exit(0);
            }
        }
        assert!(child > 0, "fork failed");
        region.after_fork();
        let shadow: Arc<Vec<AtomicU64>> = Arc::new(
            (0..pages)
                .map(|p| AtomicU64::new(p as u64 * 1000))
                .collect(),
        );
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let shadow = shadow.clone();
                std::thread::spawn(move || {
                    let mut rng = Rng::from_state(mix(t as u64 + 7) | 1);
                    for _ in 0..30_000 {
                        let p = rng.next_u64() as usize % pages;
                        // SAFETY: as above; AtomicU64 has the layout of u64.
                        let counter = unsafe { &*((base + p * PAGE_SIZE) as *const AtomicU64) };
                        counter.fetch_add(1, Ordering::SeqCst);
                        shadow[p].fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let wrong: Vec<(usize, u64, u64)> = (0..pages)
            .filter_map(|p| {
                // SAFETY: as above.
                let got = unsafe { ((base + p * PAGE_SIZE) as *const u64).read_volatile() };
                let want = shadow[p].load(Ordering::Relaxed);
                (got != want).then_some((p, got, want))
            })
            .collect();
        // The child (still asleep) may read the fork moment's blobs: the parent's rewrites
        // left them in place.
        let held = region.stats().store.blobs_held_for_children;
        let mut status = 0;
        // SAFETY: kills and waits for our own child, which only sleeps (before any assertion,
        // so that a failure leaves no sleeping child behind).
        unsafe { libc::kill(child, libc::SIGKILL) };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(
            wrong.is_empty(),
            "{tracking}, fork {fork}: (page, got, want) {:?}",
            &wrong[..wrong.len().min(8)]
        );
        if fork == ForkMode::Far {
            assert!(held > 0, "{tracking}: no blob held for the child");
        }
        let s = region.stats();
        assert!(s.evictions.dirty > 1000, "{tracking}: {:?}", s.evictions);
    }
}

fn writes_racing_with_eviction(mode: &str, tracking: &str, path: &str) {
    gleaner_bin();
    let mut cfg = RegionConfig::new(2048 * PAGE_SIZE, 0);
    cfg.local_budget = cfg.min_budget_pages() * PAGE_SIZE;
    cfg.reclaim = mode.parse().unwrap();
    cfg.dirty_tracking = tracking.parse().unwrap();
    cfg.data_path = path.parse().unwrap();
    // The access scan as often as it goes, re-protecting pages while batches evict them.
    cfg.access_scan = "1ms".parse().unwrap();
    let region = Region::new(cfg).unwrap();
    let pages = region.len() / PAGE_SIZE;
    let base = region.as_ptr() as usize;
    let shadow: Arc<Vec<AtomicU64>> = Arc::new((0..pages).map(|_| AtomicU64::new(0)).collect());
    let threads = 4;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let shadow = shadow.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::from_state(mix(t as u64 + 99) | 1);
                for _ in 0..40_000 {
                    let p = rng.next_u64() as usize % pages;
                    // SAFETY: word 0 of page p is inside the live region and 8-byte aligned;
                    // AtomicU64 has the layout of u64.
                    let counter = unsafe { &*((base + p * PAGE_SIZE) as *const AtomicU64) };
                    counter.fetch_add(1, Ordering::SeqCst);
                    shadow[p].fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    for p in 0..pages {
        // SAFETY: as above.
        let got = unsafe { ((base + p * PAGE_SIZE) as *const u64).read_volatile() };
        assert_eq!(
            got,
            shadow[p].load(Ordering::Relaxed),
            "page {p} lost increments"
        );
    }
    let s = region.stats();
    eprintln!("{}", region.stats_json());
    assert!(
        s.evictions.dirty > 1000,
        "too little eviction to test the race"
    );
    assert!(s.faults.remote > 1000);
    if tracking == "async" {
        assert!(s.access.scans > 10, "{:?}", s.access);
    }
}

/// Drops page `p` with a raw `madvise(MADV_DONTNEED)` system call, which the preload does not
/// see.
fn drop_behind_the_pagers_back(base: Base, p: usize) {
    // SAFETY: the raw system call on one page of the live region.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_madvise,
            base.page(p),
            PAGE_SIZE,
            libc::MADV_DONTNEED,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
}

/// A test that could hang (a region whose threads are stuck cannot even be dropped) fails
/// instead: unless the returned sender is sent to within `secs` seconds, the whole test binary
/// exits with an error naming `what`.
fn fail_if_not_done_within(secs: u64, what: &'static str) -> std::sync::mpsc::Sender<()> {
    let (done, finished) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if finished.recv_timeout(std::time::Duration::from_secs(secs))
            == Err(std::sync::mpsc::RecvTimeoutError::Timeout)
        {
            // Written past the test harness's capture of `eprintln!`, which the exit discards.
            let msg = format!("{what}: hung for {secs} s; stopping the test binary\n");
            let _ = std::io::Write::write_all(&mut std::io::stderr(), msg.as_bytes());
            std::process::exit(101);
        }
    });
    done
}

/// Page `p`, which the program wrote at `version` and then dropped behind the pager's back,
/// reads as zeros (true), or (false, reported) as that last write: the known limitation when a
/// batch had taken the page into its pipe just before the drop, and writes back what it took
/// (`docs/compatibility.md`). Anything else fails the test.
fn reads_zeros_after_drop(base: Base, p: usize, version: u32, what: &str) -> bool {
    if base.check(p, 0).is_none() {
        return true;
    }
    if let Some((i, got, want)) = base.check(p, version) {
        panic!("{what}: page {p} word {i}: got {got:#x}, want zeros (or {want:#x})");
    }
    eprintln!(
        "{what}: page {p} reads its last write from before the drop, not zeros: an eviction \
         had taken it just before (a known limitation)"
    );
    false
}

/// A page the program drops behind the pager's back (a raw `madvise` system call, which the
/// preload does not see) reads as zeros, as after its own drop, whether it is evicted first or
/// touched first (or, rarely, its write from before the drop: see `reads_zeros_after_drop`),
/// and its eviction does not hang: a reclaim thread, which scans only victims
/// with a far copy, faults on it when taking it into its pipe and a fault handler zero-fills
/// it; a fault handler reclaiming directly scans every victim and zero-fills it itself; a
/// touch finds it missing though resident by the pager's count, and is zero-filled (before,
/// it faulted forever).
#[test]
fn a_page_dropped_behind_the_pagers_back_is_evicted_as_zeros() {
    // A batch waiting for itself would hang the test: fail it instead.
    let done = fail_if_not_done_within(60, "a_page_dropped_behind_the_pagers_back");
    for mode in ["hermit", "direct"] {
        gleaner_bin();
        let pages = 2048;
        let mut cfg = RegionConfig::new(pages * PAGE_SIZE, 0);
        cfg.local_budget = cfg.min_budget_pages() * PAGE_SIZE;
        cfg.reclaim = mode.parse().unwrap();
        let region = Region::new(cfg).unwrap();
        let base = Base(region.as_ptr() as usize);
        for p in 0..pages {
            base.write(p, 1);
        }
        // Page 5 is resident again (fetched for this write), then dropped behind the pager.
        let dropped = 5;
        base.write(dropped, 2);
        // Not touched again until it has been evicted.
        drop_behind_the_pagers_back(base, dropped);
        // Every other page, twice over: far more than the budget, so page 5 is evicted.
        for _ in 0..2 {
            for p in (0..pages).filter(|&p| p != dropped) {
                if let Some((i, got, want)) = base.check(p, 1) {
                    panic!("{mode}: page {p} word {i}: got {got:#x}, want {want:#x}");
                }
            }
        }
        let s = region.stats();
        // Evicted by now (long since out of the budget): fetched back.
        let zeros = u64::from(reads_zeros_after_drop(base, dropped, 2, mode));
        assert_eq!(
            s.evictions.dropped_behind_back,
            zeros,
            "{mode}: page {dropped} was not found dropped when evicted: {}",
            region.stats_json()
        );
        // A page dropped behind the pager's back and touched before any eviction: zeros too.
        let touched = 7;
        base.write(touched, 3);
        drop_behind_the_pagers_back(base, touched);
        // Still resident by the pager's count (unless a batch took it just before the drop).
        let zeros = zeros + u64::from(reads_zeros_after_drop(base, touched, 3, mode));
        base.write(touched, 4);
        assert!(
            base.check(touched, 4).is_none(),
            "{mode}: rewritten after the drop"
        );
        // The handler counts it after its install woke this thread: give it a moment.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while region.stats().evictions.dropped_behind_back < zeros
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(
            region.stats().evictions.dropped_behind_back,
            zeros,
            "{mode}: {}",
            region.stats_json()
        );
        if mode == "hermit" {
            assert!(
                s.evictions.scanned_runs < s.evictions.runs / 2,
                "reclaim threads scanned runs without far copies: {}",
                region.stats_json()
            );
        } else {
            assert_eq!(s.evictions.scanned_runs, s.evictions.runs);
        }
    }
    done.send(()).unwrap();
}

/// Many pages dropped behind the pager's back by several threads while a reclaim thread evicts
/// under a minimal budget: every eviction of such a page needs a fault handler (its pipe faults
/// on it) while the handlers themselves may be waiting for that very batch to free budget, or
/// be stuck in a pipe of their own (reclaiming directly, a page dropped between their scan and
/// their pipe). No eviction may hang (the watchdog frees a batch no handler is free to serve:
/// before it, 1 run in 5 of this test hung), and every page reads its last write, or zeros if
/// it was dropped (or that write, when the pipe took the page just before the drop). With one
/// fault handler, and with one per CPU.
#[test]
fn many_pages_dropped_behind_the_pagers_back_while_threads_fault_never_hang() {
    let done = fail_if_not_done_within(120, "many_pages_dropped_behind_the_pagers_back");
    gleaner_bin();
    for handlers in [1, 0] {
        let pages = 4096;
        let threads = 4;
        let mut cfg = RegionConfig::new(pages * PAGE_SIZE, 0);
        cfg.handler_threads = handlers;
        cfg.local_budget = cfg.min_budget_pages() * PAGE_SIZE;
        cfg.reclaim = "hermit".parse().unwrap();
        let region = Region::new(cfg).unwrap();
        let base = Base(region.as_ptr() as usize);
        let dropped_in =
            move |p: usize, round: u32| (p / threads + round as usize).is_multiple_of(3);
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                std::thread::spawn(move || {
                    let owned: Vec<usize> = (t..pages).step_by(threads).collect();
                    for round in 1..=6u32 {
                        for &p in &owned {
                            base.write(p, round);
                            if dropped_in(p, round) {
                                drop_behind_the_pagers_back(base, p);
                            }
                        }
                        for &p in &owned {
                            let dropped = dropped_in(p, round);
                            let ok = base.check(p, round).is_none()
                                || (dropped && base.check(p, 0).is_none());
                            assert!(
                                ok,
                                "{handlers} handlers, thread {t}, round {round}: page {p}"
                            );
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("a thread saw wrong data");
        }
        let s = region.stats();
        eprintln!("{}", region.stats_json());
        assert!(
            s.evictions.dropped_behind_back > 0,
            "{}",
            region.stats_json()
        );
    }
    done.send(()).unwrap();
}

/// Several threads fault on the same remote pages at the same time; each must see the data.
#[test]
fn concurrent_faults_on_the_same_pages_all_see_the_data() {
    gleaner_bin();
    let pages = 8192;
    let region = Region::new(RegionConfig::new(pages * PAGE_SIZE, 1 << 20)).unwrap();
    let base = Base(region.as_ptr() as usize);
    for p in 0..pages {
        base.write(p, 1);
    }
    let handles: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                for p in 0..pages {
                    if let Some((i, got, want)) = base.check(p, 1) {
                        panic!("page {p} word {i}: got {got:#x}, want {want:#x}");
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a reader saw wrong data");
    }
    let s = region.stats();
    eprintln!("{}", region.stats_json());
    assert!(s.faults.remote > 0);
}

/// The kernel itself reads and writes far memory (`write(2)` from it, `read(2)` into it) while
/// the pages are on the memnode: served, not failed with EFAULT.
#[test]
fn kernel_mode_accesses_to_remote_pages_are_served() {
    gleaner_bin();
    let pages = 4096;
    let region = Region::new(RegionConfig::new(pages * PAGE_SIZE, 1 << 20)).unwrap();
    assert!(region.serves_kernel_faults());
    let base = Base(region.as_ptr() as usize);
    for p in 0..pages {
        base.write(p, 7);
    }
    // Page 0 is long evicted by now. Have the kernel read it into a pipe...
    let mut fds = [0i32; 2];
    // SAFETY: pipe(2) fills the two-element array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    assert!(region.stats().remote_pages > 0);
    // SAFETY: page 0 of the live region, PAGE_SIZE bytes.
    let n = unsafe { libc::write(fds[1], base.page(0) as *const _, PAGE_SIZE) };
    assert_eq!(n, PAGE_SIZE as isize, "{}", std::io::Error::last_os_error());
    // ...and write it back into page 1 (also remote), replacing page 1's contents.
    // SAFETY: page 1 of the live region, PAGE_SIZE bytes.
    let n = unsafe { libc::read(fds[0], base.page(1) as *mut _, PAGE_SIZE) };
    assert_eq!(n, PAGE_SIZE as isize, "{}", std::io::Error::last_os_error());
    for i in 0..WORDS {
        // SAFETY: page 1 of the live region.
        let got = unsafe { base.page(1).add(i).read_volatile() };
        assert_eq!(got, word(0, 7, i));
    }
    assert!(base.check(2, 7).is_none());
    // SAFETY: closing the pipe we opened.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
}

/// With no address given, the region starts its own memnode and stops it when dropped.
#[test]
fn embedded_memnode_is_started_and_stopped_with_the_region() {
    gleaner_bin();
    let cfg = RegionConfig::new(1024 * PAGE_SIZE, 1 << 20);
    assert_eq!(cfg.memnode, MemnodeTarget::Embedded);
    let region = Region::new(cfg).unwrap();
    let sock = region
        .stats()
        .memnode
        .strip_prefix("unix:")
        .map(std::path::PathBuf::from)
        .unwrap();
    assert!(sock.exists());
    drop(region);
    assert!(
        !sock.exists(),
        "the embedded memnode's socket should be gone"
    );
}

/// Two ranges filled in order but interleaved, page by page (a program filling two buffers at
/// once, or two threads each filling its own): no fault continues the one before it, yet each
/// finds the pages before it touched already and gets the next ones zero-filled with it, so the
/// fills take far fewer faults than pages. Every page reads back what was written.
#[test]
fn interleaved_fills_in_order_are_zero_filled_ahead() {
    gleaner_bin();
    let pages = 2048;
    let half = pages / 2;
    // Room for everything: no eviction, so every first touch is a zero-fill.
    let region = Region::new(RegionConfig::new(pages * PAGE_SIZE, 16 << 20)).unwrap();
    let base = Base(region.as_ptr() as usize);
    for p in 0..half {
        base.write(p, 1);
        base.write(half + p, 2);
    }
    assert_filled_with_few_faults(&region, pages as u64, "in order, interleaved");
    for p in 0..half {
        assert!(base.check(p, 1).is_none(), "page {p}");
        assert!(base.check(half + p, 2).is_none(), "page {}", half + p);
    }
}

/// A range filled from its end down, page by page (glibc's `memmove` of a large block copied
/// so here): each fault finds the pages after it touched already and gets the ones before it
/// zero-filled with it, so the fill takes far fewer faults than pages. Every page reads back
/// what was written.
#[test]
fn fills_from_the_end_down_are_zero_filled_too() {
    gleaner_bin();
    let pages = 2048;
    let region = Region::new(RegionConfig::new(pages * PAGE_SIZE, 16 << 20)).unwrap();
    let base = Base(region.as_ptr() as usize);
    for p in (0..pages).rev() {
        base.write(p, 3);
    }
    assert_filled_with_few_faults(&region, pages as u64, "downward");
    for p in 0..pages {
        assert!(base.check(p, 3).is_none(), "page {p}");
    }
}

/// Asserts that `pages` first touches, filled `how`, took fewer than one zero-fill fault per
/// 8 pages, the rest zero-filled with them: once every fill is counted (the handler counts one
/// just after it wakes the faulting thread), at most 5 s later.
fn assert_filled_with_few_faults(region: &Region, pages: u64, how: &str) {
    let t0 = std::time::Instant::now();
    let mut f = region.stats().faults;
    while f.zero_fill + f.zero_filled_ahead < pages && t0.elapsed().as_secs() < 5 {
        std::thread::sleep(std::time::Duration::from_millis(10));
        f = region.stats().faults;
    }
    assert_eq!(f.zero_fill + f.zero_filled_ahead, pages, "{f:?}");
    assert!(
        f.zero_fill < pages / 8,
        "{} zero-fill faults for {pages} pages filled {how}: {f:?}",
        f.zero_fill
    );
}

/// Asked for, the region writes its statistics as JSON when it is dropped.
#[test]
fn stats_are_written_at_drop_when_asked() {
    gleaner_bin();
    let dir = common::TempDir::new("stats");
    let path = dir.path().join("stats.json");
    let pages = 2048;
    let mut cfg = RegionConfig::new(pages * PAGE_SIZE, 1 << 20);
    cfg.stats_path = Some(path.clone());
    // Pages come back by faults only, so bytes in = remote faults x page size.
    cfg.prefetch = "none".parse().unwrap();
    let region = Region::new(cfg).unwrap();
    let base = Base(region.as_ptr() as usize);
    for p in 0..pages {
        base.write(p, 1);
    }
    for p in 0..pages {
        assert!(base.check(p, 1).is_none());
    }
    drop(region);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .expect("the stats file is JSON");
    // Every page was filled once: by its own fault, or ahead of a sequential fill.
    assert_eq!(
        v["faults"]["zero_fill"].as_u64().unwrap()
            + v["faults"]["zero_filled_ahead"].as_u64().unwrap(),
        pages as u64
    );
    assert!(v["faults"]["remote"].as_u64().unwrap() > 0);
    assert!(v["evictions"]["dirty"].as_u64().unwrap() > 0);
    assert!(v["remote_fault_latency"]["p99_us"].as_f64().unwrap() > 0.0);
    assert_eq!(
        v["bytes_in"],
        v["faults"]["remote"].as_u64().unwrap() * PAGE_SIZE as u64
    );
    let r = &v["reclaim"];
    assert_eq!(r["scheduler"]["mode"], "hermit");
    assert!(r["scheduler"]["charges"].as_u64().unwrap() >= 2 * pages as u64);
    assert!(r["pool_pages"].as_u64().unwrap() + r["direct_pages"].as_u64().unwrap() > 0);
    for key in [
        "low_watermark_pages",
        "high_watermark_pages",
        "swap_intensity",
        "probe_pages",
    ] {
        assert!(
            r["scheduler"][key].is_u64(),
            "reclaim.scheduler.{key} missing"
        );
    }
}

/// A prefetch hint brings far pages back with no fault at all: when its charges cross the high
/// watermark they wake the reclaim threads themselves (a fault handler wakes them only once its
/// fault is served, and no fault comes here), so room is made again for the faults to come.
#[test]
fn a_prefetch_hint_with_no_faults_wakes_reclaim() {
    gleaner_bin();
    let (pages, budget) = (8192, 256);
    let mut cfg = RegionConfig::new(pages * PAGE_SIZE, budget * PAGE_SIZE);
    cfg.prefetch = "none".parse().unwrap();
    let region = Region::new(cfg).unwrap();
    let base = Base(region.as_ptr() as usize);
    for p in 0..pages {
        base.write(p, 1);
    }
    // Until the reclaim threads are all asleep again: a thread still awake would take the
    // hint's request without being woken.
    for _ in 0..200 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        if region.stats().reclaim.threads_awake == 0 {
            break;
        }
    }
    let before = region.stats();
    assert_eq!(before.reclaim.threads_awake, 0, "reclaim never went idle");
    let hinted = 4096;
    region.prefetch_hint(0, hinted * PAGE_SIZE);
    // Until the hint thread is done: its count stops moving.
    let mut fetched = 0;
    for _ in 0..100 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let now = region.stats().hints.pages_fetched;
        if now > 0 && now == fetched {
            break;
        }
        fetched = now;
    }
    let after = region.stats();
    assert_eq!(after.hints.pages_hinted, hinted as u64);
    assert!(
        after.reclaim.pool_wakeups > before.reclaim.pool_wakeups,
        "the hint's charges woke the reclaim threads: {} then {}",
        before.reclaim.pool_wakeups,
        after.reclaim.pool_wakeups
    );
    assert!(
        after.hints.pages_fetched > 0,
        "the hint fetched pages: {:?}",
        after.hints
    );
    for p in 0..pages {
        assert!(base.check(p, 1).is_none(), "page {p}");
    }
}

/// Asked for, the region appends a line of reclaim and fault counters to a trace every 100 ms
/// and a last one when it stops.
#[test]
fn stats_trace_follows_the_run_over_time() {
    gleaner_bin();
    let dir = common::TempDir::new("trace");
    let path = dir.path().join("trace.jsonl");
    let pages = 4096;
    let mut cfg = RegionConfig::new(pages * PAGE_SIZE, 1 << 20);
    cfg.stats_trace = Some(path.clone());
    let region = Region::new(cfg).unwrap();
    let base = Base(region.as_ptr() as usize);
    for pass in 1..=3 {
        for p in 0..pages {
            base.write(p, pass);
        }
        std::thread::sleep(std::time::Duration::from_millis(150));
    }
    drop(region);
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("every trace line is JSON"))
        .collect();
    assert!(lines.len() >= 3, "only {} trace lines", lines.len());
    let t: Vec<u64> = lines.iter().map(|l| l["t_ms"].as_u64().unwrap()).collect();
    assert!(
        t.windows(2).all(|w| w[0] <= w[1]),
        "time goes forward: {t:?}"
    );
    let last = lines.last().unwrap();
    assert_eq!(
        last["zero_fill"].as_u64().unwrap() + last["zero_filled_ahead"].as_u64().unwrap(),
        pages as u64
    );
    assert!(last["evicted"].as_u64().unwrap() > 0);
    assert!(last["remote_faults"].as_u64().unwrap() > 0);
    assert!(last["low_watermark_pages"].as_u64().unwrap() > 0);
    let busy: Vec<u64> = lines
        .iter()
        .map(|l| {
            l["pool_busy_ns"]
                .as_u64()
                .expect("pool_busy_ns in every line")
        })
        .collect();
    assert!(
        busy.windows(2).all(|w| w[0] <= w[1]),
        "reclaim busy time only grows: {busy:?}"
    );
}

/// Sequential passes (which make every prefetcher fire), then the random workload, under a
/// prefetcher, an install mode and an eviction order: every page verified, and the chosen
/// machinery checked to have done its part.
fn integrity_under_policies(prefetch: &str, install: &str, evict: &str) {
    gleaner_bin();
    let mut cfg = RegionConfig::new(GIB / 8, GIB / 80);
    cfg.prefetch = prefetch.parse().unwrap();
    cfg.prefetch_install = install.parse().unwrap();
    cfg.evict = evict.parse().unwrap();
    let region = Region::new(cfg).unwrap();
    let pages = region.len() / PAGE_SIZE;
    let base = Base(region.as_ptr() as usize);
    for p in 0..pages {
        base.write(p, 1);
    }
    for _ in 0..2 {
        for p in 0..pages {
            if let Some((i, got, want)) = base.check(p, 1) {
                panic!("sequential pass: page {p} word {i}: got {got:#x}, want {want:#x}");
            }
        }
    }
    // Every page back to version 0 (zeros) for the random workload's shadow.
    region.discard(0, region.len());
    random_ops_then_verify_all(&region, 2, 20_000);
    let s = region.stats();
    assert_eq!(s.policy, evict);
    assert_eq!(s.prefetch.prefetcher, prefetch);
    if prefetch != "none" {
        assert!(s.prefetch.issued > 0, "{prefetch}: nothing prefetched");
        assert!(s.prefetch.used > 0, "{prefetch}: no prefetched page used");
        assert!(s.prefetch.accuracy > 0.0 && s.prefetch.accuracy <= 1.0);
        if install == "staged" {
            assert!(
                s.faults.prefetch_hit > 0,
                "staged pages are used through faults"
            );
            let (p50, p95) = (s.prefetch.timeliness_p50_us, s.prefetch.timeliness_p95_us);
            assert!(
                p50.is_some_and(|p| p > 0.0) && p95 >= p50,
                "timeliness {p50:?} {p95:?}"
            );
        }
    } else {
        assert_eq!(s.prefetch.issued, 0);
    }
}

#[test]
fn integrity_with_leap_marker_prefetch() {
    integrity_under_policies("leap", "marker", "fifo");
}

#[test]
fn integrity_with_leap_staged_prefetch() {
    integrity_under_policies("leap", "staged", "fifo");
}

#[test]
fn integrity_with_next_n_prefetch() {
    integrity_under_policies("next:8", "marker", "fifo");
}

#[test]
fn integrity_with_stride_prefetch() {
    integrity_under_policies("stride", "staged", "fifo");
}

#[test]
fn integrity_with_readahead_prefetch() {
    integrity_under_policies("readahead", "marker", "fifo");
}

#[test]
fn integrity_with_clock_eviction() {
    integrity_under_policies("none", "marker", "clock");
}

#[test]
fn integrity_with_rackmem_eviction_and_leap() {
    integrity_under_policies("leap", "marker", "rackmem");
}

#[test]
fn integrity_with_active_and_refault_eviction() {
    integrity_under_policies("leap", "marker", "active");
    integrity_under_policies("none", "marker", "refault");
}

#[test]
fn integrity_with_frequency_eviction() {
    integrity_under_policies("leap", "marker", "frequency");
}

#[test]
fn integrity_with_recency_eviction_and_its_probation() {
    integrity_under_policies("leap", "marker", "recency");
    integrity_under_policies("none", "marker", "recency:25%");
}

/// Staged prefetched pages that the program discards (munmap, MADV_DONTNEED) must read as zeros
/// afterwards, never as the staged copy, and rewritten pages must never come back stale.
#[test]
fn discarded_pages_never_come_back_from_the_staging_buffer() {
    gleaner_bin();
    let mut cfg = RegionConfig::new(4096 * PAGE_SIZE, 1 << 20);
    cfg.prefetch = "next:32".parse().unwrap();
    cfg.prefetch_install = "staged".parse().unwrap();
    let region = Region::new(cfg).unwrap();
    let pages = region.len() / PAGE_SIZE;
    let base = Base(region.as_ptr() as usize);
    for p in 0..pages {
        base.write(p, 1);
    }
    for round in 0..4 {
        // A sequential read stages pages ahead; discard a range in the middle of the stream.
        for p in 0..pages / 2 {
            assert!(base.check(p, if round == 0 { 1 } else { 2 }).is_none());
        }
        let s = region.stats();
        assert!(
            s.prefetch.staged_now > 0 || round > 0,
            "nothing staged to race with"
        );
        region.discard((pages / 2) * PAGE_SIZE, (pages / 4) * PAGE_SIZE);
        for p in pages / 2..pages * 3 / 4 {
            if let Some((i, got, _)) = base.check(p, 0) {
                panic!("round {round}: discarded page {p} word {i} reads {got:#x}, not zero");
            }
            base.write(p, 2);
        }
        for p in 0..pages / 2 {
            base.write(p, 2);
        }
        for p in 0..pages * 3 / 4 {
            assert!(base.check(p, 2).is_none(), "round {round}: page {p}");
        }
        for p in pages * 3 / 4..pages {
            assert!(base.check(p, 1).is_none(), "round {round}: page {p}");
        }
    }
    let s = region.stats();
    assert!(
        s.prefetch.wasted > 0,
        "discarded staged pages count as wasted"
    );
    assert!(s.resident_pages <= s.budget_pages);
}

/// `RegionConfig::trace` records every fault the handlers see, readable by `gleaner trace`.
#[test]
fn fault_trace_records_every_fault() {
    gleaner_bin();
    let dir = common::TempDir::new("ftrace");
    let path = dir.path().join("faults.trace");
    let pages = 2048;
    let stats_path = dir.path().join("stats.json");
    let mut cfg = RegionConfig::new(pages * PAGE_SIZE, 1 << 20);
    // Every page comes back by its own fault, so each is a trace record.
    cfg.prefetch = "none".parse().unwrap();
    cfg.trace = Some(path.clone());
    // The stats written at drop are complete: a handler counts a fault after waking its thread,
    // so a snapshot taken by the program itself can miss the last few.
    cfg.stats_path = Some(stats_path.clone());
    let region = Region::new(cfg).unwrap();
    let base = Base(region.as_ptr() as usize);
    for p in 0..pages {
        base.write(p, 1);
    }
    for p in 0..pages {
        assert!(base.check(p, 1).is_none());
    }
    drop(region);
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats_path).unwrap()).unwrap();
    let fault = |k: &str| s["faults"][k].as_u64().unwrap();
    let (header, records) = gleaner_policy::trace::read_file(&path).expect("the trace reads back");
    assert_eq!(header.page_size, PAGE_SIZE as u32);
    use gleaner_policy::trace::Kind;
    let count = |k: Kind| records.iter().filter(|r| r.kind == k).count() as u64;
    let missing = count(Kind::MissingRead) + count(Kind::MissingWrite);
    // Each handled missing-page fault message is one record: duplicates included, and a fault
    // left to an eviction batch that held its page (the thread faults again if the batch took
    // the page: a second message, a second record).
    assert!(
        missing >= fault("zero_fill") + fault("remote"),
        "{missing} records"
    );
    assert!(
        missing
            <= fault("zero_fill")
                + fault("remote")
                + fault("concurrent_duplicate")
                + fault("waited_on_eviction"),
        "{missing} records: {s}"
    );
    assert!(records.iter().all(|r| (r.page as usize) < pages));
    assert!(
        records
            .iter()
            .all(|r| r.tid != 0 || r.kind == Kind::Referenced),
        "faulting thread ids are recorded (the access scan's records have none)"
    );
    assert!(
        count(Kind::MissingWrite) + fault("zero_filled_ahead") >= pages as u64,
        "the first pass writes every page (each a fault, or filled ahead of one)"
    );
    assert!(
        count(Kind::MissingRead) > 0,
        "the second pass reads evicted pages"
    );
    assert!(
        count(Kind::Referenced) > 0,
        "the access scan's reports are recorded for the replay"
    );
}

/// Before `fork`, every page comes home, staged prefetched pages included (their staged copies
/// are forgotten, not left to go stale), and the data is intact afterwards.
#[test]
fn prepare_fork_brings_staged_pages_home_and_forgets_their_copies() {
    gleaner_bin();
    let mut cfg = RegionConfig::new(2048 * PAGE_SIZE, 1 << 20);
    cfg.prefetch = "next:32".parse().unwrap();
    cfg.prefetch_install = "staged".parse().unwrap();
    cfg.fork_visible = true;
    cfg.fork = gleaner_pager::ForkMode::Home;
    let region = Region::new(cfg).unwrap();
    let pages = region.len() / PAGE_SIZE;
    let base = Base(region.as_ptr() as usize);
    for p in 0..pages {
        base.write(p, 1);
    }
    for p in 0..pages / 2 {
        assert!(base.check(p, 1).is_none());
    }
    assert!(region.stats().prefetch.staged_now > 0, "nothing staged");
    region.prepare_fork();
    let s = region.stats();
    assert_eq!(s.remote_pages, 0, "every page is home before fork");
    assert_eq!(s.prefetch.staged_now, 0, "no staged copy survives");
    region.after_fork();
    for p in 0..pages {
        base.write(p, 2);
    }
    for p in 0..pages {
        assert!(base.check(p, 2).is_none(), "page {p}");
    }
}

/// Read-then-write passes over a region four times its budget: every page comes back from the
/// memnode each pass, is checked, then rewritten.
fn read_modify_write_passes(
    tracking: &str,
    predict: &str,
    passes: u32,
) -> gleaner_pager::RegionStats {
    read_modify_write_passes_keeping(tracking, predict, passes, "all")
}

/// [`read_modify_write_passes`] with `drop_far_copies` set to `drop`.
fn read_modify_write_passes_keeping(
    tracking: &str,
    predict: &str,
    passes: u32,
    drop: &str,
) -> gleaner_pager::RegionStats {
    gleaner_bin();
    let pages = 4096;
    let mut cfg = RegionConfig::new(pages * PAGE_SIZE, pages * PAGE_SIZE / 4);
    cfg.drop_far_copies = drop.parse().unwrap();
    cfg.predict_writes = predict.parse().unwrap();
    cfg.dirty_tracking = tracking.parse().unwrap();
    // Every page comes back by its own fault (no prefetching), so faults can be counted.
    cfg.prefetch = "none".parse().unwrap();
    let region = Region::new(cfg).unwrap();
    let base = Base(region.as_ptr() as usize);
    for p in 0..pages {
        base.write(p, 1);
    }
    for v in 1..=passes {
        for p in 0..pages {
            if let Some((i, got, want)) = base.check(p, v) {
                panic!(
                    "predict {predict}, pass {v}: page {p} word {i}: got {got:#x}, want {want:#x}"
                );
            }
            base.write(p, v + 1);
        }
    }
    for p in 0..pages {
        if let Some((i, got, want)) = base.check(p, passes + 1) {
            panic!(
                "predict {predict}, final check: page {p} word {i}: got {got:#x}, want {want:#x}"
            );
        }
    }
    region.stats()
}

/// Write prediction: a page rewritten after coming back from the memnode is installed writable
/// on its next `PREDICTED_RESIDENCIES` (3) fetches, then tracked once more (which re-arms it), so
/// in 5 read-modify-write passes only passes 1 and 5 take write-protect faults; with prediction
/// off every pass does, and the shadow predictor reports how often it would have been right.
/// First-touch writes arm nothing. Data verified both ways. (Synchronous tracking: the one that
/// has write-protect faults to save.)
#[test]
fn write_prediction_saves_the_write_protect_faults_of_rewritten_pages() {
    let on = read_modify_write_passes("sync", "on", 5);
    let off = read_modify_write_passes("sync", "off", 5);
    assert_eq!(on.dirty_tracking, "sync");
    assert!(on.faults.remote > 5 * 3000 && off.faults.remote > 5 * 3000);
    assert!(
        off.faults.write_protect > 5 * 3000,
        "off: every fetched page takes a write-protect fault ({})",
        off.faults.write_protect
    );
    assert!(
        on.faults.write_protect * 2 < off.faults.write_protect
            && on.faults.write_protect > off.faults.write_protect / 4,
        "on: {} write-protect faults (passes 1 and 5), off: {} (all 5 passes)",
        on.faults.write_protect,
        off.faults.write_protect
    );
    assert!(on.write_prediction.enabled && !off.write_prediction.enabled);
    assert!(on.write_prediction.predicted > 3 * 3000);
    assert_eq!(on.write_prediction.shadow_confirmed, 0);
    // Shadow predictions: passes 2-4 (confirmed by their writes) and the final read-only check
    // (not confirmed).
    let precision = off
        .write_prediction
        .shadow_precision
        .expect("off reports precision");
    assert!(
        (0.70..=0.80).contains(&precision),
        "shadow precision {precision}, expected about 3/4"
    );
}

/// Asynchronous tracking: the program's first write to a fetched page never reaches a handler
/// (no write-protect fault at all), yet every rewritten page is written back at eviction and its
/// new data kept: five read-modify-write passes verify every word, with far copies dropped at
/// fetch (the default: no victim has one, so none is scanned and all are written back) and kept
/// (each victim's run is scanned for writes). Eviction's scan is also write prediction's
/// evidence, so where it runs the predictor arms, in shadow: installing a page writable would
/// save no fault here.
#[test]
fn asynchronous_tracking_takes_no_write_faults_and_loses_no_write() {
    for (predict, drop) in [
        ("on", "all"),
        ("off", "all"),
        ("on", "none"),
        ("off", "none"),
    ] {
        let s = read_modify_write_passes_keeping("async", predict, 5, drop);
        let predict = format!("{predict}, drop {drop}");
        assert_eq!(s.dirty_tracking, "async");
        assert_eq!(s.faults.write_protect, 0, "predict {predict}");
        assert!(
            s.faults.remote > 5 * 3000,
            "predict {predict}: {:?}",
            s.faults
        );
        assert!(
            s.evictions.dirty > 5 * 3000,
            "predict {predict}: rewritten pages are written back ({:?})",
            s.evictions
        );
        assert!(!s.write_prediction.enabled, "{:?}", s.write_prediction);
        if drop == "all" {
            // Only a fault handler reclaiming directly (the last resort) scans, and it scans
            // all its runs: at most about its share of the runs (twice it, for the slack of
            // runs of unequal length). How often handlers must reclaim directly depends on how
            // much CPU the reclaim thread gets (beside the suite's other tests: 10% of the runs
            // or more); a pool that scanned would scan nearly all.
            let evicted = s.evictions.dirty + s.evictions.clean;
            let direct_runs = s.reclaim.direct_pages * s.evictions.runs / evicted.max(1);
            assert!(
                s.evictions.scanned_runs <= 2 * direct_runs + 5,
                "predict {predict}: {} pages reclaimed directly, {:?}",
                s.reclaim.direct_pages,
                s.evictions
            );
        } else {
            assert!(s.evictions.scanned_runs > 0, "predict {predict}");
            assert!(
                s.write_prediction.predicted > 2 * 3000,
                "predict {predict}: {:?}",
                s.write_prediction
            );
        }
    }
}

/// A page rewritten once and then only read stops being predicted after
/// `PREDICTED_RESIDENCIES` fetches, so it stops costing write-backs; the first fill of a page
/// arms no prediction.
#[test]
fn write_prediction_expires_for_pages_no_longer_written() {
    gleaner_bin();
    let pages = 4096;
    let mut cfg = RegionConfig::new(pages * PAGE_SIZE, pages * PAGE_SIZE / 4);
    // Every page comes back by its own fault, so fetches can be counted.
    cfg.prefetch = "none".parse().unwrap();
    let region = Region::new(cfg).unwrap();
    let base = Base(region.as_ptr() as usize);
    for p in 0..pages {
        base.write(p, 1);
    }
    for p in 0..pages {
        if let Some((i, got, want)) = base.check(p, 1) {
            panic!("page {p} word {i}: got {got:#x}, want {want:#x}");
        }
    }
    assert_eq!(
        region.stats().write_prediction.predicted,
        0,
        "filling a page arms no prediction"
    );
    for p in 0..pages {
        base.write(p, 2);
    }
    let read_passes = gleaner_pager::PREDICTED_RESIDENCIES as usize + 3;
    for _ in 0..read_passes {
        for p in 0..pages {
            if let Some((i, got, want)) = base.check(p, 2) {
                panic!("page {p} word {i}: got {got:#x}, want {want:#x}");
            }
        }
    }
    let s = region.stats();
    let most = (pages * gleaner_pager::PREDICTED_RESIDENCIES as usize) as u64;
    assert!(
        s.write_prediction.predicted <= most && s.write_prediction.predicted > most * 8 / 10,
        "predicted {} read fetches; at most {most} expected",
        s.write_prediction.predicted
    );
    assert!(s.faults.remote as usize > pages * read_passes);
}

/// A program that changes the protection of part of its memory splits the kernel's mapping in
/// two; a sequential fill running across the split (zero-filled ahead in runs) must still be
/// served page by page, and every page keep its data.
#[test]
fn sequential_fill_across_a_protection_split_is_served() {
    gleaner_bin();
    let pages = 1024;
    let region = Region::new(RegionConfig::new(pages * PAGE_SIZE, 1 << 20)).unwrap();
    let base = Base(region.as_ptr() as usize);
    // Pages 100..110 become read-write-execute: a separate mapping (VMA), still registered.
    // SAFETY: the range lies inside the live region; the protection keeps it readable and
    // writable.
    let rc = unsafe {
        libc::mprotect(
            base.page(100) as *mut libc::c_void,
            10 * PAGE_SIZE,
            libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
        )
    };
    assert_eq!(rc, 0, "mprotect: {}", std::io::Error::last_os_error());
    for p in 0..pages {
        base.write(p, 1);
    }
    for p in 0..pages {
        assert_eq!(base.check(p, 1), None, "page {p}");
    }
    let s = region.stats();
    assert!(
        s.faults.zero_filled_ahead > 0,
        "the fill should have been served in runs: {:?}",
        s.faults
    );
}

/// `Region::reuse`, the heap taking a freed big block back for a new one: the pages still
/// resident stay as they were (the new block's first touches take no fault), the pages held only
/// far are discarded (they read as zeros and are never fetched: their contents were free), and
/// the counters say how many of each. (The region holds data in every page: a reused block's
/// contents do not matter to the heap, but here they tell which pages were fetched.)
#[test]
fn reuse_keeps_resident_pages_and_discards_far_ones_without_fetching_them() {
    gleaner_bin();
    let mut cfg = RegionConfig::new(1024 * PAGE_SIZE, 256 * PAGE_SIZE);
    cfg.prefetch = "none".parse().unwrap();
    let region = Region::new(cfg).unwrap();
    let pages = region.len() / PAGE_SIZE;
    let base = Base(region.as_ptr() as usize);
    for p in 0..pages {
        base.write(p, 1);
    }
    // Let reclaim finish: no page may be on its way out while it is reused.
    let mut last = u64::MAX;
    while region.stats().remote_pages != last {
        last = region.stats().remote_pages;
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let before = region.stats();
    assert!(before.remote_pages > (pages / 2) as u64, "{before:?}");
    region.reuse(0, region.len());
    let after = region.stats();
    assert_eq!(after.reused_pages, pages as u64);
    assert_eq!(after.reused_far_pages, before.remote_pages);
    assert_eq!(after.remote_pages, 0);
    let (mut kept, mut zeros) = (0, 0);
    for p in 0..pages {
        if base.check(p, 1).is_none() {
            kept += 1;
        } else if base.check(p, 0).is_none() {
            zeros += 1;
        } else {
            panic!("reused page {p} is neither as it was nor zeros");
        }
    }
    // A far page fetched would read as it was: every one reads as zeros instead. (The reads
    // evict resident pages again, which come back as they were: they count as kept.)
    assert_eq!(zeros as u64, before.remote_pages);
    assert_eq!(kept as u64, pages as u64 - before.remote_pages);
}

/// Handlers wait for fault messages inside `read` on a blocking userfaultfd (this kernel lets
/// a read be told not to block, which the pager needs beside it), and dropping the region
/// stops every one through its doorbell, one touch per handler. A handler the doorbell missed
/// would hang the drop, which fails the test.
#[test]
fn handlers_blocked_in_read_serve_every_fault_and_all_stop_when_the_region_goes() {
    handlers_serve_every_fault_and_all_stop(false, "read");
}

/// The fallback where a kernel's userfaultfd cannot be told not to block for one read:
/// handlers wait in `poll`, then read, and stop on the stop flag. This kernel offers the
/// blocking path, so the fallback is forced (`handlers_poll`) to keep it tested.
#[test]
fn handlers_waiting_in_poll_serve_every_fault_and_all_stop_when_the_region_goes() {
    handlers_serve_every_fault_and_all_stop(true, "poll");
}

/// With one handler, with more handlers than CPUs, and with the default (one per CPU): every
/// page reads back what was written, the stats say the handlers waited `wait_in`, and dropping
/// the region returns (within a bound, else the test binary fails).
fn handlers_serve_every_fault_and_all_stop(poll: bool, wait_in: &'static str) {
    let done = fail_if_not_done_within(180, wait_in);
    gleaner_bin();
    for handlers in [1, 5, 0] {
        let mut cfg = RegionConfig::new(64 << 20, 8 << 20);
        cfg.handler_threads = handlers;
        cfg.handlers_poll = poll;
        let region = Region::new(cfg).unwrap();
        random_ops_then_verify_all(&region, 3, 20_000);
        let s = region.stats();
        assert_eq!(s.fault_breakdown.handlers_wait_in, wait_in);
        assert!(
            s.faults.remote > 1000 && s.fault_breakdown.handler_wakeups > 0,
            "{handlers} handlers: {} remote faults, {} wake-ups",
            s.faults.remote,
            s.fault_breakdown.handler_wakeups
        );
        drop(region);
    }
    done.send(()).unwrap();
}

/// Minor faults the calling thread has taken so far.
fn thread_minor_faults() -> i64 {
    // SAFETY: rusage is plain data (all zeroes is valid) and getrusage writes only into it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD of the calling thread into a live rusage.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) }, 0);
    u.ru_minflt
}

/// Under asynchronous tracking with far copies dropped at fetch (the defaults), a page fetched
/// for a read goes in writable: its far copy is gone, so it is written back at its next eviction
/// whatever it saw, and write protection would only cost the program a fault at its first write.
/// Where the far copy is kept (`--drop-far-copies none`), the page goes in protected, and a write
/// to it faults (the kernel resolves it): that case shows the count below can see the fault.
#[test]
fn a_page_fetched_for_a_read_is_writable_when_its_far_copy_is_dropped() {
    gleaner_bin();
    const PAGES: usize = 4096;
    const PROBED: usize = 32;
    for (copies, want_faults) in [("all", false), ("none", true)] {
        let mut cfg = RegionConfig::new(PAGES * PAGE_SIZE, PAGES * PAGE_SIZE / 4);
        cfg.drop_far_copies = copies.parse().unwrap();
        // Every probed page fetched on its own demand fault (a prefetched page is installed the
        // same way, but would make the count of fetches below depend on the prefetcher).
        cfg.prefetch = "none".parse().unwrap();
        let region = Region::new(cfg).unwrap();
        assert_eq!(region.stats().dirty_tracking, "async");
        let base = region.as_ptr() as usize;
        for p in 0..PAGES {
            // SAFETY: an aligned word of the region's memory, which lives as long as `region`.
            unsafe { ((base + p * PAGE_SIZE) as *mut u64).write_volatile(p as u64 + 1) };
        }
        let before = region.stats().faults.remote;
        for p in 0..PROBED {
            // SAFETY: as above.
            let v = unsafe { ((base + p * PAGE_SIZE) as *const u64).read_volatile() };
            assert_eq!(v, p as u64 + 1, "page {p} ({copies})");
        }
        let fetched = region.stats().faults.remote - before;
        assert!(
            fetched >= PROBED as u64 / 2,
            "the first pages written must have been evicted and fetched again ({copies}): \
             {fetched} remote faults"
        );
        let minor = thread_minor_faults();
        for p in 0..PROBED {
            // SAFETY: as above.
            unsafe { ((base + p * PAGE_SIZE + 8) as *mut u64).write_volatile(7) };
        }
        let write_faults = thread_minor_faults() - minor;
        if want_faults {
            assert!(
                write_faults >= fetched as i64 / 2,
                "far copies kept: the fetched pages must be protected ({write_faults} faults \
                 for {fetched} fetched pages)"
            );
        } else {
            assert!(
                write_faults <= 2,
                "far copies dropped: writing {PROBED} pages just read back took {write_faults} \
                 faults"
            );
        }
        for p in 0..PAGES {
            // SAFETY: as above.
            let v = unsafe { ((base + p * PAGE_SIZE) as *const u64).read_volatile() };
            assert_eq!(v, p as u64 + 1, "page {p} ({copies}) after the writes");
        }
    }
}

/// Pins the calling thread to `cpu`.
fn pin_this_thread(cpu: usize) {
    gleaner_sys::affinity::pin_to(cpu)
        .unwrap_or_else(|e| panic!("pinning the test thread to CPU {cpu}: {e}"));
}

/// A remote fault's service time in the stats ends when its page is mapped, not when its handler
/// next runs. The program and its only handler share one CPU here, so the woken thread may run
/// at once in the handler's place; it then computes for 2 ms after each far read. Timed the way
/// it was until 2026-11-28, each install that the woken thread preempted counted that run.
#[test]
fn a_remote_faults_service_time_excludes_the_woken_programs_run() {
    gleaner_bin();
    pin_this_thread(0);
    const PAGES: usize = 4096;
    let mut cfg = RegionConfig::new(PAGES * PAGE_SIZE, PAGES * PAGE_SIZE / 8);
    cfg.prefetch = "none".parse().unwrap();
    let region = Region::new(cfg).unwrap();
    let base = region.as_ptr() as usize;
    for p in 0..PAGES {
        // SAFETY: an aligned word of the region's memory, which lives as long as `region`.
        unsafe { ((base + p * PAGE_SIZE) as *mut u64).write_volatile(p as u64 + 1) };
    }
    let before = region.stats();
    let mut rng = Rng::from_state(0x1234_5678);
    // Enough reads that the p99 of the one in 8 that are timed (about 190 of 1500 remote
    // faults) is not one stray sample.
    for _ in 0..1500 {
        let p = rng.next_u64() as usize % (PAGES / 2);
        // SAFETY: as above.
        let v = unsafe { ((base + p * PAGE_SIZE) as *const u64).read_volatile() };
        assert_eq!(v, p as u64 + 1, "page {p}");
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_micros(2000) {
            std::hint::spin_loop();
        }
    }
    let s = region.stats();
    let remote = s.faults.remote - before.faults.remote;
    assert!(
        remote >= 750,
        "the reads must fault remotely: {remote} remote faults"
    );
    let lat = &s.remote_fault_latency;
    let b = &s.fault_breakdown;
    eprintln!("{remote} remote faults; service time {lat:?}; {b:?}");
    // One remote fault in 8 is timed, its steps and its install alike (the fill before the
    // reads only zero-filled: every remote fault is one of the reads).
    let all_remote = s.faults.remote;
    assert_eq!(b.timed_faults, b.timed_installs, "{b:?}");
    assert!(
        (remote / 16..=all_remote / 8 + 1).contains(&b.timed_faults),
        "one remote fault in 8 is timed: {} of {all_remote}",
        b.timed_faults
    );
    // Timed after a waking install, the faults whose handler the woken thread preempted
    // (a few percent of them here) took the program's whole run and more: with a 300 µs run
    // the p99 was 310 µs. A correct service time is about 5 µs at p50, but this VM stalls some
    // installs for 100-900 µs, more of them the longer a run lasts (most likely the kernel's
    // copy into a fresh page the host must back again: the guest reports free memory to its
    // host; `bench/results/install-stalls/`), which put the p99 at 170-380 µs on a bad
    // afternoon: the run is 2 ms so that the bound can sit between the two.
    assert!(
        lat.p99_us < 1000.0,
        "a remote fault's service time counted the program's 2 ms run after its wake: \
         p99 {} µs ({lat:?})",
        lat.p99_us
    );
}
