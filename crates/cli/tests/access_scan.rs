//! The access scan (`gleaner_pager`'s `access.rs`) on real regions: real userfaultfd, the
//! kernel's written bits read with `PAGEMAP_SCAN`, a real memnode process.

mod common;

use common::gleaner_bin;
use gleaner_pager::{AccessScanSetting, Region, RegionConfig, PAGE_SIZE};

const MIB: usize = 1 << 20;

fn write(region: &Region, page: usize, value: u64) {
    // SAFETY: word 0 of `page` lies inside the live region and is 8-byte aligned.
    unsafe {
        (region.as_ptr().add(page * PAGE_SIZE) as *mut u64).write_volatile(value);
    }
}

fn read(region: &Region, page: usize) -> u64 {
    // SAFETY: as in `write`.
    unsafe { (region.as_ptr().add(page * PAGE_SIZE) as *const u64).read_volatile() }
}

#[test]
fn a_page_written_between_two_scans_is_seen_and_one_only_read_or_untouched_is_not() {
    gleaner_bin();
    // Room for every page: nothing is evicted, so no reclaim thread scans meanwhile.
    let region = Region::new(RegionConfig::new(16 * MIB, 16 * MIB)).unwrap();
    let pages = 1000;
    for p in 0..pages {
        write(&region, p, p as u64);
    }
    // The first scan reports what was written since the pages arrived, and protects them again.
    let first = region
        .scan_accesses_now()
        .expect("the scan is on by default");
    assert!(
        (0..pages).all(|p| first.binary_search(&p).is_ok()),
        "every page written since it arrived must be reported: {} of {pages}",
        first.len()
    );
    // Written: p % 3 == 0; read only: p % 3 == 1; untouched: p % 3 == 2.
    let mut sum = 0;
    for p in 0..pages {
        match p % 3 {
            0 => write(&region, p, p as u64 + 1),
            1 => sum += read(&region, p),
            _ => {}
        }
    }
    assert!(sum > 0);
    let second = region.scan_accesses_now().unwrap();
    let written: Vec<usize> = (0..pages).filter(|p| p % 3 == 0).collect();
    assert_eq!(
        second, written,
        "exactly the pages written between the scans"
    );
    // Nothing written since: nothing reported, and every value is intact.
    assert_eq!(region.scan_accesses_now().unwrap(), Vec::<usize>::new());
    for p in 0..pages {
        let want = if p % 3 == 0 { p as u64 + 1 } else { p as u64 };
        assert_eq!(read(&region, p), want, "page {p}");
    }
    let s = region.stats();
    assert_eq!(s.access.signals, vec!["written-bits"]);
    assert!(s.access.scans >= 3, "{:?}", s.access);
    assert!(s.access.pages_referenced >= (pages + written.len()) as u64);
}

/// Hot pages written every round, a stream of `stream_per_round` pages written once passing
/// through a budget of 1024 pages: the far faults on the hot pages after the first rounds, with the
/// access scan as `setting` says (`Off`, or `Auto` with a scan after each round's hot writes)
/// and the eviction order `evict`.
fn hot_faults_under_a_streaming_antagonist(
    setting: AccessScanSetting,
    evict: &str,
    stream_per_round: usize,
) -> (u64, Region) {
    let budget_pages = 1024;
    let mut cfg = RegionConfig::new(256 * MIB, budget_pages * PAGE_SIZE);
    cfg.access_scan = setting;
    cfg.evict = evict.parse().unwrap();
    cfg.prefetch = "none".parse().unwrap();
    let region = Region::new(cfg).unwrap();
    let hot = 128;
    let mut next_cold = hot;
    let mut hot_faults = 0;
    for round in 0..60 {
        let before = region.stats().faults.remote;
        for p in 0..hot {
            write(&region, p, round);
        }
        if round >= 10 {
            hot_faults += region.stats().faults.remote - before;
        }
        if setting != AccessScanSetting::Off {
            region.scan_accesses_now().unwrap();
        }
        for _ in 0..stream_per_round {
            write(&region, next_cold, 7);
            next_cold += 1;
        }
    }
    for p in 0..hot {
        assert_eq!(read(&region, p), 59, "hot page {p}");
    }
    for p in hot..next_cold {
        assert_eq!(read(&region, p), 7, "cold page {p}");
    }
    (hot_faults, region)
}

#[test]
fn a_hot_set_stays_resident_under_a_streaming_antagonist() {
    gleaner_bin();
    hot_set_stays_resident_under_a_streaming_antagonist("recency", 256, "recency", 10);
}

#[test]
fn the_active_order_keeps_a_hot_set_resident_under_a_streaming_antagonist() {
    gleaner_bin();
    // Each stream page is reported written once (its first write), the hot pages at every
    // scan: the look-twice rule must tell them apart. The stream per round stays under the
    // inactive list's length (the budget less the reclaim headroom and the active hot pages),
    // so that a hot page is looked at once per round, after the scan that saw it: a page
    // looked at twice between two scans has no fresh bit to show (see `active.rs`). Without
    // the scan `active` keeps the hot pages too, by refault activation while the budget first
    // fills: the blind order to compare with is FIFO.
    hot_set_stays_resident_under_a_streaming_antagonist("active", 400, "fifo", 4);
}

#[test]
fn the_frequency_order_keeps_a_hot_set_resident_under_a_streaming_antagonist() {
    gleaner_bin();
    // The hot pages are counted at every scan and climb a level; each stream page is reported
    // once, its fault's own write, and leaves from the lowest. As for `active`, the blind
    // order to compare with is FIFO (without the scan `frequency` still sees refaults).
    hot_set_stays_resident_under_a_streaming_antagonist("frequency", 400, "fifo", 4);
}

/// With the scan, `evict` keeps the hot pages resident (`margin` times fewer hot faults than
/// `blind`); without it, `blind` (an order blind to accesses then) lets them keep leaving.
fn hot_set_stays_resident_under_a_streaming_antagonist(
    evict: &str,
    stream_per_round: usize,
    blind: &str,
    margin: u64,
) {
    let (with_scan, region) =
        hot_faults_under_a_streaming_antagonist(AccessScanSetting::Auto, evict, stream_per_round);
    let s = region.stats();
    eprintln!("{}", region.stats_json());
    drop(region);
    let (without, region) =
        hot_faults_under_a_streaming_antagonist(AccessScanSetting::Off, blind, stream_per_round);
    eprintln!(
        "hot faults: {with_scan} under {evict} with the scan, {without} under {blind} without"
    );
    assert!(region.stats().access.signals.is_empty());
    assert!(
        s.evictions.clean + s.evictions.dirty > 10_000,
        "the stream must push pages out: {:?}",
        s.evictions
    );
    // 50 rounds of 128 hot pages: without the scan the stream pushes them out round after
    // round; with it they stay. A few may leave while a batch races a round's writes, and under
    // `active` a round's worth now and then: a page zero-filled ahead of the stream is installed
    // writable, so a scan can report it once for its install and once for its write, across its
    // first look; such stream pages are activated, and when enough of them fill the active list
    // its oldest pages, hot ones among them, go back to the inactive list (0 to 337 hot faults
    // in the runs here, against about 2,040 for FIFO): its margin is 4, recency's 10.
    assert!(
        without >= 1000,
        "{evict}: without the scan the hot pages must keep leaving ({without} faults): else \
         this test shows nothing"
    );
    assert!(
        with_scan * margin <= without,
        "{evict}: with the scan the hot pages must stay: {with_scan} faults against {without}"
    );
}

#[test]
fn without_written_bits_the_scan_is_off_says_why_and_integrity_holds() {
    gleaner_bin();
    for (tracking, setting, why) in [
        ("sync", AccessScanSetting::Auto, "synchronous"),
        ("async", AccessScanSetting::Off, "turned off"),
    ] {
        let mut cfg = RegionConfig::new(32 * MIB, 4 * MIB);
        cfg.dirty_tracking = tracking.parse().unwrap();
        cfg.access_scan = setting;
        let region = Region::new(cfg).unwrap();
        let err = region.scan_accesses_now().unwrap_err();
        assert!(err.contains(why), "{tracking}: {err}");
        let pages = region.len() / PAGE_SIZE;
        for round in 0..2u64 {
            for p in 0..pages {
                write(&region, p, p as u64 * 3 + round);
            }
        }
        for p in 0..pages {
            assert_eq!(read(&region, p), p as u64 * 3 + 1, "{tracking}: page {p}");
        }
        let s = region.stats();
        assert!(s.faults.remote > 0, "{tracking}: nothing came back");
        assert!(s.access.signals.is_empty(), "{tracking}: {:?}", s.access);
        assert_eq!(s.access.scans, 0, "{tracking}");
        let said = &s.access.unavailable["written-bits"];
        assert!(said.contains(why), "{tracking}: {said}");
        // The other signals are listed with why they are not used, present or not.
        assert!(s.access.unavailable.contains_key("damon"));
        assert!(s.access.unavailable.contains_key("idle-page"));
    }
}

#[test]
fn a_fault_trace_records_what_each_scan_saw_for_the_replay() {
    use gleaner_policy::trace::{read_file, Kind};
    gleaner_bin();
    let dir = tempfile_dir();
    let path = dir.join("trace.bin");
    let mut cfg = RegionConfig::new(16 * MIB, 16 * MIB);
    cfg.trace = Some(path.clone());
    let region = Region::new(cfg).unwrap();
    for p in 0..64 {
        write(&region, p, 1);
    }
    let first = region.scan_accesses_now().unwrap();
    for p in (0..64).step_by(4) {
        write(&region, p, 2);
    }
    let seen = region.scan_accesses_now().unwrap();
    assert_eq!(seen, (0..64).step_by(4).collect::<Vec<usize>>());
    drop(region);
    let (_, records) = read_file(&path).unwrap();
    let referenced: Vec<u64> = records
        .iter()
        .filter(|r| r.kind == Kind::Referenced)
        .map(|r| r.page)
        .collect();
    // The first scan's pages (the 64 written and those filled ahead of them), then the
    // second's 16, in scan order.
    let scanned: Vec<u64> = first.iter().chain(&seen).map(|&p| p as u64).collect();
    assert!(first.len() >= 64);
    assert_eq!(referenced, scanned);
    // The faults are there too (first touches; some pages are filled ahead without one).
    assert!(records.iter().any(|r| r.kind != Kind::Referenced));
    std::fs::remove_dir_all(dir).ok();
}

/// A fresh private directory under the system's temporary directory.
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "gleaner-access-scan-test-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
