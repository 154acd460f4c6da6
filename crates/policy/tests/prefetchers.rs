//! Prefetchers end to end in the simulator, and the basic behaviour of each one.

use gleaner_policy::evict::{EvictKind, Fifo, Lru, Visibility};
use gleaner_policy::prefetch::{
    Fault, Leap, LeapConfig, NextN, Prefetcher, PrefetcherKind, Readahead, Stride, RECENT_FAULTS,
};
use gleaner_policy::sim::{self, simulate, SimConfig, SimResult};
use gleaner_policy::trace::synth::{generate, Pattern, SynthConfig};
use gleaner_policy::trace::Record;

fn run(records: &[Record], p: &mut dyn Prefetcher, capacity: usize) -> SimResult {
    simulate(records, p, &mut Lru::new(), &SimConfig::new(capacity))
}

fn trace(pattern: &str, pages: u64, accesses: u64) -> Vec<Record> {
    generate(&SynthConfig::new(pattern.parse().unwrap(), pages, accesses))
}

fn fault(page: u64, prefetch_hit: bool) -> Fault {
    Fault {
        page,
        tid: 1,
        prefetch_hit,
    }
}

#[test]
fn leap_sequential_and_stride_at_half_capacity() {
    for pattern in ["seq", "stride:10"] {
        let t = trace(pattern, 4_000, 100_000);
        for policy in [EvictKind::Lru, EvictKind::Fifo] {
            let mut e = policy.build(2_000, Visibility::Fault, None).unwrap();
            let r = simulate(
                &t,
                &mut Leap::new(LeapConfig::default()),
                e.as_mut(),
                &SimConfig::new(2_000),
            );
            assert!(r.accuracy >= 0.9, "{pattern} {policy}: {r:?}");
            assert!(r.coverage >= 0.9, "{pattern} {policy}: {r:?}");
            // Without prefetching, a loop twice the cache misses on every reference.
            assert!(r.misses < t.len() as u64 / 100, "{pattern} {policy}: {r:?}");
        }
    }
}

#[test]
fn leap_backs_off_on_random() {
    let t = trace("random", 4_000, 100_000);
    let r = run(&t, &mut Leap::new(LeapConfig::default()), 2_000);
    let faults = r.misses + r.prefetch_hits;
    assert!(
        r.prefetch_issued * 100 <= faults,
        "issued {} for {faults} faults",
        r.prefetch_issued
    );
    // next:8 on the same trace issues on every fault.
    let n = run(&t, &mut NextN::new(8), 2_000);
    assert!(
        n.prefetch_issued > 2 * (n.misses + n.prefetch_hits),
        "{n:?}"
    );
}

/// A trend found once (the program filled its memory in order) must not keep the window open
/// once accesses turn random. In the pager's marker mode, a staged marker's first use reports
/// its whole batch used; at half capacity a random access hits a page of an old batch about
/// half the time. Counted, those chance hits kept `C_hit` above 0 and the walk along the old
/// trend going for good (redis after loading its keys: 200k prefetches for 295k faults).
#[test]
fn leap_forgets_a_trend_that_chance_hits_on_old_batches_would_keep_alive() {
    let mut leap = Leap::new(LeapConfig::default());
    let mut out = Vec::new();
    let mut issued = Vec::new();
    // A sequential fill: every issued page is used in turn.
    for p in 0..400u64 {
        out.clear();
        let hit = issued.contains(&p);
        leap.on_fault(fault(p, hit), &mut out);
        issued.extend_from_slice(&out);
    }
    assert!(
        issued.len() > 300,
        "the fill is prefetched: {}",
        issued.len()
    );
    // Random accesses far away; every other one is a chance hit on a page of an old batch,
    // reported as a staged marker's use with the seven pages installed beside it.
    let mut random = gleaner_sys::rng::XorShift64::from_state(0x9e37_79b9_7f4a_7c15);
    let mut later = 0;
    for i in 0..6_000u64 {
        let rng = random.next_u64();
        out.clear();
        if i % 2 == 0 {
            let old = issued[(rng % 300) as usize];
            for w in 1..8 {
                leap.on_prefetch_hit(old + w, 1);
            }
            leap.on_fault(fault(old, true), &mut out);
        } else {
            leap.on_fault(fault(1_000_000 + rng % 1_000_000, false), &mut out);
        }
        // Hits soon after a batch was issued are still taken as the stream's (RECENT_FAULTS).
        if i >= 2 * RECENT_FAULTS {
            later += out.len();
        }
    }
    assert!(
        later <= 16,
        "{later} pages prefetched along a trend gone, in the last {} random faults",
        6_000 - 2 * RECENT_FAULTS
    );
}

#[test]
fn leap_follows_interleaved_threads_per_thread_but_not_with_one_stream() {
    let t = trace("interleave:1,10", 4_000, 100_000);
    let per_thread = run(&t, &mut Leap::new(LeapConfig::default()), 2_000);
    assert!(per_thread.coverage >= 0.9, "{per_thread:?}");
    assert!(per_thread.accuracy >= 0.9, "{per_thread:?}");
    let one = run(
        &t,
        &mut Leap::new(LeapConfig {
            per_thread: false,
            ..LeapConfig::default()
        }),
        2_000,
    );
    // Perfectly interleaved strides have no majority in one history (Leap's FINDTREND).
    assert!(one.coverage < 0.5, "{one:?}");
}

#[test]
fn leap_window_grows_with_hits_up_to_pw_max() {
    let mut leap = Leap::new(LeapConfig::default());
    let mut out = Vec::new();
    for p in 0..9 {
        out.clear();
        leap.on_fault(fault(p, false), &mut out);
    }
    // Trend +1 found at the 9th fault; no hits yet: one page.
    assert_eq!(out, vec![9]);
    // Consume what is issued, faulting on each prefetched page in turn.
    let mut max_window = 0;
    for next in 9..49u64 {
        out.clear();
        leap.on_fault(fault(next, true), &mut out);
        max_window = max_window.max(leap.window(1));
        assert!(out.iter().all(|&c| c > next && c <= next + 16), "{out:?}");
    }
    assert_eq!(max_window, 8, "window reaches PW_max");
    // A custom cap is honoured.
    let mut small = Leap::new(LeapConfig {
        pw_max: 2,
        ..LeapConfig::default()
    });
    for p in 0..9 {
        small.on_fault(fault(p, false), &mut out);
    }
    for p in 9..40 {
        small.on_fault(fault(p, true), &mut out);
        assert!(small.window(1) <= 2);
    }
}

#[test]
fn next_n_prefetches_the_following_pages() {
    let mut n = NextN::new(3);
    let mut out = Vec::new();
    n.on_fault(fault(10, false), &mut out);
    assert_eq!(out, vec![11, 12, 13]);
    out.clear();
    n.on_fault(fault(u64::MAX - 1, false), &mut out);
    assert_eq!(out, vec![u64::MAX]);
    let t = trace("seq", 1_000, 20_000);
    let r = run(&t, &mut NextN::new(8), 500);
    assert!(r.coverage > 0.99 && r.accuracy > 0.99, "{r:?}");
}

#[test]
fn readahead_grows_forward_backward_and_stays_off_when_random() {
    let mut ra = Readahead::new();
    let mut out = Vec::new();
    ra.on_fault(fault(100, false), &mut out);
    assert!(out.is_empty(), "first fault: no history, window 1");
    ra.on_fault(fault(101, false), &mut out);
    assert_eq!(out, vec![102], "adjacent: window 2 = [f, f+1]");
    assert_eq!(ra.window(), 2);
    out.clear();
    ra.on_fault(fault(102, true), &mut out);
    assert!(out.is_empty(), "a hit only counts");
    ra.on_fault(fault(103, false), &mut out);
    assert_eq!(out, vec![104, 105, 106], "1 hit: 3 -> 4 pages");
    out.clear();
    for p in 104..107 {
        ra.on_fault(fault(p, true), &mut out);
    }
    ra.on_fault(fault(107, false), &mut out);
    assert_eq!(out, (108..115).collect::<Vec<_>>(), "3 hits: 8 pages");
    // Backwards.
    let mut back = Readahead::new();
    out.clear();
    back.on_fault(fault(50, false), &mut out);
    back.on_fault(fault(49, false), &mut out);
    assert_eq!(out, vec![48], "[f-1, f]");
    // Not adjacent and no hits: nothing; a centred window after hits.
    let mut c = Readahead::new();
    out.clear();
    c.on_fault(fault(10, false), &mut out);
    c.on_fault(fault(30, false), &mut out);
    assert!(out.is_empty());
    c.on_fault(fault(31, true), &mut out);
    c.on_fault(fault(60, false), &mut out);
    assert_eq!(out, vec![59, 61, 62], "centred 4: [f-1, f+2]");
    // Clipped to the 512-page block and to region bounds.
    let mut clip = Readahead::new().with_bounds(0, 1_000);
    out.clear();
    for p in 505..512 {
        clip.on_fault(fault(p, false), &mut out);
    }
    assert!(out.iter().all(|&p| p < 512), "{out:?}");
    // Random faults: almost nothing.
    let t = trace("random", 100_000, 20_000);
    let r = run(&t, &mut Readahead::new(), 5_000);
    assert!(r.prefetch_issued < r.misses / 10, "{r:?}");
    // Stride-10 defeats it entirely (Leap §2.1: 0% hits).
    let t = trace("stride:10", 4_000, 40_000);
    assert_eq!(run(&t, &mut Readahead::new(), 2_000).prefetch_issued, 0);
}

#[test]
fn stride_detects_constant_strides_only() {
    let mut s = Stride::new(8);
    let mut out = Vec::new();
    s.on_fault(fault(0, false), &mut out);
    s.on_fault(fault(10, false), &mut out);
    assert!(out.is_empty(), "one delta is not a stride");
    s.on_fault(fault(20, false), &mut out);
    assert!(!out.is_empty());
    assert!(
        out.iter()
            .enumerate()
            .all(|(i, &c)| c == 30 + 10 * i as u64),
        "{out:?}"
    );
    out.clear();
    s.on_fault(fault(27, false), &mut out);
    assert!(out.is_empty(), "the stride broke");
    // Negative strides.
    let mut n = Stride::new(4);
    for p in [100, 97, 94] {
        out.clear();
        n.on_fault(fault(p, false), &mut out);
    }
    assert_eq!(out.first(), Some(&91));
    assert!(out.iter().all(|&c| c < 94 && (94 - c) % 3 == 0));
    // End to end on stride-10.
    let t = trace("stride:10", 4_000, 100_000);
    let r = run(&t, &mut Stride::new(8), 2_000);
    assert!(r.coverage > 0.95 && r.accuracy > 0.95, "{r:?}");
}

#[test]
fn timeliness_counts_late_prefetches() {
    let t = trace("seq", 1_000, 10_000); // 1 µs between accesses
    let late = simulate(
        &t,
        &mut NextN::new(4),
        &mut Fifo::new(),
        &SimConfig {
            capacity: 500,
            latency_ns: 100_000,
        },
    );
    assert_eq!(
        late.prefetch_late, late.prefetch_hits,
        "used within 4 µs < 100 µs"
    );
    let on_time = simulate(
        &t,
        &mut NextN::new(4),
        &mut Fifo::new(),
        &SimConfig {
            capacity: 500,
            latency_ns: 1_000,
        },
    );
    // next:4 on every fault keeps 4 pages ahead: each is used 4 µs after its prefetch.
    assert_eq!(on_time.prefetch_late, 0, "{on_time:?}");
    assert_eq!(on_time.timeliness_p50_ns, Some(4_000));
    assert!(on_time.prefetch_hits > 9_000);
}

#[test]
fn every_prefetcher_runs_in_the_matrix() {
    let t = trace("zipf", 2_000, 20_000);
    let combos = sim::combos(
        &PrefetcherKind::all(),
        &[EvictKind::Lru],
        &[Visibility::Fault],
    );
    let rows = sim::run_all(&t, &SimConfig::new(500), &combos, 4);
    assert_eq!(rows.len(), 5);
    for r in &rows {
        assert_eq!(r.hits + r.misses + r.prefetch_hits + r.minor_faults, 20_000);
        assert!(r.prefetch_hits <= r.prefetch_issued);
        assert!(
            r.prefetch_wasted + r.prefetch_hits + r.prefetch_unused_at_end == r.prefetch_issued
        );
    }
    let _ = Pattern::Seq;
}

/// Threads sharing one scan: a page thread A's stream prefetched, first used by thread B, is
/// evidence for A's stream (its window grows), not lost because B's stream never issued it.
#[test]
fn leap_credits_a_hit_to_the_thread_whose_batch_it_was() {
    let mut leap = Leap::new(LeapConfig::default());
    let mut out = Vec::new();
    let at = |page, tid, prefetch_hit| Fault {
        page,
        tid,
        prefetch_hit,
    };
    for p in 0..9 {
        out.clear();
        leap.on_fault(at(p, 1, false), &mut out);
    }
    assert_eq!(
        out,
        vec![9],
        "thread 1 found its trend and prefetched one page"
    );
    out.clear();
    leap.on_fault(at(9, 2, true), &mut out);
    out.clear();
    leap.on_fault(at(10, 1, false), &mut out);
    assert_eq!(
        leap.window(1),
        2,
        "thread 2's hit on page 9 counted for thread 1"
    );
    // A hit on a page nobody prefetched recently counts for no one.
    let mut other = Leap::new(LeapConfig::default());
    for p in 0..9 {
        other.on_fault(at(p, 1, false), &mut out);
    }
    other.on_fault(at(500, 2, true), &mut out);
    other.on_fault(at(9, 1, false), &mut out);
    assert_eq!(other.window(1), 1, "no hit counted: on trend, one page");
}
